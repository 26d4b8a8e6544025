"""Segmentation helpers: confusion matrix / mIoU vs numpy, ignore masks, pixel subsampling."""
import jax
import numpy as np
import pytest

from calib_jax import metrics


def ref_miou(pred, labels, num_classes, valid):
  cm = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(cm, (labels[valid], pred[valid]), 1)
  ious = []
  for k in range(num_classes):
    union = cm[k].sum() + cm[:, k].sum() - cm[k, k]
    if union:
      ious.append(cm[k, k] / union)
  return np.mean(ious), cm


def test_miou_and_confusion_match_numpy_with_ignore_index():
  rng = np.random.default_rng(0)
  num_classes = 5
  labels = rng.integers(0, num_classes - 1, (3, 8, 7))  # class 4 never labelled ...
  pred = np.where(rng.random(labels.shape) < 0.7, labels, rng.integers(0, 4, labels.shape))
  labels[0, :3] = 255
  mask = np.asarray(metrics.valid_mask(labels, 255))
  expected, cm = ref_miou(pred, labels, num_classes, mask)  # ... nor predicted: left out
  np.testing.assert_allclose(metrics.miou(pred, labels, num_classes, mask), expected,
                             atol=1e-6)
  np.testing.assert_array_equal(metrics.confusion_matrix(pred, labels, num_classes, mask), cm)
  # Perfect prediction: mIoU 1.
  np.testing.assert_allclose(metrics.miou(labels, labels, num_classes, mask), 1.0)


def test_miou_errors():
  labels = np.zeros((2, 3), np.int32)
  with pytest.raises(ValueError, match="outside"):
    metrics.miou(labels, np.full((2, 3), 255), 4)  # ignore label without a mask
  with pytest.raises(ValueError, match="must equal"):
    metrics.miou(labels, labels[:1], 4)
  with pytest.raises(ValueError, match="num_classes"):
    metrics.miou(labels, labels, 0)


def test_subsample_pixels_picks_valid_pixels_reproducibly():
  rng = np.random.default_rng(1)
  mask = rng.random((3, 40, 50)) < 0.8
  mask[2] = False
  mask[2, :3, :4] = True  # only 12 labelled pixels in the last image
  key = jax.random.key(0)
  chosen = np.asarray(metrics.subsample_pixels(key, mask, num_pixels=500))
  assert chosen.shape == mask.shape
  assert not np.any(chosen & ~mask)                      # only labelled pixels
  np.testing.assert_array_equal(chosen.reshape(3, -1).sum(1), [500, 500, 12])
  again = np.asarray(metrics.subsample_pixels(key, mask, num_pixels=500))
  np.testing.assert_array_equal(chosen, again)           # same key -> same pixels
  other = np.asarray(metrics.subsample_pixels(jax.random.key(1), mask, num_pixels=500))
  assert np.any(other != chosen)
  # Roughly uniform: each half of image 0 gets about half of the picks.
  top = chosen[0, :20].sum() / mask[0, :20].sum()
  bottom = chosen[0, 20:].sum() / mask[0, 20:].sum()
  assert abs(top - bottom) < 0.1
  with pytest.raises(ValueError, match="num_pixels"):
    metrics.subsample_pixels(key, mask, num_pixels=0)
