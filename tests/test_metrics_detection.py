"""Failure / OOD detection metrics against scikit-learn (a core dependency) and a numpy
transcription, with ties, masks, jit and bad input."""
import jax
import numpy as np
import pytest
from sklearn import metrics as skm

from calib_jax import metrics


def _data(n, seed, decimals=None):
  rng = np.random.default_rng(seed)
  positives = rng.random(n) < 0.3
  scores = rng.normal(size=n) - 1.2 * positives     # positives score lower
  if decimals is not None:
    scores = np.round(scores, decimals)               # many tie groups mixing both classes
  return scores.astype(np.float32), positives


def np_fpr_at_tpr(scores, positives, tpr):
  fpr, rates, _ = skm.roc_curve(positives, -scores.astype(np.float64), drop_intermediate=False)
  return fpr[np.argmax(rates >= tpr)]


@pytest.mark.parametrize("decimals", [None, 1, 0])
def test_match_sklearn_with_and_without_ties(decimals):
  scores, positives = _data(3000, 0, decimals)
  neg = -scores.astype(np.float64)
  np.testing.assert_allclose(metrics.auroc(scores, positives),
                             skm.roc_auc_score(positives, neg), rtol=1e-5)
  np.testing.assert_allclose(metrics.aupr(scores, positives),
                             skm.average_precision_score(positives, neg), rtol=1e-5)
  for tpr in (0.5, 0.95, 1.0):
    np.testing.assert_allclose(metrics.fpr_at_tpr(scores, positives, tpr),
                               np_fpr_at_tpr(scores, positives, tpr), rtol=1e-6)


def test_auroc_is_the_pairwise_probability():
  scores, positives = _data(400, 1, decimals=1)
  s_pos, s_neg = scores[positives][:, None], scores[~positives][None, :]
  want = np.mean((s_neg > s_pos) + 0.5 * (s_neg == s_pos))
  np.testing.assert_allclose(metrics.auroc(scores, positives), want, rtol=1e-5)


def test_perfect_and_constant_scores():
  positives = np.arange(100) < 30
  perfect = np.where(positives, 0.1, 0.9)
  assert float(metrics.auroc(perfect, positives)) == 1.0
  assert float(metrics.aupr(perfect, positives)) == 1.0
  assert float(metrics.fpr_at_tpr(perfect, positives)) == 0.0
  constant = np.ones(100)   # one tie group: AUROC ½, AP = positive rate, everything flagged
  assert float(metrics.auroc(constant, positives)) == 0.5
  np.testing.assert_allclose(metrics.aupr(constant, positives), 0.3, rtol=1e-6)
  assert float(metrics.fpr_at_tpr(constant, positives)) == 1.0


def test_failure_detection_convention():
  """Wrong predictions are the positives; the MSP ranks them low."""
  rng = np.random.default_rng(2)
  conf = rng.uniform(0.3, 1.0, 2000).astype(np.float32)
  correct = rng.random(2000) < conf
  value = float(metrics.auroc(conf, ~correct))
  np.testing.assert_allclose(value, skm.roc_auc_score(correct, conf), rtol=1e-5)
  assert value > 0.6


def test_mask_jit_and_leading_dims():
  scores, positives = _data(1200, 3, decimals=1)
  mask = np.arange(1200) % 5 != 0
  for fn in (metrics.auroc, metrics.aupr, metrics.fpr_at_tpr):
    want = fn(scores[mask], positives[mask])
    np.testing.assert_allclose(fn(scores, positives, mask=mask), want, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(metrics.auroc)(scores, positives, mask=mask),
                             metrics.auroc(scores, positives, mask=mask), rtol=1e-6)
  np.testing.assert_allclose(metrics.aupr(scores.reshape(40, 30), positives.reshape(40, 30)),
                             metrics.aupr(scores, positives), rtol=1e-6)


def test_bad_input():
  scores, positives = _data(50, 4)
  with pytest.raises(ValueError, match="both classes"):
    metrics.auroc(scores, np.zeros(50, bool))
  with pytest.raises(ValueError, match="both classes"):
    metrics.aupr(scores, positives, mask=~positives)
  with pytest.raises(ValueError, match="positives shape"):
    metrics.auroc(scores, positives[:10])
  with pytest.raises(ValueError, match="tpr must be in"):
    metrics.fpr_at_tpr(scores, positives, tpr=0.0)
  with pytest.raises(ValueError, match="bool"):
    metrics.auroc(scores, positives.astype(np.float32))
