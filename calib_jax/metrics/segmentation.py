"""Segmentation helpers: confusion matrix / mIoU, ignore masks, and pixel subsampling.

Calibration and selective metrics work on pixels directly: pass `probs [B, H, W, C]`, labels
`[B, H, W]` and `mask = valid_mask(labels)` (leading dims are flattened by every metric).
"""
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import arrays

ArrayLike = jax.typing.ArrayLike


def valid_mask(labels: ArrayLike, ignore_index: Optional[int] = 255) -> jax.Array:
  """True where `labels != ignore_index` (all True when `ignore_index` is None)."""
  labels = jnp.asarray(labels)
  if ignore_index is None:
    return jnp.ones(labels.shape, bool)
  return labels != ignore_index


@functools.partial(jax.jit, static_argnames="num_classes")
def confusion_counts(pred: jax.Array, labels: jax.Array, mask: Optional[jax.Array],
                     num_classes: int) -> jax.Array:
  """`confusion_matrix` of flat, already-checked arrays (traceable: no value checks), for
  accumulators that update inside jit; entries outside [0, C) or masked out are not counted."""
  in_range = (labels >= 0) & (labels < num_classes) & (pred >= 0) & (pred < num_classes)
  keep = in_range if mask is None else in_range & mask
  overflow = num_classes * num_classes
  idx = jnp.where(keep, labels * num_classes + pred, overflow)
  counts = jax.ops.segment_sum(jnp.ones_like(idx), idx, overflow + 1)[:overflow]
  return counts.reshape(num_classes, num_classes)


def _flatten_pred_labels(pred, labels, num_classes, mask):
  arrays.check_num_classes(num_classes)
  p_shape, l_shape = tuple(jnp.shape(pred)), tuple(jnp.shape(labels))
  if p_shape != l_shape:
    raise ValueError(f"pred shape {p_shape} must equal labels shape {l_shape}.")
  if 0 in p_shape:
    raise ValueError("empty input: pred/labels have no entries.")
  pred = arrays.as_int_array(pred, "pred").reshape(-1)
  labels = arrays.as_int_array(labels, "labels").reshape(-1)
  mask = arrays.flatten_mask(mask, l_shape)
  arrays.check_label_values(labels, num_classes, mask)
  arrays.check_label_values(pred, num_classes, mask)
  return pred, labels, mask


def confusion_matrix(pred: ArrayLike, labels: ArrayLike, num_classes: int,
                     mask: Optional[ArrayLike] = None) -> jax.Array:
  """int32 `[C, C]` counts, rows = true label, columns = prediction, over valid entries."""
  pred, labels, mask = _flatten_pred_labels(pred, labels, num_classes, mask)
  return confusion_counts(pred, labels, mask, num_classes)


def iou_from_confusion(confusion: jax.Array):
  """Per-class IoU `TP / (TP + FP + FN)` and their mean over classes present in either.

  Classes that appear neither in the labels nor in the predictions have no IoU; they are left
  out of the mean (and reported as 0 in the per-class array). Returns `(miou, per_class)`.
  """
  confusion = confusion.astype(jnp.float32)
  tp = jnp.diagonal(confusion)
  union = jnp.sum(confusion, 0) + jnp.sum(confusion, 1) - tp
  present = union > 0
  per_class = jnp.where(present, tp / jnp.where(present, union, 1.0), 0.0)
  miou = jnp.sum(per_class) / jnp.maximum(jnp.sum(present), 1)
  return miou.astype(jnp.float32), per_class


def miou(pred: ArrayLike, labels: ArrayLike, num_classes: int,
         mask: Optional[ArrayLike] = None) -> jax.Array:
  """Mean intersection-over-union of integer predictions vs labels over valid entries.

  Args:
    pred: integer predictions `[...]` (e.g. `argmax` of the logits).
    labels: integer labels, same shape; positions with an ignore label must be masked out.
    num_classes: C.
    mask: optional bool `[...]`, e.g. `valid_mask(labels, 255)`.

  Returns:
    float32 scalar: mean IoU over classes present in labels or predictions.
  """
  return iou_from_confusion(confusion_matrix(pred, labels, num_classes, mask))[0]


@functools.partial(jax.jit, static_argnames="num_pixels")
def _pixel_indices(key, valid, num_pixels):
  flat = valid.reshape(valid.shape[0], -1)
  priority = jax.random.uniform(key, flat.shape)
  # Valid pixels get priorities in [1, 2), invalid ones in [0, 1): top-k takes valid first.
  priority = priority + flat.astype(jnp.float32)
  _, index = lax.top_k(priority, num_pixels)
  return index, jnp.take_along_axis(flat, index, axis=1)


@functools.partial(jax.jit, static_argnames="num_pixels")
def _subsample(key, valid, num_pixels):
  index, chosen = _pixel_indices(key, valid, num_pixels)
  picked = jnp.zeros((valid.shape[0], valid[0].size), bool)
  picked = jax.vmap(lambda c, i, v: c.at[i].set(v))(picked, index, chosen)
  return picked.reshape(valid.shape)


def _check_subsample(mask, num_pixels):
  shape = tuple(jnp.shape(mask))
  if len(shape) < 2:
    raise ValueError(f"mask must be [B, ...] with at least 2 dims, got shape {shape}.")
  if isinstance(num_pixels, bool) or not isinstance(num_pixels, int) or num_pixels < 1:
    raise ValueError(f"num_pixels must be a positive int, got {num_pixels!r}.")
  return arrays.as_bool_array(mask, "mask"), min(num_pixels, math.prod(shape[1:]))


def subsample_pixel_indices(key: jax.Array, mask: ArrayLike, num_pixels: int = 5000):
  """The pixels of `subsample_pixels` as indices, to gather per-pixel values with.

  Returns `(index, chosen)`, both `[B, k]` with `k = min(num_pixels, pixels per image)`:
  flat pixel indices into each image (`mask[b].reshape(-1)[index[b]]`), distinct, and whether
  each is a chosen labelled pixel (images with fewer than k labelled pixels fill their last
  slots with unlabelled ones, `chosen` False). Traceable (usable inside `jit`).
  """
  mask, k = _check_subsample(mask, num_pixels)
  return _pixel_indices(key, mask, k)


def subsample_pixels(key: jax.Array, mask: ArrayLike, num_pixels: int = 5000) -> jax.Array:
  """Picks up to `num_pixels` valid pixels per image uniformly at random (LS-vs-SC §2.4).

  The risk–coverage curves of dense tasks are estimated on 5000 random labelled pixels per
  image. The choice depends only on `key` and `mask`, so models evaluated with the same key see
  the same pixels (`subsample_pixel_indices` gives the same choice as indices).

  Args:
    key: a `jax.random` key.
    mask: bool `[B, H, W]`, True at labelled pixels (e.g. `valid_mask(labels)`).
    num_pixels: pixels per image; images with fewer valid pixels keep all of them.

  Returns:
    bool `[B, H, W]`: the chosen pixels (a subset of `mask`).
  """
  mask, k = _check_subsample(mask, num_pixels)
  return _subsample(key, mask, k)
