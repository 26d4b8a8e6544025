"""The crops of the input pipeline: one pure tf function per crop.

`CROPS` maps each crop name to its function and is the one place crop names live: a recipe's
``train_crop`` / ``eval_crop`` (`registry.Recipe`) and the ``crop`` option of `make_dataset`
name one of its keys.

Every function of `CROPS` is called as ``crop(image, seed, args)`` on one stored example image
(encoded bytes or uint8 ``[H, W, C]``), an int64 ``[2]`` stateless seed and the `CropArgs` of
the dataset, and returns ``(float32 image [H, W, C] of args.size, window)``: the crop window in
the stored image's normalised coordinates (`boxes` conventions), from which objectness and the
returned boxes are computed. Object boxes that are to be filled with the mean pixel are filled
by ``args.fill`` at the pixels of the crop (pixel-aligned crops fill after cropping and before
resizing, which equals filling before cropping; resizing crops fill at full resolution first).

Segmentation crops the image and its label mask together: `scale_pad_crop` in training and
`fit_and_pad` in evaluation (their sizes come from the recipe's ``seg_scale`` / ``eval_shape``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf

from calib_jax.data import boxes as boxes_lib

__all__ = ["CROPS", "CropArgs", "EVAL_RESIZE_RATIO", "resize_side", "resize_to", "pad",
           "inception", "resize_crop", "none", "center", "resized_window", "scale_pad_crop",
           "fit_and_pad", "WINDOW_MIN_AREA_RATIO"]

# 224/256: without a recipe's resize, images are resized to max(size) / 0.875 before a crop.
EVAL_RESIZE_RATIO = 0.875


@dataclasses.dataclass(frozen=True)
class CropArgs:
  """What a crop needs besides the image and the seed.

  Attributes:
    size: (H, W) of the output image.
    channels: image channels.
    decode: stored image (encoded bytes or uint8) -> uint8 ``[H, W, channels]``.
    fill: ``fill(float image, window)`` -> the image with the example's object boxes filled
      where the processor asks for it; ``window`` is the crop window the image shows (its boxes
      are mapped into it), or None for the whole stored image (boxes as stored).
    pad: 'pad': pixels of zero padding on each side.
    resize: 'resize_crop' / 'center': side the image is resized to before cropping.
    scale: 'inception': (min, max) area fraction.
    ratio: 'inception': (min, max) aspect ratio.
  """
  size: tuple[int, int]
  channels: int
  decode: Callable[[tf.Tensor], tf.Tensor]
  fill: Callable[[tf.Tensor, tf.Tensor | None], tf.Tensor]
  pad: int = 4
  resize: int = 0
  scale: tuple[float, float] = (0.08, 1.0)
  ratio: tuple[float, float] = (3 / 4, 4 / 3)


def resize_side(size: tuple[int, int], recipe_resize: int | None, size_overridden: bool) -> int:
  """Side images are resized to before a 'resize_crop' or 'center' crop: the recipe's unless
  the output size was overridden (``image_size`` option), else ``max(size) / 0.875``."""
  if recipe_resize is not None and not size_overridden:
    return recipe_resize
  return int(round(max(size) / EVAL_RESIZE_RATIO))


def resize_to(image: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
  """Bilinear resize to ``size``; the image itself when its static shape already is ``size``."""
  static = image.shape[:2]
  if static[0] == size[0] and static[1] == size[1]:
    return image
  return tf.image.resize(image, size, method="bilinear")


# --------------------------------------------------------------------------------------------
# Pixel-aligned crops: crop at the stored resolution, fill, then resize to the output size.


def pad(image: tf.Tensor, seed: tf.Tensor, args: CropArgs) -> tuple[tf.Tensor, tf.Tensor]:
  """CIFAR-style: zero-pad by ``args.pad`` pixels and take a random crop of the stored size."""
  image = tf.cast(args.decode(image), tf.float32)
  image, window = boxes_lib.pad_crop(image, seed, args.pad)
  return resize_to(args.fill(image, window), args.size), window


def inception(image: tf.Tensor, seed: tf.Tensor, args: CropArgs) -> tuple[tf.Tensor, tf.Tensor]:
  """Inception-style random resized crop (area ``args.scale``, aspect ``args.ratio``); of a
  JPEG only the crop is decoded."""
  if image.dtype == tf.string:
    crop, window = boxes_lib.decode_inception_crop(image, args.channels, seed, args.scale,
                                                   args.ratio)
  else:
    begin, size, window = boxes_lib.sample_inception_crop(tf.shape(image), seed, args.scale,
                                                          args.ratio)
    crop = tf.slice(image, begin, size)
  return resize_to(args.fill(tf.cast(crop, tf.float32), window), args.size), window


def none(image: tf.Tensor, seed: tf.Tensor, args: CropArgs) -> tuple[tf.Tensor, tf.Tensor]:
  """The whole image, resized to the output size if it has another."""
  del seed
  image = tf.cast(args.decode(image), tf.float32)
  window = tf.constant(boxes_lib.FULL_WINDOW, tf.float32)
  return resize_to(args.fill(image, window), args.size), window


# --------------------------------------------------------------------------------------------
# Resizing crops: fill at the stored resolution, then resize and crop.


def resize_crop(image: tf.Tensor, seed: tf.Tensor, args: CropArgs
                ) -> tuple[tf.Tensor, tf.Tensor]:
  """Square resize to ``args.resize`` then a random crop of the output size (CUB recipe)."""
  image = args.fill(tf.cast(args.decode(image), tf.float32), None)
  return boxes_lib.resize_crop(image, seed, args.resize, args.size)


def center(image: tf.Tensor, seed: tf.Tensor, args: CropArgs) -> tuple[tf.Tensor, tf.Tensor]:
  """Evaluation: square resize to ``args.resize`` then the central crop of the output size."""
  del seed
  image = args.fill(tf.cast(args.decode(image), tf.float32), None)
  return boxes_lib.center_crop(image, args.resize, args.size)


CropFn = Callable[[tf.Tensor, tf.Tensor, CropArgs], tuple[tf.Tensor, tf.Tensor]]

CROPS: dict[str, CropFn] = {
    "pad": pad,
    "inception": inception,
    "resize_crop": resize_crop,
    "none": none,
    "center": center,
}
# The crops that draw nothing at random (a training stream with one of them, no flip and no ALS
# context samples can be cached after processing, `caching`).
DETERMINISTIC_CROPS = ("none", "center")
RANDOM_CROPS = tuple(name for name in CROPS if name not in DETERMINISTIC_CROPS)
# The crops that decode only their window of a JPEG: decoding the whole image first (a cache of
# decoded images) would not give the same pixels bit for bit.
WINDOW_DECODING_CROPS = ("inception",)


# --------------------------------------------------------------------------------------------
# Segmentation: image and label mask together.


def _pad_to(image, seg, height, width, mean_pixel, ignore_label):
  """Pads bottom/right to at least (height, width): the image with the mean pixel, the labels
  with the ignore label."""
  shape = tf.shape(image)
  pad_h = tf.maximum(height - shape[0], 0)
  pad_w = tf.maximum(width - shape[1], 0)
  paddings = [[0, pad_h], [0, pad_w], [0, 0]]
  image = tf.pad(image - mean_pixel, paddings) + mean_pixel
  seg = tf.pad(seg, paddings, constant_values=ignore_label)
  return image, seg


def _source_index(out_index: tf.Tensor, in_size: tf.Tensor, out_size: tf.Tensor,
                  nearest: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """Where output rows (or columns) ``out_index`` of a half-pixel-centred resize from
  ``in_size`` to ``out_size`` read the input, in the float32 arithmetic of TensorFlow's
  ResizeBilinear / ResizeNearestNeighbor kernels (``resize_bilinear_op.cc``: ``in = (i + 0.5) *
  scale - 0.5`` with ``scale = in_size / out_size``; nearest: ``floor((i + 0.5) * scale)``), so
  that a window computed from them equals the same window of ``tf.image.resize`` bit for bit.

  Returns:
    ``(lower, upper, lerp)``: int32 input indices and the float32 weight of ``upper``
    (nearest: ``(index, index, 0)``).
  """
  scale = tf.cast(in_size, tf.float32) / tf.cast(out_size, tf.float32)
  if nearest:
    index = tf.minimum(tf.cast(tf.floor((tf.cast(out_index, tf.float32) + 0.5) * scale),
                               tf.int32), in_size - 1)
    index = tf.maximum(index, 0)
    return index, index, tf.zeros_like(scale)
  position = (tf.cast(out_index, tf.float32) + 0.5) * scale - 0.5
  floor = tf.floor(position)
  lower = tf.maximum(tf.cast(floor, tf.int32), 0)
  upper = tf.minimum(tf.cast(tf.math.ceil(position), tf.int32), in_size - 1)
  return lower, upper, position - floor


def resized_window(image: tf.Tensor, new: tf.Tensor, rows: tf.Tensor, cols: tf.Tensor,
                   method: str) -> tf.Tensor:
  """``tf.image.resize(image, new, method)[rows][:, cols]`` without resizing the whole image:
  only the window's pixels are computed (bit-identical, `_source_index`).

  Bilinear is computed separably, as the kernel does: each source row the window needs (one
  contiguous band) is interpolated along x at the window's columns, then pairs of those rows
  along y.

  Args:
    image: ``[H, W, C]`` (any dtype for 'nearest'; read as float32 for 'bilinear').
    new: int32 ``[2]``, the size of the resized image.
    rows, cols: non-decreasing int32 indices into the resized image, each within ``[0, new)``.
    method: 'bilinear' (float32 result) or 'nearest' (``image``'s dtype).
  """
  in_h, in_w = tf.shape(image)[0], tf.shape(image)[1]
  nearest = method == "nearest"
  y0, y1, wy = _source_index(rows, in_h, new[0], nearest)
  x0, x1, wx = _source_index(cols, in_w, new[1], nearest)
  if nearest:
    return tf.gather(tf.gather(image, y0), x0, axis=1)
  first = y0[0]
  band = image[first:y1[-1] + 1]  # The source rows the window reads.
  left = tf.cast(tf.gather(band, x0, axis=1), tf.float32)
  right = tf.cast(tf.gather(band, x1, axis=1), tf.float32)
  # The kernel's order of operations: lerp along x on both rows, then along y.
  along_x = left + (right - left) * wx[None, :, None]
  top, bottom = tf.gather(along_x, y0 - first), tf.gather(along_x, y1 - first)
  return top + (bottom - top) * wy[:, None, None]


# `scale_pad_crop` computes only the crop's pixels when the rescaled image is this many times
# larger than the crop, and rescales the whole image otherwise (TensorFlow's resize kernel is
# faster per pixel than the gathers of `resized_window`; measured on VOC- and Cityscapes-sized
# images, the window wins from about 1.5x). Both give the same bits.
WINDOW_MIN_AREA_RATIO = 1.5


def scale_pad_crop(image: tf.Tensor, seg: tf.Tensor, seed: tf.Tensor, *, size: tuple[int, int],
                   scale: tuple[float, float], flip: bool, mean_pixel: tf.Tensor,
                   ignore_label: int, label_lut: tf.Tensor | None = None
                   ) -> tuple[tf.Tensor, tf.Tensor]:
  """Training: random rescale by a factor in ``scale`` (bilinear; labels nearest), pad
  bottom/right to at least ``size`` (mean pixel / ignore label), random ``size`` crop, random
  flip if ``flip``; stored labels mapped through ``label_lut``.

  Only the crop is computed: its pixels of the rescaled image (`resized_window`, when the
  rescaled image is over `WINDOW_MIN_AREA_RATIO` times the crop), the padding where it falls
  outside, and the label lookup on the crop's labels (labels are picked by nearest neighbour). The result is bit-identical
  to rescaling the whole image, padding it, then cropping (tests/test_data_seg_window.py
  compares the two), at a fraction of the cost when the image is large (Cityscapes: a 2x
  rescale of 2048x1024 is 4096x2048 float32 pixels, of which a 512x1024 crop keeps 1/16).

  Args:
    image: ``[H, W, C]`` stored pixels (uint8 or float32).
    seg: ``[H, W, 1]`` stored labels (any integer dtype).
    seed: stateless seed ``[2]``.
    label_lut: int32 ``[V]``: training label of each stored label value (None: as stored).

  Returns:
    ``(float32 image [size, C], int32 seg [size, 1])``.
  """
  channels = image.shape[-1]
  seeds = tf.random.experimental.stateless_split(seed, 4)
  lo, hi = scale
  factor = tf.random.stateless_uniform([], seeds[0], lo, hi)
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  new = tf.cast(tf.round(shape * factor), tf.int32)
  crop_h, crop_w = size
  padded = tf.maximum(new, [crop_h, crop_w])
  oy = tf.random.stateless_uniform([], seeds[1], 0, padded[0] - crop_h + 1, dtype=tf.int32)
  ox = tf.random.stateless_uniform([], seeds[2], 0, padded[1] - crop_w + 1, dtype=tf.int32)
  rows, cols = tf.range(oy, oy + crop_h), tf.range(ox, ox + crop_w)
  inside = (rows < new[0])[:, None, None] & (cols < new[1])[None, :, None]
  rows, cols = tf.minimum(rows, new[0] - 1), tf.minimum(cols, new[1] - 1)
  # Either way, each pixel is (x - mean) + mean, as padding the centred image computes it.

  def window():
    pixels = resized_window(image, new, rows, cols, "bilinear")
    return tf.where(inside, pixels - mean_pixel, 0.0) + mean_pixel

  def whole():
    crop = tf.image.resize(tf.cast(image, tf.float32), new, method="bilinear")[
        oy:oy + crop_h, ox:ox + crop_w]
    missing = [crop_h, crop_w] - tf.shape(crop)[:2]
    return tf.pad(crop - mean_pixel, [[0, missing[0]], [0, missing[1]], [0, 0]]) + mean_pixel

  area_ratio = tf.cast(new[0] * new[1], tf.float32) / float(crop_h * crop_w)
  image = tf.cond(area_ratio > WINDOW_MIN_AREA_RATIO, window, whole)
  labels = tf.cast(resized_window(seg, new, rows, cols, "nearest"), tf.int32)
  if label_lut is not None:
    labels = tf.gather(label_lut, labels)
  seg = tf.where(inside, labels, ignore_label)
  if flip:
    flipped = boxes_lib.random_flip(seeds[3])
    image = tf.cond(flipped, lambda: tf.reverse(image, axis=[1]), lambda: image)
    seg = tf.cond(flipped, lambda: tf.reverse(seg, axis=[1]), lambda: seg)
  image.set_shape([crop_h, crop_w, channels])
  seg.set_shape([crop_h, crop_w, 1])
  return image, seg


def fit_and_pad(image: tf.Tensor, seg: tf.Tensor, *, shape: tuple[int, int],
                mean_pixel: tf.Tensor, ignore_label: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Evaluation: an image larger than ``shape`` is shrunk to fit (aspect kept), then padded
  bottom/right to ``shape`` (mean pixel / ignore label); smaller images are only padded."""
  channels = image.shape[-1]
  height, width = shape
  current = tf.cast(tf.shape(image)[:2], tf.float32)
  factor = tf.minimum(1.0, tf.minimum(height / current[0], width / current[1]))
  new = tf.minimum(tf.cast(tf.math.ceil(current * factor - 1e-3), tf.int32), [height, width])

  def shrink():
    return (tf.image.resize(image, new, method="bilinear"),
            tf.image.resize(seg, new, method="nearest"))

  image, seg = tf.cond(factor < 1.0, shrink, lambda: (image, seg))
  image, seg = _pad_to(image, seg, height, width, mean_pixel, ignore_label)
  image.set_shape([height, width, channels])
  seg.set_shape([height, width, 1])
  return image, seg
