"""Optional cross-check against torchmetrics / torch-uncertainty (the `bench` extra).

Skipped when torch is not installed. Conventions agree away from bin edges (torchmetrics bins
are [lo, hi), ours (lo, hi]), so the random probabilities below avoid exact edges.
"""
import numpy as np
import pytest

from calib_jax import metrics

torch = pytest.importorskip("torch")


def _data(n=2000, c=10, seed=0):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, c)) * 2.5
  probs = (np.exp(z) / np.exp(z).sum(1, keepdims=True)).astype(np.float32)
  labels = np.where(rng.random(n) < 0.6, probs.argmax(1), rng.integers(0, c, n))
  conf_bins = probs.max(1) * 15
  assert np.all(np.abs(conf_bins - np.round(conf_bins)) > 1e-6)  # no sample on an edge
  return probs, labels


def test_ece_matches_torchmetrics():
  functional = pytest.importorskip("torchmetrics.functional.classification")
  probs, labels = _data()
  expected = functional.multiclass_calibration_error(
      torch.from_numpy(probs), torch.from_numpy(labels), num_classes=10, n_bins=15, norm="l1")
  np.testing.assert_allclose(metrics.ece(probs, labels), float(expected), atol=1e-6)


def test_aece_matches_torch_uncertainty():
  tu = pytest.importorskip("torch_uncertainty.metrics")
  probs, labels = _data(seed=1)
  metric = tu.AdaptiveCalibrationError(task="multiclass", num_classes=10, num_bins=15)
  metric.update(torch.from_numpy(probs), torch.from_numpy(labels))
  np.testing.assert_allclose(metrics.aece(probs, labels), float(metric.compute()), atol=1e-6)
