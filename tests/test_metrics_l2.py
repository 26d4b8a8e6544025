"""RMS calibration error and Kumar et al.'s debiased ℓ2 ECE against numpy transcriptions."""
import jax
import numpy as np
import pytest

from calib_jax import metrics


def _data(n, seed, c=5, calibrated=False, decimals=None):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, c)) * 2
  probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
  if decimals is not None:          # many exact ties between confidences
    probs = np.round(probs, decimals)
    probs[:, -1] = 1 - probs[:, :-1].sum(1)
    probs = np.clip(probs, 0, 1)
  probs = probs.astype(np.float32)
  conf, pred = probs.max(1), probs.argmax(1)
  truth = conf if calibrated else np.sqrt(conf)          # under-confident unless calibrated
  right = rng.random(n) < truth
  labels = np.where(right, pred, (pred + rng.integers(1, c, n)) % c)
  return probs, labels


def np_rms(probs, labels, num_bins=15):
  conf = probs.max(1).astype(np.float64)
  correct = probs.argmax(1) == labels
  b = np.clip(np.ceil(probs.max(1) * num_bins).astype(int) - 1, 0, num_bins - 1)
  total = 0.0
  for k in range(num_bins):
    sel = b == k
    if sel.any():
      total += sel.mean() * (correct[sel].mean() - conf[sel].mean()) ** 2
  return np.sqrt(total)


def np_debiased(probs, labels, num_bins=15):
  """Kumar et al.'s `get_equal_bins` + `unbiased_l2_ce`, top-label, written from the paper's
  package description: midpoint boundaries of np.array_split groups, bisect_left bins."""
  conf = probs.max(1).astype(np.float64)
  correct = (probs.argmax(1) == labels).astype(np.float64)
  ordered = np.sort(conf)
  parts = np.array_split(ordered, min(num_bins, len(ordered)))
  bounds = sorted({(a[-1] + b[0]) / 2 for a, b in zip(parts[:-1], parts[1:])} | {1.0})
  b = np.searchsorted(bounds, conf, side="left")
  total = 0.0
  for k in np.unique(b):
    sel = b == k
    m = sel.sum()
    if m < 2:
      continue
    acc = correct[sel].mean()
    total += m / len(conf) * ((conf[sel].mean() - acc) ** 2 - acc * (1 - acc) / (m - 1))
  return np.sqrt(max(total, 0.0))


@pytest.mark.parametrize("decimals", [None, 2])
def test_match_numpy_transcriptions(decimals):
  probs, labels = _data(3000, 0, decimals=decimals)
  for bins in (10, 15):
    np.testing.assert_allclose(metrics.rms_calibration_error(probs, labels, bins),
                               np_rms(probs, labels, bins), rtol=2e-5)
    np.testing.assert_allclose(metrics.debiased_ece(probs, labels, bins),
                               np_debiased(probs, labels, bins), rtol=2e-4)


def test_rms_bounds_ece_and_debiasing_removes_the_noise_floor():
  probs, labels = _data(3000, 1)
  assert float(metrics.rms_calibration_error(probs, labels)) >= float(metrics.ece(probs, labels))
  # Calibrated data: the plug-in RMS keeps a noise floor ~sqrt(B·var/N); the debiased
  # estimate removes it (on average over draws: a single one is noisy).
  draws = [_data(20000, seed, calibrated=True) for seed in range(4)]
  plug_in = np.mean([float(metrics.rms_calibration_error(*d)) for d in draws])
  debiased = np.mean([float(metrics.debiased_ece(*d)) for d in draws])
  assert debiased < 0.5 * plug_in


def test_fewer_samples_than_bins_masks_and_jit():
  probs, labels = _data(40, 3)
  np.testing.assert_allclose(metrics.debiased_ece(probs[:7], labels[:7]),
                             np_debiased(probs[:7], labels[:7]), rtol=2e-4, atol=1e-7)
  mask = np.arange(40) % 4 != 1
  for fn in (metrics.debiased_ece, metrics.rms_calibration_error):
    want = fn(probs[mask], labels[mask])
    np.testing.assert_allclose(fn(probs, labels, mask=mask), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(fn, static_argnames="num_bins")(probs, labels, 15, mask),
                               want, rtol=1e-6)


def test_bad_input():
  probs, labels = _data(20, 4)
  with pytest.raises(ValueError, match="num_bins"):
    metrics.debiased_ece(probs, labels, num_bins=0)
  with pytest.raises(ValueError, match="labels shape"):
    metrics.rms_calibration_error(probs, labels[:3])
  with pytest.raises(ValueError, match="mask selects no entries"):
    metrics.debiased_ece(probs, labels, mask=np.zeros(20, bool))
