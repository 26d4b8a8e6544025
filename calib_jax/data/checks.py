"""Checks of the examples an input pipeline reads, each failure one `DataError` line naming the
dataset, the split and the example (its position in the split):

* an out-of-range label (classification label or segmentation pixel, ignore pixels excepted),
  checked on every host batch before it is returned, so at the first bad batch;
* an image whose decoded shape differs from the shape the dataset stores (CIFAR, MNIST, ...:
  datasets whose images all have one shape), checked in the tf.data graph per example;
* an empty split, before any batch.

Any other error tf.data raises while reading becomes one `DataError` line as well.
"""
import re
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

# Marks our shape assertion in tf.data's error message, followed by [index] [shape].
_BAD_SHAPE = "calib_jax: image shape"
_BAD_SHAPE_RE = re.compile(re.escape(_BAD_SHAPE) + r"\]\s*\[(-?\d+)\]\s*\[([-\d ]+)\]")


class DataError(ValueError):
  """The data of a dataset split are unusable (bad label, bad image, empty split)."""


def where(name: str, split: str) -> str:
  """How messages name a dataset split: `cifar10 split 'test'`."""
  return f"{name} split {split!r}"


def with_shape(image: tf.Tensor, shape: tuple[int, ...], index: tf.Tensor) -> tf.Tensor:
  """`image` with a run-time check that its shape is `shape` (its rank already is), failing with
  the example's `index` and actual shape for `translate` to report."""
  ok = tf.reduce_all(tf.equal(tf.shape(image), tf.constant(shape, tf.int32)))
  check = tf.debugging.Assert(ok, [_BAD_SHAPE, index, tf.shape(image)], summarize=8)
  with tf.control_dependencies([check]):
    image = tf.identity(image)
  image.set_shape(shape)
  return image


def check_labels(name: str, split: str, batch: dict[str, np.ndarray], index: np.ndarray,
                 num_classes: int) -> None:
  """Raises `DataError` for the first example of `batch` with a label outside [0, num_classes).

  Args:
    name, split: the dataset and split, for the message.
    batch: host batch with 'label' ([B] or [B,H,W]) and 'mask' (same shape; False = ignored).
    index: [B] positions of the batch's examples in the split.
    num_classes: number of classes.
  """
  labels, mask = batch["label"], batch["mask"]
  bad = mask & ((labels < 0) | (labels >= num_classes))
  per_example = bad.reshape(bad.shape[0], -1).any(axis=1)
  if per_example.any():
    j = int(np.argmax(per_example))
    value = int(np.asarray(labels[j])[np.asarray(bad[j])].flat[0])
    raise DataError(f"{name}: label {value} out of range [0, {num_classes}) at example "
                    f"{int(index[j])} of {where(name, split)} ({int(bad.sum())} bad value(s) in "
                    "this batch).")


def check_not_empty(name: str, split: str, num_examples: int) -> None:
  """Raises `DataError` when the split has no example."""
  if num_examples == 0:
    raise DataError(f"{where(name, split)} is empty (0 examples); check the split's name and "
                    "the data directory.")


def translate(error: tf.errors.OpError, name: str, split: str,
              expected: tuple[int, ...] | None) -> DataError:
  """The one-line `DataError` for an error tf.data raised while reading `name`/`split`."""
  found = _BAD_SHAPE_RE.search(error.message)
  if found:
    shape = tuple(int(d) for d in found.group(2).split())
    return DataError(f"{name}: image of shape {shape} at example {found.group(1)} of "
                     f"{where(name, split)}; the dataset's images are {tuple(expected or ())}.")
  first = (error.message.strip().splitlines() or [type(error).__name__])[0]
  return DataError(f"{name}: reading {where(name, split)} failed: {first[:200]}")


def iterate(ds: tf.data.Dataset, name: str, split: str, expected: tuple[int, ...] | None
            ) -> Iterator[dict[str, np.ndarray]]:
  """`ds.as_numpy_iterator()`, with tf.data's errors as one-line `DataError`s."""
  it = ds.as_numpy_iterator()
  while True:
    try:
      batch = next(it)
    except StopIteration:
      return
    except tf.errors.OpError as e:
      raise translate(e, name, split, expected) from None
    yield batch
