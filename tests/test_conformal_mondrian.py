"""calib_jax.conformal: class-conditional (Mondrian) thresholds and SAPS scores against numpy
transcriptions of their definitions, a hand-made rank example, the marginal and per-class
coverage guarantees over random splits, jit, and one-line errors."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import conformal
from calib_jax.conformal import predictor as predictor_lib

C = 4


def _np_softmax(logits):
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return (z / z.sum(-1, keepdims=True)).astype(np.float32)


def _data(seed: int, n: int):
  """Logits whose labels come from their softmax, except class 3: a third of the samples are
  relabelled 3 whatever their logits say. The model misses class 3 often, so one marginal
  threshold under-covers class 3 and over-covers the others."""
  rng = np.random.default_rng(seed)
  logits = (2.0 * rng.normal(size=(n, C))).astype(np.float32)
  cdf = np.cumsum(_np_softmax(logits).astype(np.float64), -1)
  labels = (rng.uniform(size=(n, 1)) > cdf / cdf[:, -1:]).sum(-1).clip(0, C - 1)
  labels = np.where(rng.uniform(size=n) < 1 / 3, C - 1, labels).astype(np.int32)
  return logits, labels


LOGITS, LABELS = _data(0, 600)
CAL, TEST = slice(0, 300), slice(300, 600)


# --------------------------------------------------------------------------- numpy references


def np_saps(probs, u=None, lam=0.2):
  """Per sample, with the classes ranked by descending p (ties: lower index first): the class at
  rank o = 1 scores u·p_max, at rank o ≥ 2 it scores p_max + (o − 2 + u)·λ; u = 1 if not given
  (Huang et al. 2024)."""
  probs = np.asarray(probs, np.float64)
  out = np.zeros_like(probs)
  for i, p in enumerate(probs):
    ui = 1.0 if u is None else float(u[i])
    for o, c in enumerate(np.argsort(-p, kind="stable"), start=1):
      out[i, c] = ui * p.max() if o == 1 else p.max() + (o - 2 + ui) * lam
  return out


def np_class_quantiles(scores, labels, num_classes, alpha):
  """Class k: the ⌈(n_k + 1)(1 − α)⌉-th smallest of its n_k scores (inf when that exceeds n_k)."""
  out = []
  for k in range(num_classes):
    s = np.sort(scores[labels == k])
    rank = math.ceil((len(s) + 1) * (1 - alpha))
    out.append(np.inf if rank > len(s) else s[rank - 1])
  return np.asarray(out)


# --------------------------------------------------------------------------- SAPS scores


def test_saps_scores_match_the_formula_for_fixed_u():
  probs = _np_softmax(LOGITS[:64])
  u = np.random.default_rng(1).uniform(size=64).astype(np.float32)
  for lam in (0.2, 0.05):
    np.testing.assert_allclose(conformal.saps_scores(jnp.asarray(probs), jnp.asarray(u), lam),
                               np_saps(probs, u, lam), atol=1e-6)
  np.testing.assert_allclose(conformal.saps_scores(jnp.asarray(probs)), np_saps(probs),
                             atol=1e-6)
  ties = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4]], np.float32)
  np.testing.assert_allclose(conformal.saps_scores(jnp.asarray(ties), jnp.asarray([0.3, 0.6])),
                             np_saps(ties, [0.3, 0.6]), atol=1e-7)


@pytest.mark.parametrize("randomized", [False, True])
def test_saps_fit_matches_numpy_pipeline(randomized):
  key, test_key = jax.random.key(7), jax.random.key(8)
  p = conformal.fit("saps", LOGITS[CAL], LABELS[CAL], 0.1, key=key, randomized=randomized)
  assert (p.name, p.lam, p.randomized) == ("saps", 0.2, randomized)
  probs = _np_softmax(LOGITS)
  u_cal = np.asarray(jax.random.uniform(key, (300,))) if randomized else None
  cal = np_saps(probs[CAL], u_cal)[np.arange(300), LABELS[CAL]]
  k = math.ceil(301 * 0.9)
  assert abs(float(p.qhat) - np.sort(cal)[k - 1]) < 1e-5
  u_test = np.asarray(jax.random.uniform(test_key, (300,))) if randomized else None
  expected = np_saps(probs[TEST], u_test) <= float(p.qhat)
  assert (np.asarray(p(LOGITS[TEST], key=test_key)) != expected).sum() <= 1


def test_saps_sets_are_prefixes_and_nested_in_alpha():
  fits = [conformal.fit("saps", LOGITS[CAL], LABELS[CAL], a, lam=0.1) for a in (0.3, 0.1)]
  sets = [np.asarray(f(LOGITS[TEST])) for f in fits]
  order = np.argsort(-LOGITS[TEST], axis=-1, kind="stable")
  for s in sets:  # a class is in only if every more probable class is
    assert (np.diff(np.take_along_axis(s, order, -1).astype(int), axis=-1) <= 0).all()
  assert (sets[0] <= sets[1]).all() and sets[0].sum() < sets[1].sum()


# --------------------------------------------------------------------------- Mondrian thresholds


def test_class_thresholds_on_a_hand_made_example():
  """THR on given probabilities: class 0's 9 scores 0.1, ..., 0.9 and class 2's 10 scores 0.05,
  ..., 0.50. At α = 0.1 class 0's rank is ⌈10·0.9⌉ = 9 (its largest score, 0.9) and class 2's
  ⌈11·0.9⌉ = 10 (0.50, its largest); at α = 0.2 they are ⌈8.0⌉ = 8 (0.8) and ⌈8.8⌉ = 9 (0.45).
  Class 1 has no sample, so it gets +inf from `class_conditional_quantile` and `fit` refuses."""
  s0, s2 = np.arange(1, 10) / 10, np.arange(1, 11) / 20
  labels = np.array([0] * 9 + [2] * 10, np.int32)
  scores = np.concatenate([s0, s2]).astype(np.float32)
  perm = np.random.default_rng(0).permutation(19)  # order does not matter
  for alpha, expected in ((0.1, [0.9, np.inf, 0.5]), (0.2, [0.8, np.inf, 0.45])):
    got = conformal.class_conditional_quantile(jnp.asarray(scores[perm]),
                                               jnp.asarray(labels[perm]), 3, alpha)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
  # The same through fit: THR on probabilities whose label's p is 1 − score, and class 1 given
  # 9 samples with p_1 = 0.7 (score 0.3, its 8th smallest at α = 0.2).
  probs = np.zeros((28, 3), np.float32)
  probs[np.arange(19), labels] = 1.0 - scores
  probs[np.arange(19), 1] = scores
  probs[19:] = [0.3, 0.7, 0.0]
  labels = np.concatenate([labels, np.ones(9, np.int32)])
  p = conformal.fit("thr", probs, labels, 0.2, conditional="class", from_logits=False)
  np.testing.assert_allclose(p.qhat, [0.8, 0.3, 0.45], atol=1e-6)
  assert p.qhat.shape == (3,) and p.conditional == "class"
  # Label k is in the set when 1 − p_k ≤ q̂_k: scores [0.7, 0.25, 0.95] and [0.85, 0.75, 0.4].
  sets = p(np.array([[0.3, 0.75, 0.05], [0.15, 0.25, 0.6]], np.float32))
  np.testing.assert_array_equal(sets, [[True, True, False], [False, False, True]])


@pytest.mark.parametrize("name", ["thr", "aps", "saps"])
def test_class_thresholds_match_numpy_per_class(name):
  key = jax.random.key(3)
  p = conformal.fit(name, LOGITS[CAL], LABELS[CAL], 0.1, conditional="class", key=key)
  marginal = conformal.fit(name, LOGITS[CAL], LABELS[CAL], 0.1, key=key)
  cal_scores = np.asarray(marginal.scores(LOGITS[CAL], key=key))[np.arange(300), LABELS[CAL]]
  np.testing.assert_allclose(p.qhat, np_class_quantiles(cal_scores, LABELS[CAL], C, 0.1),
                             atol=1e-6)
  test_key = jax.random.key(4)
  test_scores = np.asarray(p.scores(LOGITS[TEST], key=test_key))
  np.testing.assert_array_equal(p(LOGITS[TEST], key=test_key),
                                test_scores <= np.asarray(p.qhat)[None, :])


def test_class_mask_equals_the_subset():
  mask = np.random.default_rng(5).uniform(size=300) < 0.7
  a = conformal.fit("thr", LOGITS[CAL], LABELS[CAL], 0.1, conditional="class", mask=mask)
  b = conformal.fit("thr", LOGITS[CAL][mask], LABELS[CAL][mask], 0.1, conditional="class")
  np.testing.assert_allclose(a.qhat, b.qhat, atol=1e-6)


# --------------------------------------------------------------------------- coverage


def test_marginal_and_per_class_coverage_over_random_splits():
  """Over random calibration/test splits of a fixed data set (exchangeable), every method covers
  1 − α on average, and the Mondrian versions cover 1 − α within every class (E = k_k/(n_k + 1)
  ≥ 1 − α), where the marginal threshold leaves class 3 well below it. 200 splits of 300
  calibration samples (about 110 of class 3) put the Monte Carlo error of a class's mean near
  0.002, a quarter of the tolerance."""
  logits, labels = map(jnp.asarray, _data(1, 900))
  n, alpha, splits, methods = 300, 0.1, 200, ("thr", "aps", "saps")

  def one_split(key):
    perm_key, cal_key, test_key = jax.random.split(key, 3)
    perm = jax.random.permutation(perm_key, labels.shape[0])
    cal, test = perm[:n], perm[n:]
    out = []
    for name in methods:
      for conditional in (None, "class"):
        p = conformal.fit(name, logits[cal], labels[cal], alpha, conditional=conditional,
                          key=cal_key)
        sets = p(logits[test], key=test_key)
        out.append((conformal.coverage(sets, labels[test]),
                    conformal.class_conditional_coverage(sets, labels[test]).coverage))
    return out

  results = jax.jit(jax.vmap(one_split))(jax.random.split(jax.random.key(0), splits))
  tol = 0.008
  for i, name in enumerate(methods):
    (marginal, marginal_classes), (mondrian, mondrian_classes) = results[2 * i:2 * i + 2]
    assert float(jnp.mean(marginal)) >= 1 - alpha - tol, name
    assert float(jnp.mean(marginal)) <= 1 - alpha + 1 / (n + 1) + tol, name
    assert float(jnp.mean(mondrian)) >= 1 - alpha - tol, name
    per_class = np.asarray(jnp.mean(mondrian_classes, 0))
    assert per_class.min() >= 1 - alpha - tol, (name, per_class)
    assert float(jnp.mean(marginal_classes, 0)[C - 1]) < 1 - alpha - 0.05, name


# --------------------------------------------------------------------------- jit, errors


def test_jit_and_a_traced_class_with_too_few_samples():
  p = conformal.fit("saps", LOGITS[CAL], LABELS[CAL], 0.1, conditional="class")
  key = jax.random.key(2)
  np.testing.assert_array_equal(jax.jit(lambda pr, x, k: pr(x, key=k))(p, LOGITS[TEST], key),
                                p(LOGITS[TEST], key=key))
  fit_jit = jax.jit(conformal.fit, static_argnames=("name", "alpha", "conditional"))
  q = fit_jit("saps", LOGITS[CAL], LABELS[CAL], alpha=0.1, conditional="class").qhat
  np.testing.assert_array_equal(q, p.qhat)
  # Under jit a mask that leaves class 0 with 2 samples gives q̂_0 = inf: class 0 in every set.
  few = jnp.asarray((LABELS[CAL] != 0) | (np.cumsum(LABELS[CAL] == 0) <= 2))
  thr = jax.jit(lambda m: conformal.fit("thr", LOGITS[CAL], LABELS[CAL], 0.1, mask=m,
                                        conditional="class"))(few)
  assert float(thr.qhat[0]) == np.inf and np.isfinite(np.asarray(thr.qhat[1:])).all()
  assert np.asarray(thr(LOGITS[TEST]))[:, 0].all()


def _raises(match, fn, *args, **kw):
  with pytest.raises(ValueError, match=match) as info:
    fn(*args, **kw)
  assert "\n" not in str(info.value)


def test_bad_input_gives_one_line_errors():
  fit, logits, labels = conformal.fit, LOGITS[CAL], LABELS[CAL]
  for bad in ("classes", "Class", "marginal", ["class"], 1, True):
    _raises(r"^unknown conditional .*; valid: None \(one marginal threshold\) or 'class'", fit,
            "thr", logits, labels, conditional=bad)
  # 40 samples: class 3 (the relabelled one) has enough for α = 0.1 (9), the others fewer.
  counts = np.bincount(labels[:40], minlength=C)
  fewest = int(np.argmin(counts))
  short = [k for k in range(C) if counts[k] < 9]
  _raises(rf"^class {fewest} has {counts[fewest]} calibration samples, too few for "
          rf"conditional='class' at alpha=0.1: each class needs n_k >= 9 .*; {len(short)} of "
          rf"{C} classes have fewer \({', '.join(map(str, short))}\)\.$",
          fit, "aps", logits[:40], labels[:40], 0.1, conditional="class")
  assert conformal.fit("thr", logits[:40], labels[:40], 0.1).qhat.shape == ()  # marginal: fine
  _raises(r"class 1 has 0 calibration samples", fit, "thr", logits, labels, 0.1,
          conditional="class", mask=labels != 1)
  _raises(r"lam \(the SAPS rank weight\) must be a float > 0, got 0", fit, "saps", logits,
          labels, lam=0.0)
  _raises(r"lam must be a float >= 0", fit, "saps", logits, labels, lam=-0.1)
  _raises(r"unknown argument\(s\) \['k_reg'\] for 'saps'; valid", fit, "saps", logits, labels,
          k_reg=2)
  assert conformal.names() == ["thr", "aps", "raps", "saps"]


def test_scores_in_row_blocks_equal_the_formulas(monkeypatch):
  """Large splits are scored in blocks of rows (bounded memory); with blocks of 64 rows (300
  rows: 5 blocks, the last padded) every score, threshold and set is the formula's."""
  monkeypatch.setattr(predictor_lib, "_BLOCK_ROWS", 64)
  logits, labels = LOGITS[:, :3], np.minimum(LABELS, 2)  # a shape no other test compiles
  probs, key, test_key = _np_softmax(logits), jax.random.key(5), jax.random.key(6)
  p = conformal.fit("saps", logits[CAL], labels[CAL], 0.1, key=key, conditional="class")
  u_cal = np.asarray(jax.random.uniform(key, (300,)))
  cal = np_saps(probs[CAL], u_cal)[np.arange(300), labels[CAL]]
  np.testing.assert_allclose(p.qhat, np_class_quantiles(cal, labels[CAL], 3, 0.1), atol=1e-6)
  u_test = np.asarray(jax.random.uniform(test_key, (300,)))
  np.testing.assert_allclose(p.scores(logits[TEST], key=test_key), np_saps(probs[TEST], u_test),
                             atol=1e-6)
  expected = np_saps(probs[TEST], u_test) <= np.asarray(p.qhat)[None]
  assert (np.asarray(p(logits[TEST], key=test_key)) != expected).sum() <= 1
