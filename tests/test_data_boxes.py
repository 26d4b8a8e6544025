"""Exact objectness and box-aware crops (calib_jax.data.boxes), against numpy references."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from calib_jax import data
from calib_jax.data import boxes as B


def _inclusion_exclusion(boxes, crop):
  """Independent exact reference: |union(b_i ∩ crop)| / |crop| by inclusion-exclusion."""
  boxes = [b for b in np.asarray(boxes, np.float64) if b[2] > b[0] and b[3] > b[1]]
  total = 0.0
  for r in range(1, len(boxes) + 1):
    for subset in itertools.combinations(boxes, r):
      y0 = max([crop[0]] + [b[0] for b in subset])
      x0 = max([crop[1]] + [b[1] for b in subset])
      y1 = min([crop[2]] + [b[2] for b in subset])
      x1 = min([crop[3]] + [b[3] for b in subset])
      total += (-1) ** (r + 1) * max(0.0, y1 - y0) * max(0.0, x1 - x0)
  return total / ((crop[2] - crop[0]) * (crop[3] - crop[1]))


def _random_boxes(rng, k):
  lo = rng.uniform(-0.2, 0.9, size=(k, 2))
  hi = lo + rng.uniform(0.0, 0.7, size=(k, 2))
  return np.concatenate([lo, hi], axis=1)[:, [0, 1, 2, 3]]


def test_objectness_matches_inclusion_exclusion_on_random_boxes():
  rng = np.random.default_rng(0)
  for trial in range(40):
    k = 1 + trial % 5
    boxes = _random_boxes(rng, k)
    if trial % 3 == 0:
      boxes = np.concatenate([boxes, np.zeros((2, 4))])  # padding rows
    crop = np.concatenate([rng.uniform(-0.1, 0.5, 2), rng.uniform(0.6, 1.1, 2)])
    assert data.objectness(boxes, crop) == pytest.approx(_inclusion_exclusion(boxes, crop),
                                                         abs=1e-12)


@pytest.mark.parametrize("boxes,crop,expected", [
    ([[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]], [0, 0, 1, 1], 0.5),  # disjoint: sum
    ([[0.1, 0.1, 0.9, 0.9], [0.2, 0.2, 0.3, 0.3]], [0, 0, 1, 1], 0.64),  # nested: outer
    ([[0.0, 0.0, 0.5, 1.0], [0.0, 0.0, 0.5, 1.0]], [0, 0, 1, 1], 0.5),  # duplicates once
    ([[0.0, 0.0, 0.2, 0.2]], [0.5, 0.5, 1.0, 1.0], 0.0),  # crop misses the object
    ([[0.0, 0.0, 1.0, 1.0]], [0.25, 0.25, 0.5, 0.75], 1.0),  # crop inside the object
    (np.zeros((3, 4)), [0, 0, 1, 1], 0.0),  # padding only
    (np.zeros((0, 4)), [0, 0, 1, 1], 0.0),  # no boxes
    ([[0.0, 0.0, 1.0, 1.0]], [-0.5, 0.0, 1.5, 1.0], 0.5),  # crop extends beyond the image
])
def test_objectness_known_values(boxes, crop, expected):
  assert data.objectness(np.asarray(boxes), np.asarray(crop)) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("boxes,crop,match", [
    (np.zeros((2, 3)), [0, 0, 1, 1], "boxes must have shape"),
    (np.zeros((2, 4)), [0, 0, 1], "crop must have shape"),
    (np.zeros((2, 4)), [0.5, 0, 0.5, 1], "non-positive area"),
    ([[0, 0, np.nan, 1]], [0, 0, 1, 1], "finite"),
])
def test_objectness_rejects_bad_input(boxes, crop, match):
  with pytest.raises(ValueError, match=match):
    data.objectness(np.asarray(boxes, np.float64), np.asarray(crop, np.float64))


def test_graph_objectness_agrees_with_eager_function():
  rng = np.random.default_rng(1)
  graph_fn = tf.function(B.objectness_tf, input_signature=[
      tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([4], tf.float32)])
  for k in (1, 2, 4, 7):
    boxes = _random_boxes(rng, k).astype(np.float32)
    crop = np.array([0.1, 0.05, 0.8, 0.9], np.float32)
    assert float(graph_fn(boxes, crop)) == pytest.approx(data.objectness(boxes, crop), abs=1e-6)


def test_transformed_boxes_keep_objectness_and_flip_is_consistent():
  rng = np.random.default_rng(2)
  boxes = _random_boxes(rng, 4).astype(np.float32)
  window = np.array([0.2, -0.1, 0.9, 0.7], np.float32)
  moved = B.transform_boxes(tf.constant(boxes), tf.constant(window)).numpy()
  assert moved.min() >= 0 and moved.max() <= 1
  assert data.objectness(moved, [0, 0, 1, 1]) == pytest.approx(data.objectness(boxes, window),
                                                               abs=1e-6)
  flipped = B.flip_boxes(tf.constant(moved))
  mask = B.box_pixel_mask(tf.constant(moved), 10, 12).numpy()
  mask_flipped = B.box_pixel_mask(flipped, 10, 12).numpy()
  np.testing.assert_array_equal(mask_flipped, mask[:, :, ::-1])
  np.testing.assert_allclose(B.flip_boxes(flipped).numpy(), moved, atol=1e-7)


def test_inception_crop_window_respects_scale_and_ratio_and_seed():
  image = tf.reshape(tf.range(60 * 80 * 3, dtype=tf.float32), [60, 80, 3])
  scale, ratio = (0.2, 0.6), (0.75, 1.333)
  for s in range(20):
    seed = tf.constant([7, s], tf.int64)
    out, window = B.inception_crop(image, seed, (16, 16), scale=scale, ratio=ratio)
    _, window_again = B.inception_crop(image, seed, (16, 16), scale=scale, ratio=ratio)
    np.testing.assert_array_equal(window.numpy(), window_again.numpy())
    assert out.shape == (16, 16, 3)
    y0, x0, y1, x1 = window.numpy()
    assert 0 <= y0 < y1 <= 1 and 0 <= x0 < x1 <= 1
    h, w = (y1 - y0) * 60, (x1 - x0) * 80
    # The sampler rounds to whole pixels; allow a pixel of slack.
    assert scale[0] * 4800 - 80 <= h * w <= scale[1] * 4800 + 80
    assert ratio[0] - 0.1 <= w / h <= ratio[1] + 0.1


def test_inception_crop_without_resize_is_the_window_slice():
  image = np.random.default_rng(3).uniform(0, 255, (20, 24, 3)).astype(np.float32)
  out, window = B.inception_crop(tf.constant(image), tf.constant([1, 2], tf.int64), (20, 24),
                                 scale=(1.0, 1.0), ratio=(20 / 24, 20 / 24))
  np.testing.assert_allclose(window.numpy(), [0, 0, 1, 1])
  np.testing.assert_allclose(out.numpy(), image, atol=1e-4)


def test_pad_crop_equals_numpy_pad_and_slice_at_the_window():
  image = np.random.default_rng(4).integers(0, 255, (8, 10, 3)).astype(np.uint8)
  padded = np.pad(image.astype(np.float32), [(2, 2), (2, 2), (0, 0)])
  for s in range(10):
    out, window = B.pad_crop(tf.constant(image), tf.constant([0, s], tf.int64), pad=2)
    oy = int(round(window.numpy()[0] * 8)) + 2
    ox = int(round(window.numpy()[1] * 10)) + 2
    assert window.numpy()[2] - window.numpy()[0] == pytest.approx(1.0)
    np.testing.assert_array_equal(out.numpy(), padded[oy:oy + 8, ox:ox + 10])


def test_resize_crop_and_center_crop_windows():
  image = tf.zeros([50, 40, 3])
  out, window = B.resize_crop(image, tf.constant([3, 4], tf.int64), 32, (24, 24))
  y0, x0, y1, x1 = window.numpy()
  assert out.shape == (24, 24, 3)
  assert y1 - y0 == pytest.approx(24 / 32) and x1 - x0 == pytest.approx(24 / 32)
  assert 0 <= y0 and y1 <= 1 and 0 <= x0 and x1 <= 1
  out, window = B.center_crop(image, 32, (24, 24))
  np.testing.assert_allclose(window.numpy(), [4 / 32, 4 / 32, 28 / 32, 28 / 32])


def test_fill_boxes_fills_others_and_keeps_the_kept_object():
  image = np.random.default_rng(5).uniform(0, 1, (10, 10, 3)).astype(np.float32)
  boxes = np.array([[0.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.8, 0.8], [0, 0, 0, 0]], np.float32)
  fill = np.array([7.0, 8.0, 9.0], np.float32)
  out = B.fill_boxes(tf.constant(image), tf.constant(boxes), fill,
                     keep=tf.constant([False, True, False])).numpy()
  first = np.zeros((10, 10), bool)
  first[0:5, 0:5] = True
  kept = np.zeros((10, 10), bool)
  kept[3:8, 3:8] = True
  filled = first & ~kept
  np.testing.assert_array_equal(out[filled], np.broadcast_to(fill, (filled.sum(), 3)))
  np.testing.assert_array_equal(out[~filled], image[~filled])
  everything = B.fill_boxes(tf.constant(image), tf.constant(boxes), fill).numpy()
  both = first | kept
  np.testing.assert_array_equal(everything[both], np.broadcast_to(fill, (both.sum(), 3)))


def _fill_boxes_per_box_masks(image, boxes, fill_value, keep=None):
  """The earlier fill_boxes: a [K, H, W] mask per box, reduced, broadcast over channels."""
  per_box = B.box_pixel_mask(boxes, tf.shape(image)[0], tf.shape(image)[1])
  if keep is None:
    region = tf.reduce_any(per_box, axis=0)
  else:
    region = (tf.reduce_any(per_box & ~keep[:, None, None], axis=0)
              & ~tf.reduce_any(per_box & keep[:, None, None], axis=0))
  fill = tf.broadcast_to(tf.cast(fill_value, image.dtype), tf.shape(image))
  return tf.where(region[:, :, None], fill, image)


@pytest.mark.parametrize("channels", [1, 3])
def test_fill_boxes_equals_per_box_masks(channels):
  """The product form of the box union fills exactly the pixels the per-box masks did."""
  rng = np.random.default_rng(channels)
  for _ in range(20):
    h, w, k = rng.integers(1, 60), rng.integers(1, 60), rng.integers(0, 5)
    image = tf.constant(rng.uniform(0, 255, (h, w, channels)).astype(np.float32))
    lo = rng.uniform(-0.2, 1.0, (k, 2))
    boxes = tf.constant(np.concatenate([lo, lo + rng.uniform(-0.1, 0.8, (k, 2))], 1), tf.float32)
    keep = tf.constant(rng.random(k) < 0.4)
    fill = rng.uniform(0, 255, channels).astype(np.float32) if rng.random() < 0.7 else 3.5
    for kept in (None, keep):
      np.testing.assert_array_equal(
          B.fill_boxes(image, boxes, fill, keep=kept).numpy(),
          _fill_boxes_per_box_masks(image, boxes, fill, keep=kept).numpy())


def test_decode_inception_crop_matches_decoding_then_cropping():
  rng = np.random.default_rng(6)
  coarse = rng.integers(0, 256, (8, 10, 3)).astype(np.uint8)
  image = tf.image.resize(coarse, (60, 75)).numpy().astype(np.uint8)
  for encode in (tf.io.encode_jpeg, tf.io.encode_png):
    encoded = encode(image)
    decoded = tf.io.decode_image(encoded, channels=3)
    for s in range(3):
      seed = tf.constant([2, s], tf.int64)
      crop, window = B.decode_inception_crop(encoded, 3, seed, scale=(0.2, 0.8))
      begin, size, window_ref = B.sample_inception_crop(tf.shape(decoded), seed, (0.2, 0.8))
      np.testing.assert_array_equal(window.numpy(), window_ref.numpy())
      diff = np.abs(crop.numpy().astype(int) - tf.slice(decoded, begin, size).numpy())
      # libjpeg upsamples chroma differently on the crop's last row/column; inside it is exact.
      assert diff[:-1, :-1].max() == 0 and diff.mean() < 0.5


def test_batched_objectness_equals_per_example_values():
  rng = np.random.default_rng(7)
  boxes = np.stack([_random_boxes(rng, 3) for _ in range(5)]).astype(np.float32)
  boxes[1, 2] = 0.0  # a padding row
  windows = np.concatenate([rng.uniform(0, 0.3, (5, 2)), rng.uniform(0.6, 1.0, (5, 2))], axis=1)
  batched = B.objectness_tf(tf.constant(boxes), tf.constant(windows, tf.float32)).numpy()
  assert batched.shape == (5,)
  for b, w, value in zip(boxes, windows, batched):
    assert value == pytest.approx(_inclusion_exclusion(b, w), abs=1e-6)
  empty = B.objectness_tf(tf.zeros([2, 0, 4]), tf.constant([[0.0, 0, 1, 1]] * 2)).numpy()
  np.testing.assert_array_equal(empty, [0.0, 0.0])
