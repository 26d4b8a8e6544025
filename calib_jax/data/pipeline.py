"""tf.data input pipelines yielding host-local numpy batches.

Determinism and exact resume: the training stream is a pure function of ``seed``. Epoch ``e``
is the host's shard shuffled with seed ``(seed, e)`` and cut to a whole number of batches;
every random augmentation of an example is drawn from stateless ops seeded with
``(seed, e, global example index)``, so neither thread scheduling nor where the stream was
started changes a single pixel. ``start_batch=k`` therefore starts at epoch ``k // B_e`` and
skips ``k % B_e`` batches of records before they are processed (``B_e`` batches per epoch).

Evaluation is one pass in file order; every host yields the same number of batches (the last
ones padded with ``mask=False`` examples) so that metrics summed over hosts are exact.

This module reads, shards, shuffles and batches, and returns `batches.Batches`: the iterator of
host batches with the split's example count (`num_examples` gives that count alone). An
evaluation split's pipeline and a split's count are built once per process for their arguments
and prepared files (`reuse`) and read again by later calls. What happens to one example is
elsewhere: `processors` (one processor per task), `crops` (one function per crop),
`options` (`PipelineOptions`), `registry` (each dataset's meta, source and recipe).
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from calib_jax.data import builders  # noqa: F401  (registers the local tfds builders)
from calib_jax.data import caching, checks, prepare, processors, registry, reuse
from calib_jax.data.batches import Batches, EvalPipeline, checked_batches
from calib_jax.data.options import PipelineOptions

__all__ = ["Batches", "PipelineOptions", "make_dataset", "num_examples", "tfds_split"]

_SPLIT_ALIASES = ("train", "val", "test")
# Built once per process and read again (`reuse`): evaluation pipelines and split sizes.
_EVAL_PIPELINES: reuse.Reused[EvalPipeline] = reuse.Reused(capacity=16)
_COUNTS: reuse.Reused[int] = reuse.Reused(capacity=64)


def tfds_split(split: str) -> str:
  """`split` as a split string that `make_dataset` reads as tfds does: the alias names
  ('train', 'val', 'test' — the dataset's registered splits, e.g. Fashion-MNIST's
  'train' = 'train[:55000]') become the whole tfds split of that name ('train[:100%]'); any
  other string is returned unchanged."""
  return f"{split}[:100%]" if split in _SPLIT_ALIASES else split


# --------------------------------------------------------------------------------------------
# Reading.


def _resolve_split(meta: registry.DatasetMeta, split: str) -> str:
  if split == "train":
    return meta.train_split
  if split in meta.eval_splits:
    return meta.eval_splits[split]
  if not isinstance(split, str) or not split:
    raise ValueError(f"{meta.name}: split must be one of {_SPLIT_ALIASES} or a tfds split "
                     f"string, got {split!r}.")
  return split  # A raw tfds split string such as 'train[:10%]'.


def _decoders(source: registry.Source) -> dict[str, Any]:
  keys = [k for k in (source.image_key, source.seg_key) if k]
  return {k: tfds.decode.SkipDecoding() for k in keys}


def _builder(spec: registry.DatasetSpec, data_dir: str | None, opts: PipelineOptions
             ) -> tfds.core.DatasetBuilder:
  """The dataset's prepared builder, preparing the dataset on first use."""
  return prepare.prepared_builder(
      spec, data_dir, tfds_name=opts.tfds_name, download=opts.download,
      download_retries=opts.download_retries, manual_dir=opts.manual_dir)


def _load(spec: registry.DatasetSpec, split: str, builder: tfds.core.DatasetBuilder,
          opts: PipelineOptions) -> tf.data.Dataset:
  """Undecoded examples of ``split``."""
  # tfds caches small splits in memory; `take(max_examples)` after that cache would make
  # tf.data discard the unfinished cache every epoch (and warn each time).
  return builder.as_dataset(
      split=split, decoders=_decoders(spec.source), shuffle_files=False,
      read_config=tfds.ReadConfig(try_autocache=opts.max_examples is None))


def _reuse_key(builder: tfds.core.DatasetBuilder, spec: registry.DatasetSpec, *parts: Any
               ) -> tuple[Any, ...] | None:
  """The `reuse.Reused` key of what is built from `builder`'s prepared files with `spec` and
  `parts`: None (build afresh) where the files are not in a local folder."""
  files = reuse.local_files(builder.data_dir)
  return None if files is None else (builder.data_dir, files, reuse.ByIdentity(spec), *parts)


def static_image_shape(builder, key: str | None) -> tuple[int, ...] | None:
  """The stored image shape when every image of the dataset has it (e.g. CIFAR), else None."""
  try:
    shape = tuple(builder.info.features[key].shape)
  except (KeyError, TypeError, AttributeError):
    return None
  return shape if len(shape) == 3 and None not in shape else None


def _num_examples(ds: tf.data.Dataset) -> int:
  n = int(ds.cardinality())
  if n < 0:  # Unknown or infinite: count the (undecoded) records once.
    n = int(ds.reduce(np.int64(0), lambda count, _: count + 1))
  return n


def read_split(spec: registry.DatasetSpec, split: str, data_dir: str | None,
               opts: PipelineOptions, builder: tfds.core.DatasetBuilder | None = None):
  """``(undecoded examples after max_examples, their builder, their count)``: what
  `make_dataset` and `num_examples` read, one way (`builder`: `_builder`'s, if made)."""
  builder = builder or _builder(spec, data_dir, opts)
  examples = _load(spec, _resolve_split(spec.meta, split), builder, opts)
  if opts.max_examples is not None:
    examples = examples.take(opts.max_examples)
  return examples, builder, _num_examples(examples)


# --------------------------------------------------------------------------------------------
# Streams.


def batch_dataset(ds: tf.data.Dataset, batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
  # padded_batch: the per-example box lists differ in length; zero rows are padding boxes.
  ds = ds.padded_batch(batch_size, drop_remainder=drop_remainder)
  return ds.map(processors.graph_fn(processors.finish_batch), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)


def _epoch_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
  return tf.constant(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def tf_options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = True
  return options


def _with_index(example: dict[str, tf.Tensor], index: tf.Tensor, opts: PipelineOptions
                ) -> dict[str, tf.Tensor]:
  # '_index' (always) names a bad example in errors; the iterators remove it.
  return {**example, "_index": index, **({"index": index} if opts.return_index else {})}


def count_epoch_batches(num_examples: int, batch_size: int, process_count: int, name: str
                        ) -> int:
  """Whole batches per epoch on each host (every host reads ``num_examples // process_count``)."""
  batches = (num_examples // process_count) // batch_size
  if batches < 1:
    raise ValueError(f"{name}: {num_examples} examples over {process_count} host(s) cannot fill "
                     f"one batch of {batch_size} per host.")
  return batches


def shuffled_epochs(records: tf.data.Dataset, *, seed: int, buffer: int, per_epoch: int,
                    first_epoch: int) -> tf.data.Dataset:
  """``(epoch, *record)`` of epochs ``first_epoch, first_epoch + 1, ...``: each the host's
  records shuffled with seed ``(seed, epoch)`` and cut to ``per_epoch``. The one definition of
  the training order: the order depends only on the seed, the buffer and the number of records,
  never on what they hold, so `resident.train_order` reproduces it from indices alone."""

  def epoch(e):
    shuffled = records.shuffle(buffer, seed=_epoch_seed(seed, e), reshuffle_each_iteration=False)
    return shuffled.take(per_epoch).map(processors.graph_fn(lambda *record: (e, *record)))

  return tf.data.Dataset.range(first_epoch, 2**62).flat_map(processors.graph_fn(epoch))


def _train_stream(examples, processor, spec, *, num_examples, batches_per_epoch, batch_size,
                  seed, start_batch, process_count, opts, stored_shape) -> tf.data.Dataset:
  per_host = num_examples // process_count
  per_epoch = batches_per_epoch * batch_size
  first_epoch, offset = divmod(start_batch, batches_per_epoch)
  buffer = min(opts.shuffle_buffer, per_host + 1)

  def process(e, index, ex):
    return _with_index(processor(ex, tf.stack([_epoch_seed(seed, e), index]), index), index,
                       opts)

  random_processing = caching.processing_is_random(processor)
  processed = None
  if not random_processing:  # Processed once (a processing without randomness ignores seeds).
    processed = examples.map(processors.graph_fn(lambda index, ex: (index, process(0, index, ex))),
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  cache = caching.choose(
      opts.cache, name=spec.meta.name, has_images=spec.source.image_key is not None,
      random_processing=random_processing,
      window_decoding=caching.decodes_window(processor),
      decoded_bytes=caching.decoded_bytes(stored_shape),
      processed_bytes=(None if processed is None else
                       caching.element_bytes(processed.element_spec)),
      records=per_host, records_left_out=per_host - per_epoch, shuffle_buffer=buffer)
  if cache == "processed":
    examples, process = processed.cache(), lambda e, index, ex: ex
  elif cache == "decoded":
    examples = caching.decode_images(examples, spec).cache()

  ds = shuffled_epochs(examples, seed=seed, buffer=buffer, per_epoch=per_epoch,
                       first_epoch=first_epoch).skip(offset * batch_size)
  ds = ds.map(processors.graph_fn(process), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = batch_dataset(ds, batch_size, drop_remainder=True)
  return ds.prefetch(opts.prefetch).with_options(tf_options())


def _eval_stream(examples, processor, *, batch_size, opts) -> tf.data.Dataset:
  def process(index, ex):
    return _with_index(processor(ex, tf.stack([tf.constant(0, tf.int64), index]), index), index,
                       opts)

  ds = examples.map(processors.graph_fn(process), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
  ds = batch_dataset(ds, batch_size, drop_remainder=False)
  return ds.prefetch(opts.prefetch).with_options(tf_options())


def process_layout(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"Need 0 <= process_index < process_count, got {process_index}, "
                     f"{process_count}.")
  return int(process_index), int(process_count)


def num_examples(name: str, split: str, *, data_dir: str | None = None, **options) -> int:
  """Examples `make_dataset(name, split, data_dir=data_dir, **options)` reads: those of the
  split after ``max_examples``, before sharding over hosts (its ``num_examples``).

  The dataset is prepared on first use, as `make_dataset` does; options are validated the same
  way (those that do not change the count are accepted and ignored).
  """
  spec = registry.spec(name)
  opts = PipelineOptions.create(spec.meta, options)
  builder = _builder(spec, data_dir, opts)
  return _COUNTS.get(_reuse_key(builder, spec, split, opts.max_examples),
                     lambda: read_split(spec, split, data_dir, opts, builder)[-1])


def check_stream_args(name: str, **ints: Any) -> None:
  """One-line errors for a stream's integer arguments: `batch_size` >= 1, the others >= 0."""
  for arg, value in ints.items():
    low = 1 if arg == "batch_size" else 0
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
      raise ValueError(f"{name}: {arg} must be an int >= {low}, got {value!r}.")


def make_dataset(name: str, split: str, *, batch_size: int, train: bool, seed: int = 0,
                 data_dir: str | None = None, start_batch: int = 0,
                 process_index: int | None = None, process_count: int | None = None,
                 **options) -> Batches:
  """Host-local numpy batches of a registered dataset.

  Args:
    name: registry key (see `names()`).
    split: 'train', 'val', 'test' (mapped through `info(name)`) or a raw tfds split string.
    batch_size: examples per host batch.
    train: True: infinite, shuffled, augmented stream, whole batches only. False: one
      deterministic pass, the last batch padded to ``batch_size`` with ``mask=False``.
    seed: seed of the training stream (shuffling and augmentation).
    data_dir: tfds data dir (default: tfds' default, ``~/tensorflow_datasets`` or
      ``$TFDS_DATA_DIR``).
    start_batch: training: resume exactly at batch ``start_batch`` of the stream.
    process_index: this host's index (default ``jax.process_index()``).
    process_count: number of hosts (default ``jax.process_count()``).
    **options: see `PipelineOptions`.

  Returns:
    A `Batches` iterator with the split's ``num_examples`` (and ``num_batches`` of an
    evaluation pass). It yields dicts with 'image' float32 [B,H,W,C] normalised (text:
    'tokens' int32 [B,T]), 'label' int32 [B] (segmentation [B,H,W]), 'mask' bool shaped like
    'label', plus 'objectness' float32 [B] / 'boxes' float32 [B,K,4] / 'index' int64 [B] when
    requested.

  Raises:
    ValueError: unknown dataset or option, or bad values.
    checks.DataError (a ValueError): an out-of-range label, an image of the wrong shape, an
      empty split (one line naming dataset, split and example).
    FileNotFoundError: the data are not available offline (the message says how to get them).
  """
  opened = _open(name, split, batch_size=batch_size, train=train, seed=seed, data_dir=data_dir,
                 start_batch=start_batch, process_index=process_index,
                 process_count=process_count, **options)
  return opened.batches() if isinstance(opened, EvalPipeline) else opened


def _open(name: str, split: str, *, batch_size: int, train: bool, seed: int, data_dir: str | None,
          start_batch: int, process_index: int | None, process_count: int | None,
          **options) -> "Batches | EvalPipeline":
  """`make_dataset`'s stream: training `Batches`, or the evaluation split's `EvalPipeline`
  (built once per process for its arguments and prepared files, `reuse`)."""
  spec = registry.spec(name)
  opts = PipelineOptions.create(spec.meta, options)
  check_stream_args(name, batch_size=batch_size, start_batch=start_batch, seed=seed)
  if not train and start_batch:
    raise ValueError(f"{name}: start_batch only applies to training streams.")
  layout = process_layout(process_index, process_count)
  builder = _builder(spec, data_dir, opts)

  def examples():
    """(the split's examples, enumerated, this host's shard; their count; stored image shape;
    the processor)."""
    records, _, count = read_split(spec, split, data_dir, opts, builder)
    checks.check_not_empty(name, split, count)
    # Indices are global (before sharding) so augmentation does not depend on the host count.
    records = records.enumerate().shard(layout[1], layout[0])
    stored_shape = static_image_shape(builder, spec.source.image_key)
    return records, count, stored_shape, processors.make_processor(spec, opts, train,
                                                                   stored_shape)

  num_classes = spec.meta.num_classes
  if train:
    records, count, stored_shape, processor = examples()
    per_epoch = count_epoch_batches(count, batch_size, layout[1], f"{name} split {split!r}")
    ds = _train_stream(records, processor, spec, num_examples=count,
                       batches_per_epoch=per_epoch, batch_size=batch_size, seed=int(seed),
                       start_batch=int(start_batch), process_count=layout[1], opts=opts,
                       stored_shape=stored_shape)
    return Batches(checked_batches(ds, name, split, num_classes, stored_shape), num_examples=count,
                   num_batches=None, batches_per_epoch=per_epoch)

  def build_eval():
    records, count, stored_shape, processor = examples()
    ds = _eval_stream(records, processor, batch_size=batch_size, opts=opts)
    num_batches = math.ceil(math.ceil(count / layout[1]) / batch_size)
    return EvalPipeline(ds, name, split, num_classes, stored_shape, batch_size=batch_size,
                        num_examples=count, num_batches=num_batches)

  return _EVAL_PIPELINES.get(_reuse_key(builder, spec, split, repr(opts), batch_size, *layout),
                             build_eval)


def eval_pipeline(name: str, split: str, *, batch_size: int, data_dir: str | None = None,
                  process_index: int | None = None, process_count: int | None = None,
                  **options) -> EvalPipeline:
  """`make_dataset(name, split, train=False, ...)` as an `EvalPipeline`: the same passes, each
  `batches()` a new one (arguments and errors as `make_dataset`'s). The pipeline is built once
  per process for these arguments and the dataset's prepared files: a later call with the same
  ones returns it again (until 16 others were built since), one after the dataset is prepared
  anew builds it afresh."""
  return _open(name, split, batch_size=batch_size, train=False, seed=0, data_dir=data_dir,
               start_batch=0, process_index=process_index, process_count=process_count,
               **options)

