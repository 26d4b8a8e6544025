"""A training split kept on the devices: its processed examples once, its order as indices.

For datasets that fit in accelerator memory (MNIST, Fashion-MNIST, CIFAR, digits) the host
need not decode, process and transfer every batch: the processed split is read once, in split
order, and placed on the devices, and each compiled call gathers its batches there from small
index arrays (`training.step.gather_batch`). This module gives the host's two halves of that:

* `processed_split`: every example of the split with the *training* processing, in split order
  (row i = the example at position i, what `make_dataset(..., return_index=True)` calls
  ``index``). Only a processing without randomness can be read once (no random crop, flip, ALS
  context or mask variant): its output does not depend on the epoch's seed.
  `random_options` names the options that prevent it.
* `train_order`: the example indices of the training stream, batch by batch, exactly as
  `make_dataset(..., train=True, return_index=True)` yields them (same seed, shuffle buffer,
  epochs, whole batches, ``start_batch`` and host shard), without reading a record: the stream's
  order comes from `pipeline.shuffled_epochs` over the same number of records, and a shuffle's
  order does not depend on what the records hold.

So ``processed_split(...)[key][train_order(...)['index']]`` is, batch for batch, the training
stream's ``key`` (tested bit-equal on `digits`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from calib_jax.data import caching, checks, processors, registry
from calib_jax.data import pipeline
from calib_jax.data.options import PipelineOptions

__all__ = ["processed_bytes", "processed_split", "random_options", "train_order"]

# Keys a processed example carries that are positions, not data (the order supplies them).
_POSITION_KEYS = ("_index", "index")


def random_options(name: str, **options) -> list[str]:
  """The options of `name`'s training processing that draw at random (``crop='pad'``,
  ``flip=True``, ...; empty: the processed examples do not depend on the seed)."""
  spec = registry.spec(name)
  opts = PipelineOptions.create(spec.meta, options)
  return list(processors.make_processor(spec, opts, True).random_options)


def _processed(name: str, split: str, data_dir: str | None, options: dict[str, Any]):
  """``(processed examples in split order, count, stored image shape)``; a ValueError naming
  the random options when the training processing draws at random."""
  spec = registry.spec(name)
  opts = PipelineOptions.create(spec.meta, {**options, "return_index": False})
  examples, builder, count = pipeline.read_split(spec, split, data_dir, opts)
  checks.check_not_empty(name, split, count)
  stored_shape = pipeline.static_image_shape(builder, spec.source.image_key)
  processor = processors.make_processor(spec, opts, True, stored_shape)
  if processor.random_options:
    raise ValueError(f"{name}: a training split can be read once only when its processing has "
                     f"no randomness; this one has {', '.join(processor.random_options)}.")
  # The seed is ignored by a processing without randomness (as the 'processed' cache relies on).
  ds = examples.enumerate().map(processors.graph_fn(
      lambda index, ex: {**processor(ex, tf.stack([tf.constant(0, tf.int64), index]), index),
                         "_index": index}),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds, count, stored_shape


def processed_bytes(name: str, split: str, *, data_dir: str | None = None, **options) -> int:
  """Bytes `processed_split` would return (counted from the shapes; no image is decoded)."""
  ds, count, _ = _processed(name, split, data_dir, options)
  spec = {k: v for k, v in ds.element_spec.items() if k not in _POSITION_KEYS}
  per_example = caching.element_bytes(spec)
  if per_example is None:
    raise ValueError(f"{name}: processed examples differ in shape; they cannot be stacked.")
  return count * per_example


def processed_split(name: str, split: str, *, data_dir: str | None = None,
                    read_batch: int = 1024, **options) -> dict[str, np.ndarray]:
  """Every example of ``split`` with the training processing of ``options``, in split order.

  Args:
    name, split, data_dir, **options: as for `make_dataset` (training options).
    read_batch: examples per tf.data batch while reading (does not change the values).

  Returns:
    ``{key: array [N, ...]}`` of the keys a training batch has ('image' or 'tokens', 'label',
    'mask', 'objectness' / 'boxes' when asked for), row i the example at position i.

  Raises:
    ValueError: the processing draws at random; checks.DataError: bad data (as `make_dataset`).
  """
  ds, _, stored_shape = _processed(name, split, data_dir, options)
  ds = pipeline.batch_dataset(ds, read_batch, drop_remainder=False)
  ds = ds.prefetch(2).with_options(pipeline.tf_options())
  num_classes = registry.info(name).num_classes
  parts = list(pipeline.checked_batches(ds, name, split, num_classes, stored_shape))
  return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]
          if key not in _POSITION_KEYS}


def train_order(name: str, split: str, *, batch_size: int, seed: int = 0,
                data_dir: str | None = None, start_batch: int = 0,
                process_index: int | None = None, process_count: int | None = None,
                **options) -> pipeline.Batches:
  """The training stream's example positions, batch by batch: ``{'index': int64 [B]}``.

  Arguments as `make_dataset(name, split, train=True, ...)`; the batches equal that stream's
  ``index`` (``return_index=True``). Only the record count is read; nothing is decoded.
  """
  spec = registry.spec(name)
  opts = PipelineOptions.create(spec.meta, options)
  pipeline.check_stream_args(name, batch_size=batch_size, start_batch=start_batch, seed=seed)
  process_index, process_count = pipeline.process_layout(process_index, process_count)
  count = pipeline.num_examples(name, split, data_dir=data_dir, **options)
  checks.check_not_empty(name, split, count)
  per_epoch = pipeline.count_epoch_batches(count, batch_size, process_count,
                                           f"{name} split {split!r}")
  # As `pipeline._train_stream`: the same records per host, buffer, epoch length and skip.
  per_host = count // process_count
  first_epoch, offset = divmod(int(start_batch), per_epoch)
  records = tf.data.Dataset.range(count).shard(process_count, process_index)
  ds = pipeline.shuffled_epochs(records, seed=int(seed),
                                buffer=min(opts.shuffle_buffer, per_host + 1),
                                per_epoch=per_epoch * batch_size, first_epoch=first_epoch)
  # One tf.data element per epoch (its positions in order; an epoch is whole batches), cut
  # into batches in numpy: the per-element work stays in tf.data's C++, and Python pays one
  # iteration per epoch instead of one per batch.
  ds = ds.batch(per_epoch * batch_size).prefetch(1)
  epochs = ds.with_options(pipeline.tf_options()).as_numpy_iterator()

  def batches():
    skip = offset
    for _, positions in epochs:
      for row in positions.reshape(per_epoch, batch_size)[skip:]:
        yield {"index": row}
      skip = 0

  return pipeline.Batches(batches(), num_examples=count, num_batches=None,
                          batches_per_epoch=per_epoch)
