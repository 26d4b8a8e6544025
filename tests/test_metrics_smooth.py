"""Smooth ECE against two numpy transcriptions written here: the formula evaluated directly
(O(N·T) kernel sums, no grid) and relplot 1.0's discretised algorithm with its bandwidth search
(float64, its grid for every bandwidth)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from calib_jax import metrics


def _probs_from(f, y, c=10):
  """`[N, c]` rows whose max is `f` (> 1/c) at class 0, labels 0 where `y` else 1."""
  rest = (1.0 - f)[:, None] / (c - 1) * np.ones((1, c - 1))
  probs = np.concatenate([f[:, None], rest], axis=1).astype(np.float32)
  return probs, np.where(y, 0, 1)


def _data(n, seed, calibrated=False, top=1.0):
  rng = np.random.default_rng(seed)
  f = rng.uniform(0.15, top, n)
  truth = f if calibrated else f ** 2          # over-confident: P(correct | f) = f²
  y = rng.random(n) < truth
  probs, labels = _probs_from(f, y)
  return probs, labels, probs.max(1).astype(np.float64), (probs.argmax(1) == labels) * 1.0


# ---------------------------------------------------------------- numpy transcriptions
def direct_smece(f, y, sigma):
  """The definition: reflected Gaussian (truncated at |d| ≤ 1/2) summed over all samples.

  relplot's grid (and ours) reflects mass on its end nodes at half weight, so the data of the
  comparisons below stays clear of the outermost grid cells."""
  t = np.linspace(0, 1, max(round(10 / sigma), 200))
  r = f - y
  residual, density = np.zeros_like(t), np.zeros_like(t)
  for source in (f, -f, 2 - f):
    d = t[:, None] - source[None, :]
    k = np.exp(-d ** 2 / (2 * sigma ** 2)) / (np.sqrt(2 * np.pi) * sigma) * (np.abs(d) <= 0.5)
    residual += k @ r
    density += k.sum(1)
  return np.abs(residual).sum() / (density + 1e-4).sum()


def _grid(sigma):
  m = max(2000, round(20 / sigma)) // 2 + 1
  return m + 1 - m % 2


def gridded_smece(f, y, sigma):
  """relplot's discretisation: linear spreading, reflected kernel convolution, interpolation."""
  m = _grid(sigma)
  pos = f * (m - 1)
  lower = np.clip(pos.astype(int), 0, m - 2)
  frac = pos - lower
  out = []
  for w in (f - y, np.ones_like(f)):
    v = np.zeros(m)
    np.add.at(v, lower, (1 - frac) * w)
    np.add.at(v, lower + 1, frac * w)
    kernel = np.exp(-(np.linspace(0, 1, m) - 0.5) ** 2 / (2 * sigma ** 2))
    kernel /= np.sqrt(2 * np.pi) * sigma
    ext = np.concatenate([v[1:][::-1], v, v[:-1][::-1]])
    smoothed = scipy.signal.fftconvolve(ext, kernel, "valid")[m // 2: m // 2 + m]
    t = np.linspace(0, 1, max(round(10 / sigma), 200))
    out.append(np.interp(t, np.linspace(0, 1, m), smoothed))
  return np.abs(out[0]).sum() / (out[1] + 1e-4).sum()


def searched_smece(f, y):
  lo, hi = 0.0, 1.0
  for _ in range(10):
    mid = (lo + hi) / 2
    if mid < 1e-3 or mid < gridded_smece(f, y, mid):
      lo = mid
    else:
      hi = mid
  return gridded_smece(f, y, hi), hi


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("sigma", [0.02, 0.05, 0.2])
def test_fixed_bandwidth_matches_the_direct_kernel_sums(sigma):
  probs, labels, f, y = _data(3000, 0, top=0.95)
  got = float(metrics.smooth_ece(probs, labels, bandwidth=sigma))
  # Linear spreading onto the grid (h = 1e-3) shifts the kernel sums by about (h/σ)²/8.
  np.testing.assert_allclose(got, direct_smece(f, y, sigma), rtol=0.15 * (1e-3 / sigma) ** 2)
  np.testing.assert_allclose(got, gridded_smece(f, y, sigma), rtol=2e-5)


@pytest.mark.parametrize("calibrated, n", [(False, 4000), (True, 20000)])
def test_automatic_bandwidth_is_relplots_fixed_point(calibrated, n):
  probs, labels, f, y = _data(n, 1, calibrated)
  value, sigma = metrics.smooth_ece(probs, labels, return_bandwidth=True)
  want, want_sigma = searched_smece(f, y)
  assert float(sigma) == want_sigma
  # Calibrated data ends below σ = 0.01, where relplot re-bins per bandwidth and we use one
  # finer grid: the two differ by the (small) spreading error only.
  np.testing.assert_allclose(float(value), want, rtol=2e-3 if calibrated else 2e-5)
  assert float(sigma) >= float(value) - 1e-6 and float(sigma) - 2 ** -10 < float(value) + 1e-3


def test_calibrated_predictions_score_near_zero_and_shrink_with_n():
  small = float(metrics.smooth_ece(*_data(2000, 2, calibrated=True)[:2]))
  large = float(metrics.smooth_ece(*_data(50000, 2, calibrated=True)[:2]))
  miscalibrated = float(metrics.smooth_ece(*_data(50000, 2)[:2]))
  assert large < small < 0.05
  assert large < 0.01 < 0.1 < miscalibrated


def test_mask_jit_and_leading_dims():
  probs, labels, _, _ = _data(3000, 3)
  mask = np.arange(3000) % 3 != 0
  want = metrics.smooth_ece(probs[mask], labels[mask])
  np.testing.assert_allclose(metrics.smooth_ece(probs, labels, mask=mask), want, rtol=1e-6)
  jitted = jax.jit(metrics.smooth_ece, static_argnames="bandwidth")
  np.testing.assert_allclose(jitted(jnp.asarray(probs), jnp.asarray(labels), mask), want,
                             rtol=1e-6)
  np.testing.assert_allclose(
      metrics.smooth_ece(probs.reshape(30, 100, 10), labels.reshape(30, 100)),
      metrics.smooth_ece(probs, labels), rtol=1e-6)


def test_smooth_calibration_curve_is_the_kernel_regression():
  probs, labels, f, y = _data(3000, 4, top=0.95)
  curve = metrics.smooth_calibration_curve(probs, labels, bandwidth=0.1, num_points=50)
  t = curve["t"]
  k = sum(np.exp(-(t[:, None] - s[None, :]) ** 2 / 0.02) * (np.abs(t[:, None] - s) <= 0.5)
          for s in (f, -f, 2 - f)) / (np.sqrt(2 * np.pi) * 0.1)
  np.testing.assert_allclose(curve["accuracy"], t - (k @ (f - y)) / (k.sum(1) + 1e-4),
                             atol=2e-4)
  np.testing.assert_allclose(curve["density"], k.sum(1) / len(f), rtol=2e-4)
  assert curve["bandwidth"] == pytest.approx(0.1)
  assert curve["smooth_ece"] == pytest.approx(float(metrics.smooth_ece(probs, labels,
                                                                       bandwidth=0.1)))


@pytest.mark.parametrize("bandwidth, match", [(0.0, r"in \(0, 1\]"), (1.5, r"in \(0, 1\]"),
                                              ("wide", "float"), (True, "float")])
def test_bad_bandwidth(bandwidth, match):
  probs, labels, _, _ = _data(10, 5)
  with pytest.raises(ValueError, match=match):
    metrics.smooth_ece(probs, labels, bandwidth=bandwidth)


def test_bad_shapes_and_labels():
  probs, labels, _, _ = _data(10, 6)
  with pytest.raises(ValueError, match="labels shape"):
    metrics.smooth_ece(probs, labels[:5])
  with pytest.raises(ValueError, match="outside"):
    metrics.smooth_ece(probs, np.full(10, 12))


def test_top_label_smooth_ece_equals_smooth_ece_of_the_probabilities():
  rng = np.random.default_rng(12)
  probs = rng.dirichlet(np.ones(6), size=700).astype(np.float32)
  labels = rng.integers(0, 6, 700)
  conf, correct = metrics.confidence_and_correct(probs, labels)
  mask = rng.uniform(size=700) < 0.7
  for m in (None, mask):
    np.testing.assert_allclose(metrics.top_label_smooth_ece(conf, correct, m),
                               metrics.smooth_ece(probs, labels, m), rtol=1e-6)
  with pytest.raises(ValueError, match="correct must be bool"):
    metrics.top_label_smooth_ece(conf, np.asarray(correct, np.int32))
  with pytest.raises(ValueError, match=r"must both be \[N\]"):
    metrics.top_label_smooth_ece(conf, correct[:-1])


@pytest.mark.parametrize("calibrated", [False, True])
def test_batched_searches_equal_each_resamples_own_search(calibrated):
  """`smooth_batched.search_bandwidths` of B resamples given as counts of the original points
  (tabulated kernels, the density's sum by Parseval, the fine grid in groups): every
  resample's σ equal and its value within float32 rounding of `smooth.search_bandwidth` of its
  drawn points, on the coarse grid and where the search goes to the fine one."""
  from calib_jax.metrics import smooth, smooth_batched  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(12)
  n, b = (8000, 12) if calibrated else (600, 12)
  conf = rng.uniform(0.5, 1.0, n).astype(np.float32)
  correct = rng.uniform(size=n) < (conf if calibrated else 0.6)
  idx = rng.integers(0, n, (b, n))
  counts = np.stack([np.bincount(i, minlength=n) for i in idx]).astype(np.float32)
  values, sigmas = jax.jit(smooth_batched.search_bandwidths)(
      counts, conf, correct, jax.jit(smooth_batched.tables)())
  one = jax.jit(smooth.search_bandwidth)
  want = [one(conf[i], correct[i], None) for i in idx]
  np.testing.assert_array_equal(sigmas, [float(s) for _, s in want])
  np.testing.assert_allclose(values, [float(v) for v, _ in want], rtol=1e-6)
  # A search that ends at σ < 1/64 has scored 1/128 on the fine grid.
  assert (np.min(sigmas) < 1 / 64) == calibrated
