"""What the input pipeline returns: `Batches`, the iterator of host batches with the sizes of what
it reads, and `EvalPipeline`, an evaluation split's pipeline read from its start by each pass.

Each batch is checked on its way out (`checked_batches`: labels in range, images of the stored
shape, tf.data's errors as one line); an evaluation pass pads its last batches so that every host
yields the same number.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import tensorflow as tf

from calib_jax.data import checks

__all__ = ["Batches", "EvalPipeline", "checked_batches"]


def _pad_batch(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  n = batch["mask"].shape[0]
  if n == batch_size:
    return batch
  return {k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def _empty_batch(element_spec, batch_size: int) -> dict[str, np.ndarray]:
  return {k: np.zeros((batch_size,) + tuple(s.shape[1:]), s.dtype.as_numpy_dtype)
          for k, s in element_spec.items() if k != "_index"}


def checked_batches(ds, name, split, num_classes, shape) -> Iterator[dict[str, np.ndarray]]:
  """The host batches, each checked (labels; tf.data errors as one line) before it is returned."""
  for batch in checks.iterate(ds, name, split, shape):
    index = batch.pop("_index")
    checks.check_labels(name, split, batch, index, num_classes)
    yield batch


def _iterate_eval(batches, ds, batch_size, num_batches) -> Iterator[dict[str, np.ndarray]]:
  count = 0
  for batch in batches:
    yield _pad_batch(batch, batch_size)
    count += 1
  for _ in range(num_batches - count):  # Hosts with a smaller shard pad to the common count.
    yield _empty_batch(ds.element_spec, batch_size)


class Batches:
  """What `make_dataset` returns: an iterator of host batches (``for batch in batches``,
  ``next(batches)``) that also tells how much it reads, as big_vision's input pipeline returns
  ``(ds, ntrain)``.

  Attributes:
    num_examples: examples in the split after ``max_examples``, before sharding over hosts
      (the training-set size an epoch, a schedule or CRL's history is sized from).
    num_batches: evaluation: batches every host yields (the last ones padded with
      ``mask=False``); training: None (the stream is infinite).
    batches_per_epoch: training: whole batches per epoch on each host, after which the stream
      reshuffles; evaluation: ``num_batches``.
  """

  def __init__(self, batches: Iterator[dict[str, np.ndarray]], *, num_examples: int,
               num_batches: int | None, batches_per_epoch: int):
    self._batches = batches
    self.num_examples = num_examples
    self.num_batches = num_batches
    self.batches_per_epoch = batches_per_epoch

  def __iter__(self) -> "Batches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._batches)

  def __repr__(self) -> str:
    return (f"Batches(num_examples={self.num_examples}, num_batches={self.num_batches}, "
            f"batches_per_epoch={self.batches_per_epoch})")


class EvalPipeline:
  """One evaluation split's tf.data pipeline, built once and read from its start by each
  `batches()`: what `eval_pipeline` returns to a reader that passes over the same split many
  times (each member of a sweep, validation every few steps), since building the pipeline
  (tracing its map functions) costs more than reading a small split.
  """

  def __init__(self, ds: tf.data.Dataset, name: str, split: str, num_classes: int,
               stored_shape: tuple[int, ...] | None, *, batch_size: int, num_examples: int,
               num_batches: int):
    self._ds, self._name, self._split = ds, name, split
    self._num_classes, self._stored_shape = num_classes, stored_shape
    self._batch_size, self._num_examples, self._num_batches = (batch_size, num_examples,
                                                               num_batches)

  def batches(self) -> Batches:
    """One pass over the split: `make_dataset(..., train=False)`'s `Batches`."""
    checked = checked_batches(self._ds, self._name, self._split, self._num_classes,
                              self._stored_shape)
    return Batches(_iterate_eval(checked, self._ds, self._batch_size, self._num_batches),
                   num_examples=self._num_examples, num_batches=self._num_batches,
                   batches_per_epoch=self._num_batches)
