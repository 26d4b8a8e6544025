"""Segmentation training crops computed on the crop only (`crops.scale_pad_crop`) give the same
bits as the whole-image pipeline they replaced: decode, map every label, rescale the whole image
and label map, pad, crop, flip.

The reference below is that earlier implementation (calib_jax before the window version),
kept here verbatim in substance so the two can be compared on generated examples of VOC-like
and Cityscapes-like sizes, both smaller and larger than the crop.
"""
import numpy as np
import pytest
import tensorflow as tf

from calib_jax.data import boxes as boxes_lib
from calib_jax.data import crops, registry

MEAN_PIXEL = tf.constant(registry.info("cityscapes").mean, tf.float32) * 255.0
LUT = np.full(256, 255, np.int32)
for _stored, _label in registry.CITYSCAPES_LABEL_TO_TRAIN_ID.items():
  LUT[_stored] = _label


def reference_scale_pad_crop(image, seg, seed, *, size, scale, flip, mean_pixel, ignore_label,
                             label_lut=None):
  """The whole-image version: labels mapped first, everything rescaled, padded, then cropped."""
  image = tf.cast(image, tf.float32)
  seg = tf.cast(seg, tf.int32)
  if label_lut is not None:
    seg = tf.gather(label_lut, seg)
  seeds = tf.random.experimental.stateless_split(seed, 4)
  factor = tf.random.stateless_uniform([], seeds[0], scale[0], scale[1])
  new = tf.cast(tf.round(tf.cast(tf.shape(image)[:2], tf.float32) * factor), tf.int32)
  image = tf.image.resize(image, new, method="bilinear")
  seg = tf.image.resize(seg, new, method="nearest")
  crop_h, crop_w = size
  pad_h = tf.maximum(crop_h - tf.shape(image)[0], 0)
  pad_w = tf.maximum(crop_w - tf.shape(image)[1], 0)
  paddings = [[0, pad_h], [0, pad_w], [0, 0]]
  image = tf.pad(image - mean_pixel, paddings) + mean_pixel
  seg = tf.pad(seg, paddings, constant_values=ignore_label)
  shape = tf.shape(image)
  oy = tf.random.stateless_uniform([], seeds[1], 0, shape[0] - crop_h + 1, dtype=tf.int32)
  ox = tf.random.stateless_uniform([], seeds[2], 0, shape[1] - crop_w + 1, dtype=tf.int32)
  image = image[oy:oy + crop_h, ox:ox + crop_w]
  seg = seg[oy:oy + crop_h, ox:ox + crop_w]
  if flip:
    flipped = boxes_lib.random_flip(seeds[3])
    image = tf.cond(flipped, lambda: tf.reverse(image, axis=[1]), lambda: image)
    seg = tf.cond(flipped, lambda: tf.reverse(seg, axis=[1]), lambda: seg)
  return image, seg


def _example(rng, h, w):
  """A smooth image (as a JPEG's content) with noise, and blocky labels of every uint8 value."""
  coarse = rng.uniform(0, 255, (h // 16 + 2, w // 16 + 2, 3)).astype(np.float32)
  image = tf.image.resize(coarse, (h, w)).numpy() + rng.normal(0, 8, (h, w, 3))
  image = np.clip(np.round(image), 0, 255).astype(np.uint8)
  seg = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1)).astype(np.uint8)
  seg = np.repeat(np.repeat(seg, 8, 0), 8, 1)[:h, :w, None]
  return image, seg


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_resized_window_equals_window_of_full_resize(method):
  rng = np.random.default_rng(0)
  for _ in range(25):
    h, w = rng.integers(5, 400, 2)
    image = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
    new = np.maximum(1, np.round(np.array([h, w]) * rng.uniform(0.3, 2.5))).astype(np.int32)
    source = image if method == "nearest" else image.astype(np.float32)
    full = tf.image.resize(source, new, method=method).numpy()
    y0, x0 = rng.integers(0, new[0]), rng.integers(0, new[1])
    rows = np.arange(y0, min(new[0], y0 + rng.integers(1, 90)), dtype=np.int32)
    cols = np.arange(x0, min(new[1], x0 + rng.integers(1, 90)), dtype=np.int32)
    window = crops.resized_window(tf.constant(image), tf.constant(new), rows, cols, method)
    np.testing.assert_array_equal(window.numpy(), full[rows][:, cols])
    assert window.dtype == full.dtype


@pytest.mark.parametrize("shape,size,lut", [
    ((375, 500), (512, 512), None),     # VOC landscape: padded at small scales
    ((500, 375), (512, 512), None),     # VOC portrait
    ((120, 90), (64, 48), None),        # small crop of a small image
    ((256, 512), (128, 256), LUT),      # Cityscapes-shaped, with its labelId -> trainId map
    ((1024, 2048), (512, 1024), LUT),   # Cityscapes at full size
])
@pytest.mark.parametrize("window_min_ratio", [0.0, float("inf"), crops.WINDOW_MIN_AREA_RATIO])
def test_window_crop_equals_whole_image_pipeline(shape, size, lut, window_min_ratio, monkeypatch):
  """Both ways of computing the crop (the window alone, or the whole rescaled image), and the
  library's choice between them, against the reference."""
  monkeypatch.setattr(crops, "WINDOW_MIN_AREA_RATIO", window_min_ratio)
  rng = np.random.default_rng(sum(shape))
  image, seg = _example(rng, *shape)
  lut_t = None if lut is None else tf.constant(lut)
  seeds = [(0, 0), (1, 7), (5, 3)] if shape[0] >= 1024 else [(s, 11 * s + 1) for s in range(8)]
  for seed in seeds:
    kw = dict(size=size, scale=(0.5, 2.0), flip=True, mean_pixel=MEAN_PIXEL, ignore_label=255,
              label_lut=lut_t)
    seed = tf.constant(seed, tf.int64)
    want_image, want_seg = reference_scale_pad_crop(image, seg, seed, **kw)
    for stored in (image, image.astype(np.float32)):  # encoded-then-decoded or cached pixels
      got_image, got_seg = crops.scale_pad_crop(tf.constant(stored), tf.constant(seg), seed, **kw)
      np.testing.assert_array_equal(got_image.numpy(), want_image.numpy())
      np.testing.assert_array_equal(got_seg.numpy(), want_seg.numpy())
      assert got_image.dtype == tf.float32 and got_seg.dtype == tf.int32


def test_window_crop_pads_with_mean_pixel_and_ignore_label():
  """At the smallest scale a 375x500 image cannot fill a 512x512 crop: the rest is padding."""
  rng = np.random.default_rng(3)
  image, seg = _example(rng, 375, 500)
  got_image, got_seg = crops.scale_pad_crop(
      tf.constant(image), tf.constant(seg), tf.constant([0, 1], tf.int64), size=(512, 512),
      scale=(0.5, 0.5), flip=False, mean_pixel=MEAN_PIXEL, ignore_label=255)
  # 0.5 x (375, 500) = (188, 250): everything below row 188 or right of column 250 is padding.
  assert (got_seg.numpy()[188:] == 255).all() and (got_seg.numpy()[:, 250:] == 255).all()
  np.testing.assert_array_equal(got_image.numpy()[300, 300], MEAN_PIXEL.numpy())
  assert (got_seg.numpy()[:188, :250] != 255).any()
