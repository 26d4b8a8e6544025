"""The training stream's in-memory cache: which one a stream gets, and how it is made.

A training stream reads, decodes and processes every example again in every epoch. Two caches
keep the host's shard in memory after the first epoch instead (as big_vision's ``cache_raw`` /
``cache_final``):

* ``'processed'``: the examples after processing (model input, label, mask), when the training
  processing draws nothing at random (no random crop, flip or context sample: the Fashion-MNIST
  MLP recipe, text). Later epochs only shuffle and batch.
* ``'decoded'``: the decoded images; the random augmentation still runs in every epoch.

Either way the batches are bit-identical to the uncached stream: the same operations run on the
same values (`processors.decode_image` passes decoded images through; a processing without
randomness ignores its seed), and the shuffle order depends only on the seed and the number of
records, not on what they hold. The automatic choice (option ``cache=None``) takes the first
that applies and fits in `CACHE_MAX_BYTES`.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from calib_jax.data import crops, processors
from calib_jax.data.options import CACHE_MODES
from calib_jax.data.registry import DatasetSpec

__all__ = ["CACHE_MAX_BYTES", "CACHE_MODES", "choose", "decode_images", "decoded_bytes",
           "decodes_window", "element_bytes", "processing_is_random"]

# Host memory an automatic cache may take for one training shard. Processed: Fashion-MNIST
# 188 MB (float32 28x28); decoded: CIFAR-10 154 MB, Tiny ImageNet 1.2 GB (not cached).
CACHE_MAX_BYTES = 2**30


def processing_is_random(processor) -> bool:
  """Whether a processor draws anything from its seed (then 'processed' cannot apply); a
  processor that does not say (``is_random``) is taken to."""
  return bool(getattr(processor, "is_random", True))


def decodes_window(processor) -> bool:
  """Whether a processor decodes only a window of each JPEG (then a cache of whole decoded
  images would not be bit-equal, and the automatic choice does not make one); a processor that
  does not say (``decodes_window``) is taken to."""
  return bool(getattr(processor, "decodes_window", True))


def element_bytes(spec) -> int | None:
  """Bytes of one element of a tf.data ``element_spec`` (None when a shape is not static)."""
  total = 0
  for leaf in tf.nest.flatten(spec):
    if not leaf.shape.is_fully_defined() or leaf.dtype == tf.string:
      return None
    total += int(np.prod(leaf.shape.as_list())) * leaf.dtype.size
  return total


def choose(requested: str | None, *, name: str, has_images: bool, random_processing: bool,
           window_decoding: bool, decoded_bytes: int | None, processed_bytes: int | None,
           records: int, records_left_out: int, shuffle_buffer: int) -> str:
  """The cache a training stream gets (a name of `CACHE_MODES`).

  Args:
    requested: the ``cache`` option: None (automatic) or a name of `CACHE_MODES`.
    name: the dataset, for error messages.
    has_images: whether examples hold an image to decode.
    random_processing: `processing_is_random` of the training processor.
    window_decoding: `decodes_window` of the training processor: the automatic choice then
      does not cache decoded images (a whole decode would not be bit-equal).
    decoded_bytes, processed_bytes: bytes of one decoded / processed example (None: varies).
    records: records of the host's shard; records_left_out: those an epoch does not use.
    shuffle_buffer: the stream's shuffle buffer.

  Raises:
    ValueError: a requested cache that cannot apply to this stream (the message says why).
  """
  # tf.data keeps a cache only once an iterator has read to its end; an epoch reads the whole
  # shard when the shuffle buffer outlasts the records it leaves unused.
  whole_shard_read = shuffle_buffer > records_left_out
  if requested is None:
    fits = lambda size: size is not None and records * size <= CACHE_MAX_BYTES
    if not whole_shard_read:
      return "none"
    if not random_processing and fits(processed_bytes):
      return "processed"
    if has_images and not window_decoding and fits(decoded_bytes):
      return "decoded"
    return "none"
  if requested == "none":
    return "none"
  if not whole_shard_read:
    raise ValueError(f"{name}: cache={requested!r} needs every epoch to read the whole shard: "
                     f"shuffle_buffer ({shuffle_buffer}) must exceed the {records_left_out} "
                     f"records an epoch leaves out.")
  if requested == "processed" and random_processing:
    raise ValueError(f"{name}: cache='processed' needs a training processing without "
                     f"randomness (crop in {crops.DETERMINISTIC_CROPS}, no flip, no ALS "
                     f"context or mask variant); use cache='decoded'.")
  if requested == "decoded" and not has_images:
    raise ValueError(f"{name}: cache='decoded' needs images; this dataset has none (use "
                     f"'processed').")
  return requested


def decode_images(examples: tf.data.Dataset, spec: DatasetSpec) -> tf.data.Dataset:
  """``(index, example)`` records with the example's image decoded to uint8."""
  key, channels = spec.source.image_key, spec.meta.input_shape[-1]

  def decode(index, ex):
    return index, {**ex, key: processors.decode_image(ex[key], channels)}

  return examples.map(processors.graph_fn(decode), num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=True)


def decoded_bytes(stored_shape: tuple[int, ...] | None) -> int | None:
  """Bytes of one decoded uint8 image of the stored shape (None: images differ in shape)."""
  return None if stored_shape is None else math.prod(stored_shape)
