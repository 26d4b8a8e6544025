"""Confidence scores, temperature scaling and p-norm selection vs numpy references."""
import jax
import numpy as np
import pytest
from scipy import optimize, special

from calib_jax import metrics
from calib_jax import posthoc


def _logits(seed, n=300, c=8, scale=3.0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, c)) * scale).astype(np.float32), rng


def _np_softmax(z):
  z = z.astype(np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_aurc(scores, correct):
  """Tie-aware AURC by explicit tie groups (independent of the library)."""
  order = np.argsort(-scores.astype(np.float64), kind="stable")
  s, err = scores[order], (~correct[order]).astype(np.float64)
  errors = np.zeros(len(s))
  i, before = 0, 0.0
  while i < len(s):
    j = i
    while j + 1 < len(s) and s[j + 1] == s[i]:
      j += 1
    m = j - i + 1
    errors[i:j + 1] = before + np.arange(1, m + 1) * err[i:j + 1].sum() / m
    before += err[i:j + 1].sum()
    i = j + 1
  return np.mean(errors / np.arange(1, len(s) + 1))


def test_scores_match_numpy():
  z, _ = _logits(0)
  p = _np_softmax(z)
  np.testing.assert_allclose(posthoc.msp(z), p.max(-1), rtol=1e-5)
  np.testing.assert_allclose(posthoc.max_logit(z), z.max(-1))
  np.testing.assert_allclose(posthoc.neg_entropy(z), (p * np.log(p)).sum(-1), rtol=1e-4,
                             atol=1e-5)
  for p_norm in (1, 2, 5.5):
    for center in (True, False):
      v = z - z.mean(-1, keepdims=True) if center else z
      ref = v.max(-1) / (np.abs(v.astype(np.float64)) ** p_norm).sum(-1) ** (1 / p_norm)
      np.testing.assert_allclose(posthoc.max_logit_pnorm(z, p_norm, center=center), ref,
                                 rtol=2e-5, err_msg=f"p={p_norm} center={center}")
  np.testing.assert_allclose(posthoc.max_logit_pnorm(z, float("inf"), center=False),
                             z.max(-1) / np.abs(z).max(-1), rtol=1e-6)


def test_pnorm_is_shift_sensitive_only_without_centering_and_handles_extremes():
  z, _ = _logits(1, n=20)
  shifted = z + 7.0
  np.testing.assert_allclose(posthoc.max_logit_pnorm(shifted, 2), posthoc.max_logit_pnorm(z, 2),
                             rtol=1e-5, atol=1e-6)
  # Result 1 of the LS-vs-SC paper: adding a positive constant lowers v'_max for v > 0.
  positive = np.abs(z) + 0.1
  assert np.all(np.asarray(posthoc.max_logit_pnorm(positive + 5.0, 2, center=False))
                < np.asarray(posthoc.max_logit_pnorm(positive, 2, center=False)))
  huge = np.array([[1e30, -1e30, 0.0], [3.0, 3.0, 3.0]], np.float32)
  out = np.asarray(posthoc.max_logit_pnorm(huge, 9))
  assert np.all(np.isfinite(out))
  assert out[1] == 0.0  # all-equal logits: least confident
  with pytest.raises(ValueError, match="p must be"):
    posthoc.max_logit_pnorm(z, 0.5)


def test_fit_temperature_recovers_the_generating_temperature():
  rng = np.random.default_rng(2)
  n, c, true_t = 20000, 10, 2.5
  z = (rng.normal(size=(n, c)) * 4).astype(np.float32)
  # Labels drawn from softmax(z / T): the NLL-optimal temperature is T in expectation.
  p = _np_softmax(z / true_t)
  labels = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
  t = posthoc.fit_temperature(z, labels)
  assert isinstance(t, float)
  # An independent fine grid search of the numpy NLL.
  grid = np.exp(np.linspace(np.log(1.5), np.log(4.0), 301))
  zl = z.astype(np.float64)
  nll = [(np.log(np.exp(zl / g - (zl / g).max(1, keepdims=True)).sum(1))
          + (zl / g).max(1) - zl[np.arange(n), labels] / g).mean() for g in grid]
  t_grid = grid[int(np.argmin(nll))]
  assert abs(t - t_grid) / t_grid < 2e-3
  assert abs(t - true_t) / true_t < 0.05
  # Calibration improves on held-out-like data and apply_temperature is z / T.
  scaled = np.asarray(jax.nn.softmax(posthoc.apply_temperature(z, t)))
  np.testing.assert_allclose(scaled, _np_softmax(z / t), atol=1e-5)
  assert float(metrics.ece(scaled, labels)) < float(metrics.ece(_np_softmax(z), labels))


def test_fit_temperature_with_mask_and_at_the_bounds():
  z, rng = _logits(3, n=400)
  labels = z.argmax(1)  # always right: the NLL keeps falling as T -> 0
  t = posthoc.fit_temperature(z, labels, bounds=(0.1, 10.0))
  assert abs(t - 0.1) < 1e-4
  mask = rng.random(400) < 0.5
  noisy = np.where(rng.random(400) < 0.7, labels, rng.integers(0, 8, 400))
  noisy = np.where(mask, noisy, 255)
  t_masked = posthoc.fit_temperature(z, noisy, mask)
  t_subset = posthoc.fit_temperature(z[mask], noisy[mask])
  assert 0.2 < t_subset < 15  # an interior optimum
  assert abs(t_masked - t_subset) < 1e-3 * t_subset  # float32 noise of a flat optimum
  with pytest.raises(ValueError, match="bounds"):
    posthoc.fit_temperature(z, labels, bounds=(2.0, 1.0))
  with pytest.raises(ValueError, match="temperature"):
    posthoc.apply_temperature(z, 0.0)


def _nll64(z, labels, t):
  """Mean NLL of softmax(z / T) in float64 (scipy's logsumexp)."""
  scaled = z.astype(np.float64) / t
  return np.mean(special.logsumexp(scaled, axis=1) - scaled[np.arange(len(labels)), labels])


@pytest.mark.parametrize("kind, seed, n, c, scale", [
    ("sampled", 1, 2000, 10, 4.0), ("sampled", 2, 3000, 100, 3.0),
    ("overconfident", 3, 4000, 10, 8.0)])
def test_fit_temperature_is_the_float64_optimum(kind, seed, n, c, scale):
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(n, c)) * (scale if kind == "sampled" else 1.5)).astype(np.float32)
  if kind == "sampled":  # labels drawn from softmax(z / T*), T* != 1
    p = _np_softmax(z / (0.7 if c == 100 else 2.5))
    labels = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
  else:  # a network ~87 % right whose prediction has a large margin: T > 1
    labels = rng.integers(0, c, n)
    pred = np.where(rng.random(n) < 0.87, labels, rng.integers(0, c, n))
    z[np.arange(n), pred] += scale + rng.exponential(2.0, n).astype(np.float32)
  t = posthoc.fit_temperature(z, labels)
  best = optimize.minimize_scalar(lambda s: _nll64(z, labels, 1.0 / s), bounds=(1 / 20.0, 1 / 0.05),
                                  method="bounded", options={"xatol": 1e-10})
  t64 = 1.0 / best.x
  # The golden-section search this replaced was 2e-5 to 4e-4 off (float32 NLL comparisons).
  assert abs(t - t64) / t64 < 1e-5, (t, t64)
  assert _nll64(z, labels, t) - _nll64(z, labels, t64) < 1e-10


def test_fit_temperature_on_degenerate_logits():
  z, rng = _logits(4, n=200)
  labels = np.where(rng.random(200) < 0.7, z.argmax(1), rng.integers(0, 8, 200))
  # Every softmax one-hot (no curvature): the NLL rises linearly in 1/T (some labels are wrong),
  # so the optimum is T_max; the golden-section search returned T_min here.
  assert posthoc.fit_temperature(z * np.float32(1e20), labels) == pytest.approx(20.0, rel=1e-6)
  # Every softmax uniform to float32: the NLL falls linearly in 1/T up to T_min.
  assert posthoc.fit_temperature(z * np.float32(1e-20), labels) == pytest.approx(0.05, rel=1e-6)
  # Equal logits: a flat NLL keeps T = 1, clipped to the bounds.
  flat = np.zeros_like(z)
  assert posthoc.fit_temperature(flat, labels) == 1.0
  assert posthoc.fit_temperature(flat, labels, bounds=(2.0, 3.0)) == 2.0
  # One example whose label is the runner-up: an interior optimum.
  one, one_label = z[:1], np.argsort(z[:1], 1)[:, -2]
  best = optimize.minimize_scalar(lambda s: _nll64(one, one_label, 1.0 / s),
                                  bounds=(1 / 20.0, 1 / 0.05), method="bounded",
                                  options={"xatol": 1e-10})
  assert posthoc.fit_temperature(one, one_label) == pytest.approx(1.0 / best.x, rel=1e-5)
  # A -inf logit off the label is a class of probability 0: the other rows are unaffected.
  off = z.copy()
  row = int(np.flatnonzero(labels != 2)[0])
  off[row, 2] = -np.inf
  t_off = posthoc.fit_temperature(off, labels)
  assert 0.2 < t_off < 15 and np.isfinite(_nll64(off, labels, t_off))
  # NaN or infinite NLLs (a NaN, a +inf, a -inf at the label) give T_min, as before.
  for value, col in ((np.nan, 2), (np.inf, 2), (-np.inf, labels[row])):
    bad = z.copy()
    bad[row, col] = value
    assert posthoc.fit_temperature(bad, labels) == pytest.approx(0.05, rel=1e-6)


def test_select_pnorm_picks_the_lowest_aurc_or_falls_back_to_msp():
  # An LS-like model: wrong predictions have a *larger* max logit at the same MSP, which
  # p-norm normalisation exploits (LS-vs-SC §4.1).
  rng = np.random.default_rng(4)
  n, c = 600, 10
  z = rng.normal(size=(n, c)).astype(np.float32)
  labels = z.argmax(1)
  wrong = rng.random(n) < 0.3
  labels = np.where(wrong, (labels + 1) % c, labels)
  z = z + np.where(wrong, 6.0, 0.0)[:, None].astype(np.float32)  # shift: same MSP
  ps = [1, 2, 3]
  correct = z.argmax(1) == labels
  ref = {p: _np_aurc(np.asarray(posthoc.max_logit_pnorm(z, p, center=False)), correct)
         for p in ps}
  ref["msp"] = _np_aurc(_np_softmax(z).max(1).astype(np.float32), correct)
  chosen = posthoc.select_pnorm(z, labels, ps, center=False)
  best = min(ps, key=ref.get)
  assert ref[best] < ref["msp"]
  assert chosen == best
  aurcs = posthoc.pnorm_aurcs(z, labels, ps, center=False)
  for key in ref:
    np.testing.assert_allclose(aurcs[key], ref[key], atol=1e-6)
  # A CE-like model whose errors carry no max-logit signal: MSP wins -> None.
  z_ce, _ = _logits(5, n=600, c=10)
  labels_ce = np.where(_np_softmax(z_ce).max(1) > rng.random(600), z_ce.argmax(1),
                       (z_ce.argmax(1) + 1) % 10)
  perfect = z_ce.copy()
  perfect[np.arange(600), z_ce.argmax(1)] += np.where(labels_ce == z_ce.argmax(1), 50.0, 0.0)
  # MSP ranks every error last here, so no p can beat it.
  assert posthoc.select_pnorm(perfect, labels_ce, ps) is None
  with pytest.raises(ValueError, match="at least one"):
    posthoc.select_pnorm(z, labels, [])
