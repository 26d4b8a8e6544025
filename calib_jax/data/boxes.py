"""Box geometry for adaptive label smoothing: exact objectness and box-aware crops.

Boxes/crops: normalised ``[ymin, xmin, ymax, xmax]`` (docs/conventions.md#boxes-and-objectness) in
*edge* coordinates, i.e. pixel row ``i`` of an image of height ``H`` covers ``[i/H, (i+1)/H]``.
A crop window may extend beyond ``[0, 1]`` (pad-and-crop); it is always expressed relative to
the image the boxes refer to. Rows with zero (or negative) area are padding.

Every random choice takes an explicit stateless seed (``int32/int64 [2]``) so that a training
stream is a pure function of ``(seed, epoch, example index)``; this is what makes exact resume
possible.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "objectness",
    "objectness_tf",
    "union_area_tf",
    "transform_boxes",
    "flip_boxes",
    "box_pixel_mask",
    "fill_boxes",
    "sample_inception_crop",
    "inception_crop",
    "decode_inception_crop",
    "pad_crop",
    "resize_crop",
    "center_crop",
    "random_flip",
]

FULL_WINDOW = (0.0, 0.0, 1.0, 1.0)


def union_area_tf(boxes: tf.Tensor) -> tf.Tensor:
  """Exact area of the union of axis-aligned boxes ``[..., K, 4]`` (any float dtype).

  Coordinate compression: the 2K y-edges and 2K x-edges cut the plane into at most
  ``(2K-1)^2`` cells; a cell is covered iff its centre lies strictly inside some box, and the
  union area is the summed area of covered cells. Degenerate boxes cover no cell centre, so
  padding rows need no special casing. ``K = 0`` gives 0. Leading dimensions are batch
  dimensions (the pipeline computes a whole batch at once).
  """
  boxes = tf.convert_to_tensor(boxes)
  ys = tf.sort(tf.concat([boxes[..., 0], boxes[..., 2]], axis=-1), axis=-1)  # [..., 2K]
  xs = tf.sort(tf.concat([boxes[..., 1], boxes[..., 3]], axis=-1), axis=-1)
  cy = 0.5 * (ys[..., 1:] + ys[..., :-1])  # [..., Ny]
  cx = 0.5 * (xs[..., 1:] + xs[..., :-1])  # [..., Nx]
  hy = ys[..., 1:] - ys[..., :-1]
  wx = xs[..., 1:] - xs[..., :-1]
  in_y = (cy[..., None, :] > boxes[..., 0:1]) & (cy[..., None, :] < boxes[..., 2:3])  # [.., K, Ny]
  in_x = (cx[..., None, :] > boxes[..., 1:2]) & (cx[..., None, :] < boxes[..., 3:4])  # [.., K, Nx]
  covered = tf.reduce_any(in_y[..., :, :, None] & in_x[..., :, None, :], axis=-3)  # [.., Ny, Nx]
  cell_area = hy[..., :, None] * wx[..., None, :]
  return tf.reduce_sum(tf.where(covered, cell_area, tf.zeros_like(cell_area)), axis=[-2, -1])


def objectness_tf(boxes: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
  """Fraction of ``window`` covered by the union of ``boxes`` (graph version of `objectness`).

  Args:
    boxes: ``[..., K, 4]`` normalised boxes; zero-area rows are padding.
    window: ``[..., 4]`` crop window in the same coordinates, with positive area.

  Returns:
    ``[...]`` values in ``[0, 1]`` with the dtype of ``boxes``.
  """
  boxes = tf.convert_to_tensor(boxes)
  window = tf.cast(window, boxes.dtype)[..., None, :]  # [..., 1, 4]
  clipped = tf.concat([tf.maximum(boxes[..., :2], window[..., :2]),
                       tf.minimum(boxes[..., 2:], window[..., 2:])], axis=-1)
  window_area = (window[..., 0, 2] - window[..., 0, 0]) * (window[..., 0, 3] - window[..., 0, 1])
  return union_area_tf(clipped) / window_area


def objectness(boxes, crop) -> float:
  """Exact objectness of a crop (docs/conventions.md#boxes-and-objectness), eager on numpy.

  Args:
    boxes: ``[K, 4]`` normalised ``[ymin, xmin, ymax, xmax]`` object boxes; rows with zero
      area are padding.
    crop: ``[4]`` crop window ``[ymin, xmin, ymax, xmax]`` in the same coordinates.

  Returns:
    Area of (union of boxes ∩ crop) / area of crop, in ``[0, 1]``. It runs the same
    computation as the tf.data pipeline (`objectness_tf`), in float64.

  Raises:
    ValueError: wrong shapes, non-finite values or a crop with non-positive area.
  """
  boxes = np.asarray(boxes, dtype=np.float64)
  crop = np.asarray(crop, dtype=np.float64)
  if boxes.ndim == 1 and boxes.size == 0:
    boxes = boxes.reshape(0, 4)
  if boxes.ndim != 2 or boxes.shape[1] != 4:
    raise ValueError(f"objectness: boxes must have shape [K, 4], got {boxes.shape}.")
  if crop.shape != (4,):
    raise ValueError(f"objectness: crop must have shape [4], got {crop.shape}.")
  if not (np.all(np.isfinite(boxes)) and np.all(np.isfinite(crop))):
    raise ValueError("objectness: boxes and crop must be finite.")
  if crop[2] <= crop[0] or crop[3] <= crop[1]:
    raise ValueError(f"objectness: crop {crop.tolist()} has non-positive area.")
  return float(objectness_tf(tf.constant(boxes), tf.constant(crop)).numpy())


def transform_boxes(boxes: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
  """Maps boxes into the coordinates of the crop ``window``, clipped to ``[0, 1]``.

  A box outside the window collapses to zero area (i.e. becomes padding).
  """
  window = tf.cast(window, boxes.dtype)
  h = window[2] - window[0]
  w = window[3] - window[1]
  out = (boxes - tf.stack([window[0], window[1], window[0], window[1]])) / tf.stack([h, w, h, w])
  out = tf.clip_by_value(out, 0.0, 1.0)
  # Padding rows (zero/negative area) stay zero-area after clipping: ymax<=ymin is preserved.
  return out


def flip_boxes(boxes: tf.Tensor) -> tf.Tensor:
  """Left-right flip of normalised boxes."""
  return tf.stack([boxes[:, 0], 1.0 - boxes[:, 3], boxes[:, 2], 1.0 - boxes[:, 1]], axis=1)


def box_pixel_mask(boxes: tf.Tensor, height, width) -> tf.Tensor:
  """Boolean ``[K, H, W]``: pixel (i, j) belongs to box k iff its centre lies inside it."""
  cy = (tf.cast(tf.range(height), tf.float32) + 0.5) / tf.cast(height, tf.float32)
  cx = (tf.cast(tf.range(width), tf.float32) + 0.5) / tf.cast(width, tf.float32)
  boxes = tf.cast(boxes, tf.float32)
  in_y = (cy[None, :] >= boxes[:, 0:1]) & (cy[None, :] < boxes[:, 2:3])
  in_x = (cx[None, :] >= boxes[:, 1:2]) & (cx[None, :] < boxes[:, 3:4])
  return in_y[:, :, None] & in_x[:, None, :]


def _box_cover(boxes: tf.Tensor, height, width, channels, select: tf.Tensor | None
               ) -> tf.Tensor:
  """Bool ``[H, W * channels]``: pixel (i, j), each channel, lies in one of the selected boxes
  (its centre inside, as `box_pixel_mask`).

  A box's pixels are the product of its rows and its columns, so the union over boxes is a
  ``[H, K] x [K, W * C]`` product of 0/1 floats (counts, exact) — laid out per channel so that
  the fill needs no broadcast over the channel axis, which TensorFlow's CPU kernels make slow.
  """
  cy = (tf.cast(tf.range(height), tf.float32) + 0.5) / tf.cast(height, tf.float32)
  cx = (tf.cast(tf.range(width), tf.float32) + 0.5) / tf.cast(width, tf.float32)
  boxes = tf.cast(boxes, tf.float32)
  in_y = (cy[None, :] >= boxes[:, 0:1]) & (cy[None, :] < boxes[:, 2:3])
  in_x = (cx[None, :] >= boxes[:, 1:2]) & (cx[None, :] < boxes[:, 3:4])
  if select is not None:
    in_y = in_y & select[:, None]
  in_x = tf.repeat(in_x, channels, axis=1)
  return tf.matmul(tf.cast(in_y, tf.float32), tf.cast(in_x, tf.float32), transpose_a=True) > 0.5


def fill_boxes(image: tf.Tensor, boxes: tf.Tensor, fill_value, keep: tf.Tensor | None = None
               ) -> tf.Tensor:
  """Fills the pixels of ``boxes`` with ``fill_value`` (e.g. the dataset's mean pixel).

  Args:
    image: ``[H, W, C]`` float image.
    boxes: ``[K, 4]`` normalised boxes of that image.
    fill_value: ``[C]`` (or scalar) value written into the boxes.
    keep: optional bool ``[K]``; kept boxes are neither filled nor overwritten where they
      overlap a filled box (the 'mask' variant keeps one object intact).
  """
  shape = tf.shape(image)
  height, width, channels = shape[0], shape[1], shape[2]
  if keep is None:
    region = _box_cover(boxes, height, width, channels, None)
  else:
    keep = tf.cast(keep, tf.bool)
    region = (_box_cover(boxes, height, width, channels, ~keep)
              & ~_box_cover(boxes, height, width, channels, keep))
  fill_row = tf.tile(tf.broadcast_to(tf.cast(fill_value, image.dtype), [channels]), [width])
  flat = tf.where(region, fill_row[None, :], tf.reshape(image, [height, width * channels]))
  return tf.reshape(flat, shape)


def _resize(image: tf.Tensor, size: Sequence[int], method: str) -> tf.Tensor:
  out = tf.image.resize(image, size, method=method)
  return tf.cast(out, image.dtype) if method == "nearest" else out


def sample_inception_crop(image_shape: tf.Tensor, seed: tf.Tensor, scale=(0.08, 1.0),
                          ratio=(3 / 4, 4 / 3)) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """Samples an Inception-style crop (area ``scale``, aspect ``ratio``) of an image shape.

  The crop is sampled without regard to the objects (min_object_covered = 0) so that, as in
  ImageNet training, crops may miss the object; that is what objectness measures.

  Returns:
    ``(begin [3] int32, size [3] int32, window [4] float32)`` with ``begin``/``size`` usable
    by `tf.slice` and `tf.image.decode_and_crop_jpeg` (as ``[y, x, h, w]``).
  """
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      image_shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
      min_object_covered=0.0, aspect_ratio_range=ratio, area_range=scale, max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  h = tf.cast(image_shape[0], tf.float32)
  w = tf.cast(image_shape[1], tf.float32)
  by, bx = tf.cast(begin[0], tf.float32), tf.cast(begin[1], tf.float32)
  sh, sw = tf.cast(size[0], tf.float32), tf.cast(size[1], tf.float32)
  window = tf.stack([by / h, bx / w, (by + sh) / h, (bx + sw) / w])
  return begin, size, window


def inception_crop(image: tf.Tensor, seed: tf.Tensor, out_size: Sequence[int],
                   scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), method: str = "bilinear"
                   ) -> tuple[tf.Tensor, tf.Tensor]:
  """Inception-style random resized crop of a decoded image (see `sample_inception_crop`).

  Returns:
    ``(float image [out_h, out_w, C], window [4] float32)``.
  """
  begin, size, window = sample_inception_crop(tf.shape(image), seed, scale, ratio)
  crop = tf.slice(image, begin, size)
  return _resize(tf.cast(crop, tf.float32), out_size, method), window


def decode_inception_crop(encoded: tf.Tensor, channels: int, seed: tf.Tensor, scale=(0.08, 1.0),
                          ratio=(3 / 4, 4 / 3)) -> tuple[tf.Tensor, tf.Tensor]:
  """Samples an Inception crop of an *encoded* image and decodes only that crop.

  JPEGs go through `tf.image.decode_and_crop_jpeg` (much cheaper than decoding the whole
  photo); other formats are decoded and sliced. The crop is the same as `inception_crop`
  with the same seed would take.

  Returns:
    ``(uint8 crop [h, w, channels] at the original resolution, window [4] float32)``.
  """
  def jpeg():
    begin, size, window = sample_inception_crop(
        tf.image.extract_jpeg_shape(encoded), seed, scale, ratio)
    crop = tf.image.decode_and_crop_jpeg(encoded, tf.stack([begin[0], begin[1], size[0], size[1]]),
                                         channels=channels)
    return crop, window

  def other():
    image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    begin, size, window = sample_inception_crop(tf.shape(image), seed, scale, ratio)
    return tf.slice(image, begin, size), window

  crop, window = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
  crop.set_shape([None, None, channels])
  return crop, window


def pad_crop(image: tf.Tensor, seed: tf.Tensor, pad: int) -> tuple[tf.Tensor, tf.Tensor]:
  """CIFAR-style: zero-pad by ``pad`` pixels on each side and take a random crop of the
  original size. Returns ``(float image, window)``; the window may extend beyond [0, 1]."""
  shape = tf.shape(image)
  padded = tf.pad(tf.cast(image, tf.float32), [[pad, pad], [pad, pad], [0, 0]])
  offsets = tf.random.stateless_uniform([2], seed, minval=0, maxval=2 * pad + 1, dtype=tf.int32)
  crop = tf.slice(padded, tf.stack([offsets[0], offsets[1], 0]), shape)
  crop.set_shape(image.shape)
  h = tf.cast(shape[0], tf.float32)
  w = tf.cast(shape[1], tf.float32)
  oy = tf.cast(offsets[0] - pad, tf.float32)
  ox = tf.cast(offsets[1] - pad, tf.float32)
  window = tf.stack([oy / h, ox / w, (oy + h) / h, (ox + w) / w])
  return crop, window


def resize_crop(image: tf.Tensor, seed: tf.Tensor, resize: int, out_size: Sequence[int]
                ) -> tuple[tf.Tensor, tf.Tensor]:
  """Resize to ``resize x resize`` then take a random ``out_size`` crop (CUB recipe)."""
  out_h, out_w = int(out_size[0]), int(out_size[1])
  resized = _resize(tf.cast(image, tf.float32), (resize, resize), "bilinear")
  oy = tf.random.stateless_uniform([], seed, minval=0, maxval=resize - out_h + 1, dtype=tf.int32)
  ox = tf.random.stateless_uniform([], tf.stack([seed[0], seed[1] + 1]), minval=0,
                                   maxval=resize - out_w + 1, dtype=tf.int32)
  crop = tf.slice(resized, tf.stack([oy, ox, 0]), [out_h, out_w, -1])
  r = float(resize)
  oyf, oxf = tf.cast(oy, tf.float32), tf.cast(ox, tf.float32)
  window = tf.stack([oyf / r, oxf / r, (oyf + out_h) / r, (oxf + out_w) / r])
  return crop, window


def center_crop(image: tf.Tensor, resize: int | None, out_size: Sequence[int]
                ) -> tuple[tf.Tensor, tf.Tensor]:
  """Eval crop: resize to ``resize x resize`` (None: just resize to ``out_size``) and take the
  central ``out_size`` crop."""
  out_h, out_w = int(out_size[0]), int(out_size[1])
  if resize is None:
    return _resize(tf.cast(image, tf.float32), (out_h, out_w), "bilinear"), tf.constant(
        FULL_WINDOW, tf.float32)
  resized = _resize(tf.cast(image, tf.float32), (resize, resize), "bilinear")
  oy, ox = (resize - out_h) // 2, (resize - out_w) // 2
  crop = resized[oy:oy + out_h, ox:ox + out_w]
  r = float(resize)
  window = tf.constant([oy / r, ox / r, (oy + out_h) / r, (ox + out_w) / r], tf.float32)
  return crop, window


def random_flip(seed: tf.Tensor) -> tf.Tensor:
  """Bool scalar: whether to flip left-right (probability 1/2)."""
  return tf.random.stateless_uniform([], seed) < 0.5
