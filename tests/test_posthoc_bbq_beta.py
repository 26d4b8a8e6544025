"""Top-label BBQ and beta calibration (`fit_calibrator("bbq" | "beta")`) and the adaptive ECE's
norms, against direct numpy/scipy transcriptions and a stored netcal case."""
import math
import os

import jax
import numpy as np
import pytest
from scipy import optimize, special

from calib_jax import metrics
from calib_jax import posthoc
from calib_jax.posthoc import bbq, beta

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "netcal_bbq_beta.npz")
N, C = 400, 4


def _softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _overconfident(seed, n=N, c=C):
  """Labels drawn from softmax(z / 2.5): the logits z are overconfident."""
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(n, c)) * 3).astype(np.float32)
  labels = (_softmax(z / 2.5).cumsum(1) > rng.random((n, 1))).argmax(1)
  return z, labels


def _binary_logits(confidence, correct):
  """Two-class logits whose top-label confidence is `confidence` (class 1 on top in even rows,
  class 0 in odd ones) and labels that make the top prediction right where `correct`."""
  confidence = np.asarray(confidence, np.float64)
  logit = np.log(confidence / (1 - confidence))
  top = (np.arange(len(confidence)) % 2 == 0).astype(int)
  z = np.where(top[:, None] == 1, np.stack([np.zeros_like(logit), logit], 1),
               np.stack([logit, np.zeros_like(logit)], 1))
  return z.astype(np.float32), np.where(correct, top, 1 - top)


@pytest.fixture(scope="module")
def fitted():
  z, labels = _overconfident(0, n=2 * N)
  return z, labels, {name: posthoc.fit_calibrator(name, z[:N], labels[:N])
                     for name in ("bbq", "beta")}


def test_bbq_and_beta_reduce_the_ece_and_keep_predictions(fitted):
  z, labels, calibrators = fitted
  test_z, test_labels = z[N:], labels[N:]
  raw = np.asarray(jax.nn.softmax(test_z))
  before = float(metrics.ece(raw, test_labels))
  assert before > 0.15  # overconfident to begin with
  for name, cal in calibrators.items():
    q = np.asarray(cal(test_z))
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-5)
    assert np.array_equal(q.argmax(1), raw.argmax(1)), name
    assert float(metrics.ece(q, test_labels)) < before / 2, name
    np.testing.assert_allclose(jax.jit(lambda c, x: c(x))(cal, test_z), q, atol=1e-6)
  assert 0 < len(calibrators["bbq"].model_weights) <= int(calibrators["bbq"].num_models)
  np.testing.assert_allclose(float(np.sum(calibrators["bbq"].model_weights)), 1.0, atol=1e-6)


def _np_log_loss(theta, features, targets):
  logit = features @ theta[:-1] + theta[-1]
  return np.mean(np.logaddexp(0, logit) - targets * logit)


def test_beta_recovers_the_map_it_was_drawn_from():
  rng = np.random.default_rng(3)
  n, truth = 20000, np.array([1.8, 0.6, -0.4])  # a, b, c
  conf = rng.uniform(0.5, 0.999, n)
  features = np.stack([np.log(conf), -np.log1p(-conf)], 1)
  correct = rng.random(n) < special.expit(features @ truth[:2] + truth[2])
  z, labels = _binary_logits(conf, correct)
  cal = posthoc.fit_calibrator("beta", z, labels)
  fit = np.array([float(cal.a), float(cal.b), float(cal.c)])
  # The maximum-likelihood estimate itself (scipy, float64, on the float32 confidences) ...
  s = np.asarray(jax.nn.softmax(z)).max(1).astype(np.float64)
  feats = np.stack([np.log(s), -np.log1p(-s)], 1)
  mle = optimize.minimize(_np_log_loss, np.zeros(3), args=(feats, correct), method="BFGS",
                          options={"gtol": 1e-10}).x
  np.testing.assert_allclose(fit, mle, atol=2e-4)
  # ... is within 4 standard errors (inverse Fisher information) of the truth.
  design = np.concatenate([feats, np.ones((n, 1))], 1)
  p = special.expit(design @ mle)
  stderr = np.sqrt(np.diag(np.linalg.inv((design * (p * (1 - p))[:, None]).T @ design)))
  assert np.all(np.abs(fit - truth) < 4 * stderr), (fit, truth, stderr)


def test_beta_refits_without_a_negative_parameter():
  rng = np.random.default_rng(4)
  s = rng.uniform(0.05, 0.95, 3000)
  features = np.stack([np.log(s), -np.log1p(-s)], 1)
  targets = (rng.random(3000) < special.expit(features @ [-0.6, 1.5] + 0.2)).astype(float)
  fit = beta.fit_beta_scores(s, targets)
  assert fit["a"] == 0.0 and fit["b"] > 0  # unconstrained, a < 0: refit on -ln(1 - s) alone
  one = optimize.minimize(_np_log_loss, np.zeros(2), args=(features[:, 1:], targets),
                          method="BFGS", options={"gtol": 1e-10}).x
  np.testing.assert_allclose([fit["b"], fit["c"]], one, atol=1e-5)
  mapped = np.asarray(beta.beta_map(jax.numpy.asarray(np.sort(s), jax.numpy.float32),
                                    fit["a"], fit["b"], fit["c"]))
  assert np.all(np.diff(mapped) >= 0)


def _np_bbq(conf, correct, bin_factor=10.0, prior_strength=2.0):
  """BBQ transcribed from the paper with loops: (weights, predict)."""
  n = len(conf)
  low = max(1, math.floor(n ** (1 / 3) / bin_factor))
  high = min(math.ceil(n / 5), math.ceil(bin_factor * n ** (1 / 3)))
  models, log_scores = [], []
  for num_bins in range(low, high + 1):
    edges = np.quantile(conf, np.linspace(0, 1, num_bins + 1))
    edges[0], edges[-1] = 0.0, 1.0
    members = [[i for i in range(n) if edges[b] < conf[i] <= edges[b + 1]]
               for b in range(num_bins)]
    log_score = 0.0
    values = []
    for b, rows in enumerate(members):
      p_b = (edges[b] + edges[b + 1]) / 2
      alpha, beta_ = prior_strength / num_bins * p_b, prior_strength / num_bins * (1 - p_b)
      m = sum(correct[i] for i in rows)
      k = len(rows) - m
      log_score += (math.lgamma(prior_strength / num_bins)
                    - math.lgamma(len(rows) + prior_strength / num_bins)
                    + math.lgamma(m + alpha) - math.lgamma(alpha)
                    + math.lgamma(k + beta_) - math.lgamma(beta_))
      values.append(m / len(rows) if rows else p_b)
    models.append((edges, values))
    log_scores.append(log_score)
  weights = np.exp(np.array(log_scores) - max(log_scores))
  weights /= weights.sum()

  def predict(s):
    out = 0.0
    for w, (edges, values) in zip(weights, models):
      b = next((b for b in range(len(values)) if s <= edges[b + 1]), len(values) - 1)
      out += w * values[b]
    return out
  return weights, predict


def test_bbq_model_weights_and_predictions_match_the_paper_transcription():
  conf = np.array([0.52, 0.55, 0.58, 0.61, 0.64, 0.7, 0.74, 0.79, 0.83, 0.88, 0.93, 0.97,
                   0.6, 0.9, 0.66])
  correct = np.array([0, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1], bool)
  z, labels = _binary_logits(conf, correct)
  cal = posthoc.fit_calibrator("bbq", z, labels)
  seen = np.asarray(jax.nn.softmax(z)).max(1).astype(np.float64)  # the float32 confidences
  weights, predict = _np_bbq(seen, correct)
  assert len(weights) == 3 and int(cal.num_models) == 3  # B = 1, 2, 3 for N = 15
  np.testing.assert_allclose(cal.model_weights, weights, rtol=1e-5)
  np.testing.assert_allclose(bbq.binning_models(seen, correct)["weights"], weights, rtol=1e-6)
  new_top = np.asarray(cal(z)).max(1)
  ref = np.maximum([predict(s) for s in seen], 0.5 + 2.0 ** -20)  # the top class stays on top
  np.testing.assert_allclose(new_top, ref, atol=2e-6)
  # Another prior strength moves the weights as the transcription says.
  weights_10, _ = _np_bbq(seen, correct, prior_strength=10.0)
  cal_10 = posthoc.fit_calibrator("bbq", z, labels, equivalent_sample_size=10.0)
  np.testing.assert_allclose(cal_10.model_weights, weights_10, rtol=1e-5)


def test_against_the_stored_netcal_case():
  """netcal 1.4 (crosscheck/calibrators.py --fixture): its BetaCalibration is the same MLE;
  its BBQ is another method (BIC-weighted equal-width binnings), so only a loose bound."""
  case = np.load(FIXTURE)
  test_z = case["test_logits"]
  top = _softmax(test_z).argmax(1)
  cal = posthoc.fit_calibrator("beta", case["logits"], case["labels"])
  ours = np.asarray(cal(test_z))[np.arange(len(test_z)), top]
  free = case["netcal_beta"] > 0.5 + 1e-3  # C = 5: no sample's floor binds above 1/2
  np.testing.assert_allclose(ours[free], case["netcal_beta"][free], atol=5e-5)
  np.testing.assert_allclose([float(cal.a), float(cal.b), float(cal.c)],
                             np.concatenate([case["netcal_beta_weights"],
                                             case["netcal_beta_intercept"]]), atol=5e-4)
  cal = posthoc.fit_calibrator("bbq", case["logits"], case["labels"])
  ours = np.asarray(cal(test_z))[np.arange(len(test_z)), top]
  assert np.mean(np.abs(ours - case["netcal_bbq"])) < 0.1


def test_one_line_errors(fitted):
  z, labels, _ = fitted
  conf = np.linspace(0.55, 0.95, 40)
  cases = [
      (lambda: posthoc.fit_calibrator("bbq", z[:50], np.full(50, 2)),
       r"^BBQ needs held-out labels of at least two classes; every one of the 50 valid labels "
       r"is 2\.$"),
      (lambda: posthoc.fit_calibrator("beta", z[:50], np.full(50, 1)), "at least two classes"),
      (lambda: posthoc.fit_calibrator("beta", *_binary_logits(conf, np.ones(40, bool))),
       "needs both correct and wrong top-label predictions.*all 40 are correct"),
      (lambda: posthoc.fit_calibrator("bbq", *_binary_logits(conf, np.zeros(40, bool))),
       "all 40 are wrong"),
      (lambda: posthoc.fit_calibrator("bbq", z[:50], labels[:50], mask=np.zeros(50, bool)),
       "mask selects no entries"),
      (lambda: posthoc.fit_calibrator("bbq", z[:50], labels[:50], num_bins=5),
       "no option 'num_bins'; valid options: bin_factor, equivalent_sample_size"),
      (lambda: posthoc.fit_calibrator("bbq", z[:50], labels[:50], bin_factor=0),
       "bin_factor must be a positive"),
      (lambda: posthoc.fit_calibrator("beta", z[:20], labels[:20]),
       "beta calibration has 3 free parameters but only 20"),
      (lambda: posthoc.fit_calibrator("beta", z[:50], labels[:50], max_iter=0), "max_iter"),
      (lambda: metrics.aece(np.full((4, 2), 0.5), np.zeros(4, int), 2, norm="L2"),
       "norm must be one of l1, l2, max; got 'L2'"),
  ]
  for call, message in cases:
    with pytest.raises(ValueError, match=message) as e:
      call()
    assert "\n" not in str(e.value), str(e.value)


def test_adaptive_ece_norms_by_hand():
  # Sorted confidences in three groups of two: gaps 0.075, 0.25, 0.425 (accuracies ½, 1, ½).
  conf = np.array([0.9, 0.55, 0.8, 0.95, 0.6, 0.7], np.float32)
  correct = np.array([0, 1, 1, 1, 0, 1], bool)
  probs = np.stack([conf, 1 - conf], 1)
  labels = np.where(correct, 0, 1)
  gaps = np.array([0.075, 0.25, 0.425])
  expected = {"l1": gaps.mean(), "l2": np.sqrt(np.mean(gaps ** 2)), "max": 0.425}
  for norm, value in expected.items():
    np.testing.assert_allclose(metrics.aece(probs, labels, 3, norm=norm), value, atol=1e-6)
  np.testing.assert_allclose(metrics.aece(probs, labels, 3), expected["l1"], atol=1e-6)
  # A mask drops samples before grouping: the 0.9 and 0.95 ones leave two groups of two.
  mask = conf < 0.85
  sub = {"l1": (0.075 + 0.25) / 2, "l2": np.sqrt((0.075 ** 2 + 0.25 ** 2) / 2), "max": 0.25}
  for norm, value in sub.items():
    np.testing.assert_allclose(metrics.aece(probs, labels, 2, mask, norm=norm), value,
                               atol=1e-6)
  # Fewer valid samples than bins: the empty groups add nothing and are not maxed over.
  two = conf < 0.65
  np.testing.assert_allclose(metrics.aece(probs, labels, 3, two, norm="max"), 0.6, atol=1e-6)
  np.testing.assert_allclose(metrics.aece(probs, labels, 3, two, norm="l2"),
                             np.sqrt((0.45 ** 2 + 0.6 ** 2) / 2), atol=1e-6)
