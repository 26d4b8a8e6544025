"""calib_jax.conformal: scores and quantile against numpy transcriptions written here, the
split-conformal coverage guarantee on exchangeable data, structural properties of the sets,
jit/vmap, masks, the set metrics, and one-line errors for bad input."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import conformal

C = 10


def _data(seed: int, n: int, num_classes: int = C, sharpness: float = 2.0):
  """Random logits and labels drawn from their own softmax (continuous scores, no ties)."""
  rng = np.random.default_rng(seed)
  logits = (sharpness * rng.normal(size=(n, num_classes))).astype(np.float32)
  probs = np.exp(logits - logits.max(-1, keepdims=True).astype(np.float64))
  cdf = np.cumsum(probs / probs.sum(-1, keepdims=True), axis=-1)
  labels = (rng.uniform(size=(n, 1)) > cdf).sum(-1).clip(0, num_classes - 1).astype(np.int32)
  return logits, labels


# One calibration/test pair shared by most tests (the same shapes reuse compiled programs).
LOGITS, LABELS = _data(2, 600)
CAL, TEST = slice(0, 300), slice(300, 600)


def _np_softmax(logits):
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return (z / z.sum(-1, keepdims=True)).astype(np.float32)


# --------------------------------------------------------------------------- numpy references


def np_raps(probs, u=None, lam=0.0, k_reg=0):
  """Per sample: rank classes by descending p (ties: lower index first); the score of the class
  at 1-based rank r is Σ_{j<r} p_(j) + u p_(r) + λ max(0, r − k_reg); u = 1 if not given."""
  probs = np.asarray(probs, np.float64)
  out = np.zeros_like(probs)
  for i, p in enumerate(probs):
    order = np.argsort(-p, kind="stable")
    above = 0.0
    for r, c in enumerate(order, start=1):
      ui = 1.0 if u is None else float(u[i])
      out[i, c] = above + ui * p[c] + lam * max(0, r - k_reg)
      above += p[c]
  return out


def np_quantile(scores, alpha):
  """k-th smallest, k = ceil((n+1)(1-alpha)), straight from the split-conformal definition."""
  n = len(scores)
  k = math.ceil((n + 1) * (1 - alpha))
  return np.inf if k > n else np.sort(scores)[k - 1]


# --------------------------------------------------------------------------- scores, quantile


def test_scores_match_numpy_transcriptions():
  logits, _ = _data(0, 64)
  probs = _np_softmax(logits)
  u = np.random.default_rng(1).uniform(size=64).astype(np.float32)
  np.testing.assert_allclose(conformal.thr_scores(jnp.asarray(probs)), 1.0 - probs, atol=1e-7)
  np.testing.assert_allclose(conformal.aps_scores(jnp.asarray(probs)), np_raps(probs), atol=1e-6)
  np.testing.assert_allclose(conformal.aps_scores(jnp.asarray(probs), jnp.asarray(u)),
                             np_raps(probs, u), atol=1e-6)
  np.testing.assert_allclose(conformal.raps_scores(jnp.asarray(probs), jnp.asarray(u), 0.3, 2),
                             np_raps(probs, u, 0.3, 2), atol=1e-6)
  np.testing.assert_allclose(conformal.raps_scores(jnp.asarray(probs), None, 0.05, 0),
                             np_raps(probs, None, 0.05, 0), atol=1e-6)


def test_tied_probabilities_are_ranked_by_class_index():
  probs = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4]], np.float32)
  np.testing.assert_allclose(conformal.aps_scores(jnp.asarray(probs)), np_raps(probs), atol=1e-7)


@pytest.mark.parametrize("n,alpha", [(10, 0.2), (999, 0.1), (1000, 0.1), (19, 0.05), (50, 0.33)])
def test_quantile_is_the_kth_smallest(n, alpha):
  scores = np.random.default_rng(n).uniform(size=n).astype(np.float32)
  expected = np_quantile(scores, alpha)
  assert float(conformal.conformal_quantile(jnp.asarray(scores), alpha)) == expected
  assert expected == np.quantile(scores, math.ceil((n + 1) * (1 - alpha)) / n,
                                 method="inverted_cdf")
  # With a mask: the same as the selected scores alone, also with the mask traced under jit.
  mask = np.random.default_rng(n + 1).uniform(size=n) < 0.7
  if conformal.quantile_rank(int(mask.sum()), alpha) <= mask.sum():
    q = jax.jit(conformal.conformal_quantile, static_argnums=1)(jnp.asarray(scores), alpha,
                                                                  jnp.asarray(mask))
    assert float(q) == np_quantile(scores[mask], alpha)


def test_min_calibration_size_is_the_smallest_valid_n():
  for alpha in (0.5, 0.2, 0.1, 0.05, 0.01, 0.3):
    brute = next(n for n in range(1, 10_000) if math.ceil((n + 1) * (1 - alpha)) <= n)
    assert conformal.min_calibration_size(alpha) == brute


# --------------------------------------------------------------------------- fit, predictor

CONFIGS = [("thr", {}), ("aps", {"randomized": False}), ("aps", {"randomized": True}),
           ("raps", {"randomized": False}), ("raps", {"randomized": True, "lam": 0.1, "k_reg": 2})]


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_fit_matches_numpy_pipeline(name, kw):
  logits, labels = LOGITS, LABELS
  key = jax.random.key(7)
  p = conformal.fit(name, logits[:300], labels[:300], 0.1, key=key, **kw)
  probs = _np_softmax(logits)
  lam, k_reg = (kw.get("lam", 0.01), kw.get("k_reg", 5)) if name == "raps" else (0.0, 0)
  if name == "thr":
    all_scores = 1.0 - probs.astype(np.float64)
  else:
    randomized = kw.get("randomized", False)
    # The uniforms are the ones fit and the call draw from their key: one per sample.
    u_cal = np.asarray(jax.random.uniform(key, (300,))) if randomized else None
    all_scores = np_raps(probs[:300], u_cal, lam, k_reg)
  cal = all_scores[np.arange(300), labels[:300]]
  assert abs(float(p.qhat) - np_quantile(cal, 0.1)) < 1e-5
  test_key = jax.random.key(8)
  sets = np.asarray(p(logits[300:], key=test_key))
  if name == "thr":
    expected = 1.0 - probs[300:] <= float(p.qhat)
  else:
    u_test = np.asarray(jax.random.uniform(test_key, (300,))) if kw.get("randomized") else None
    expected = np_raps(probs[300:], u_test, lam, k_reg) <= float(p.qhat)
  assert (sets != expected).sum() <= 1  # a score within float32 rounding of q̂ may flip


def test_marginal_coverage_guarantee_over_random_splits():
  """Over random calibration/test splits of exchangeable data E[coverage] = k/(n+1) ∈
  [1 − α, 1 − α + 1/(n+1)] for every method (scores without ties); 300 splits put the Monte
  Carlo error of the mean near 0.0012, a quarter of the tolerance."""
  logits, labels = map(jnp.asarray, _data(3, 1000))
  n, alpha, splits = 300, 0.1, 300

  def one_split(key):
    perm_key, cal_key, test_key = jax.random.split(key, 3)
    perm = jax.random.permutation(perm_key, logits.shape[0])
    cal, test = perm[:n], perm[n:]
    out = []
    for name, kw in CONFIGS:
      p = conformal.fit(name, logits[cal], labels[cal], alpha, key=cal_key, **kw)
      sets = p(logits[test], key=test_key)
      out.append((conformal.coverage(sets, labels[test]), conformal.mean_set_size(sets)))
    return out

  results = jax.jit(jax.vmap(one_split))(jax.random.split(jax.random.key(0), splits))
  for (name, kw), (cov, size) in zip(CONFIGS, results):
    mean = float(jnp.mean(cov))
    assert 1 - alpha - 0.005 <= mean <= 1 - alpha + 1 / (n + 1) + 0.005, (name, kw, mean)
    assert 1 < float(jnp.mean(size)) < C  # informative, not the trivial full set


def test_raps_with_zero_lambda_equals_aps():
  for randomized in (False, True):
    kw = {"randomized": randomized, "key": jax.random.key(1)}
    aps = conformal.fit("aps", LOGITS[CAL], LABELS[CAL], 0.1, **kw)
    raps = conformal.fit("raps", LOGITS[CAL], LABELS[CAL], 0.1, lam=0.0, k_reg=3, **kw)
    assert float(aps.qhat) == float(raps.qhat)
    k = jax.random.key(2)
    np.testing.assert_array_equal(aps(LOGITS[TEST], key=k), raps(LOGITS[TEST], key=k))


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_sets_are_prefixes_of_the_probability_order(name, kw):
  """Every method's set is the top-m classes for some m: a class is in only if every more
  probable class is (so a non-empty set always holds the top-1 prediction)."""
  p = conformal.fit(name, LOGITS[CAL], LABELS[CAL], 0.2, key=jax.random.key(0), **kw)
  sets = np.asarray(p(LOGITS[TEST], key=jax.random.key(1)))
  order = np.argsort(-LOGITS[TEST], axis=-1, kind="stable")
  in_order = np.take_along_axis(sets, order, axis=-1).astype(int)
  assert (np.diff(in_order, axis=-1) <= 0).all()
  assert 0 < sets.sum(-1).mean() < C


def test_raps_penalty_bounds_the_set_size():
  """s ≥ λ (r − k_reg) at rank r, so a class in the set has r ≤ k_reg + q̂/λ."""
  lam, k_reg = 1.0, 1
  p = conformal.fit("raps", LOGITS[CAL], LABELS[CAL], 0.1, lam=lam, k_reg=k_reg)
  sizes = np.asarray(p(LOGITS[TEST])).sum(-1)
  assert sizes.max() <= k_reg + math.floor(float(p.qhat) / lam)
  aps_sizes = np.asarray(conformal.fit("aps", LOGITS[CAL], LABELS[CAL], 0.1)(LOGITS[TEST]))
  assert aps_sizes.sum(-1).max() > sizes.max()  # the bound binds where APS does not


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_smaller_alpha_gives_nested_larger_sets(name, kw):
  fits = [conformal.fit(name, LOGITS[CAL], LABELS[CAL], a, key=jax.random.key(0), **kw)
          for a in (0.3, 0.1, 0.05)]
  sets = [np.asarray(f(LOGITS[TEST], key=jax.random.key(1))) for f in fits]
  assert float(fits[0].qhat) <= float(fits[1].qhat) <= float(fits[2].qhat)
  assert (sets[0] <= sets[1]).all() and (sets[1] <= sets[2]).all()


def test_default_is_randomised_with_fixed_keys():
  for name in ("aps", "raps"):
    default = conformal.fit(name, LOGITS[CAL], LABELS[CAL], 0.1)
    explicit = conformal.fit(name, LOGITS[CAL], LABELS[CAL], 0.1, randomized=True,
                             key=jax.random.key(0))
    assert default.randomized and float(default.qhat) == float(explicit.qhat)
    np.testing.assert_array_equal(default(LOGITS[TEST]),
                                  explicit(LOGITS[TEST], key=jax.random.key(1)))
  legacy = jax.random.PRNGKey(0)  # raw uint32 keys work too
  assert float(conformal.fit("aps", LOGITS[CAL], LABELS[CAL], 0.1, key=legacy).qhat) == float(
      conformal.fit("aps", LOGITS[CAL], LABELS[CAL], 0.1, key=jax.random.wrap_key_data(
          legacy)).qhat)


def test_non_randomised_aps_saturates_on_confident_models():
  """Why the default randomises: when float32 softmax saturates (p_max = 1.0 for a fifth of the
  samples), the u = 1 scores tie at 1.0, q̂ = 1.0 and nearly every set is full; the randomised
  scores keep sets small at the same coverage guarantee."""
  rng = np.random.default_rng(12)
  logits = (20.0 * rng.normal(size=(600, C))).astype(np.float32)
  probs = np.exp((logits - logits.max(-1, keepdims=True)) / 4.0).astype(np.float64)
  cdf = np.cumsum(probs / probs.sum(-1, keepdims=True), axis=-1)  # labels from softmax(z / 4)
  labels = (rng.uniform(size=(600, 1)) > cdf).sum(-1).clip(0, C - 1).astype(np.int32)
  assert (_np_softmax(logits).max(-1) == 1.0).mean() > 0.1
  fixed = conformal.fit("aps", logits[CAL], labels[CAL], 0.1, randomized=False)
  default = conformal.fit("aps", logits[CAL], labels[CAL], 0.1)
  assert float(fixed.qhat) == 1.0
  assert float(conformal.mean_set_size(fixed(logits[TEST]))) > 8
  assert float(conformal.mean_set_size(default(logits[TEST]))) < 3


def test_calibration_mask_equals_the_subset():
  logits, labels = LOGITS[CAL], LABELS[CAL]
  mask = np.random.default_rng(0).uniform(size=300) < 0.6
  for name, kw in [CONFIGS[0], CONFIGS[1], CONFIGS[4]]:
    a = conformal.fit(name, logits, labels, 0.1, mask=mask, key=jax.random.key(0), **kw)
    if kw.get("randomized"):  # the uniforms are drawn per row of the full array
      u = np.asarray(jax.random.uniform(jax.random.key(0), (300,)))
      probs = _np_softmax(logits)
      lam, k_reg = kw.get("lam", 0.0), kw.get("k_reg", 0)
      cal = np_raps(probs, u, lam, k_reg)[np.arange(300), labels][mask]
      assert abs(float(a.qhat) - np_quantile(cal, 0.1)) < 1e-5
    else:
      b = conformal.fit(name, logits[mask], labels[mask], 0.1, **kw)
      assert abs(float(a.qhat) - float(b.qhat)) < 1e-6  # softmax of another batch shape


def test_jit_and_leading_dims():
  logits, labels = LOGITS, LABELS
  p = conformal.fit("raps", logits[CAL], labels[CAL], 0.1, randomized=True,
                    key=jax.random.key(0))
  key = jax.random.key(3)
  eager = p(logits[TEST], key=key)
  np.testing.assert_array_equal(jax.jit(lambda pr, x, k: pr(x, key=k))(p, logits[TEST], key),
                                eager)
  np.testing.assert_array_equal(p(logits[TEST].reshape(30, 10, C), key=key).reshape(300, C),
                                eager)
  fit_jit = jax.jit(conformal.fit, static_argnames=("name", "alpha", "randomized"))
  q = fit_jit("raps", logits[CAL], labels[CAL], alpha=0.1, randomized=True,
              key=jax.random.key(0)).qhat
  assert float(q) == float(p.qhat)
  # A traced mask that leaves too few samples gives q̂ = inf (full sets) instead of an error.
  few = jnp.arange(300) < 5
  q = jax.jit(lambda m: conformal.fit("thr", logits[CAL], labels[CAL], 0.1, mask=m).qhat)(few)
  assert float(q) == np.inf


def test_from_logits_false_takes_probabilities():
  probs = _np_softmax(LOGITS)
  a = conformal.fit("aps", LOGITS[CAL], LABELS[CAL], 0.1)
  b = conformal.fit("aps", probs[CAL], LABELS[CAL], 0.1, from_logits=False)
  assert abs(float(a.qhat) - float(b.qhat)) < 1e-6
  assert (np.asarray(a(LOGITS[TEST])) != np.asarray(b(probs[TEST]))).sum() <= 1


# --------------------------------------------------------------------------- metrics


def _random_sets(seed, n=300, c=C):
  rng = np.random.default_rng(seed)
  sets = rng.uniform(size=(n, c)) < rng.uniform(0, 0.6, size=(n, 1))
  labels = rng.integers(0, c, size=n).astype(np.int32)
  return sets, labels, rng.uniform(size=n) < 0.8


def test_metrics_match_numpy():
  sets, labels, mask = _random_sets(0)
  hit = sets[np.arange(len(labels)), labels]
  assert abs(float(conformal.coverage(sets, labels)) - hit.mean()) < 1e-6
  assert abs(float(conformal.coverage(sets, labels, mask)) - hit[mask].mean()) < 1e-6
  assert abs(float(conformal.mean_set_size(sets)) - sets.sum(-1).mean()) < 1e-5
  assert abs(float(conformal.mean_set_size(sets, mask)) - sets[mask].sum(-1).mean()) < 1e-5

  ccc = conformal.class_conditional_coverage(sets, labels, mask)
  for c in range(C):
    sel = mask & (labels == c)
    assert int(ccc.count[c]) == sel.sum()
    assert abs(float(ccc.coverage[c]) - hit[sel].mean()) < 1e-6
  assert abs(float(ccc.worst) - min(hit[mask & (labels == c)].mean() for c in range(C))) < 1e-6

  ssc = conformal.size_stratified_coverage(sets, labels)
  sizes = sets.sum(-1)
  strata = [(0, 1), (2, 3), (4, 6), (7, 10)]  # Angelopoulos et al.'s strata cut at C = 10
  np.testing.assert_array_equal(np.stack([ssc.lower, ssc.upper], 1), strata)
  expected = []
  for s, (lo, hi) in enumerate(strata):
    sel = (sizes >= lo) & (sizes <= hi)
    assert int(ssc.count[s]) == sel.sum()
    if sel.any():
      assert abs(float(ssc.coverage[s]) - hit[sel].mean()) < 1e-6
      expected.append(hit[sel].mean())
  assert abs(float(ssc.worst) - min(expected)) < 1e-6


def test_size_strata_custom_edges_and_empty_strata():
  sets = np.zeros((4, 5), bool)
  sets[:2, :2] = True          # two sets of size 2, both covering label 0
  labels = np.array([0, 0, 3, 4], np.int32)  # two empty sets: misses
  ssc = conformal.size_stratified_coverage(sets, labels, edges=(0, 2, 3))
  np.testing.assert_array_equal(ssc.upper, [0, 2, 3, 5])
  np.testing.assert_array_equal(ssc.count, [2, 2, 0, 0])
  np.testing.assert_allclose(ssc.coverage, [0.0, 1.0, 0.0, 0.0])
  assert float(ssc.worst) == 0.0
  jitted = jax.jit(conformal.size_stratified_coverage, static_argnames="edges")
  np.testing.assert_array_equal(jitted(sets, labels, edges=(0, 2, 3)).count, ssc.count)


# --------------------------------------------------------------------------- bad input


def _raises(match, fn, *args, **kw):
  with pytest.raises(ValueError, match=match) as info:
    fn(*args, **kw)
  assert "\n" not in str(info.value)


def test_bad_input_gives_one_line_errors():
  logits, labels = LOGITS[:50], LABELS[:50]
  fit = conformal.fit
  _raises(r"unknown conformal method 'lac2'.*\['thr', 'aps', 'raps', 'saps'\]", fit, "lac2",
          logits, labels)
  for alpha in (0.0, 1.0, 1.5, -0.1, "0.1", True):
    _raises(r"alpha must be a Python float in \(0, 1\)", fit, "thr", logits, labels, alpha)
  _raises(r"unknown argument\(s\) \['lam'\] for 'aps'; valid", fit, "aps", logits, labels,
          lam=0.1)
  _raises(r"unknown argument\(s\) \['randomised'\]", fit, "raps", logits, labels,
          randomised=True)
  _raises(r"lam must be a float >= 0", fit, "raps", logits, labels, lam=-1.0)
  _raises(r"k_reg must be an int >= 0", fit, "raps", logits, labels, k_reg=2.5)
  _raises(r"randomized must be a bool", fit, "aps", logits, labels, randomized="yes")
  _raises(r"key must be one PRNG key", fit, "aps", logits, labels, key=3)
  _raises(r"labels shape \(49,\) must equal", fit, "thr", logits, labels[:49])
  _raises(r"label 10 .* outside \[0, 10\)", fit, "thr", logits, np.full(50, 10, np.int32))
  _raises(r"must hold integer class indices", fit, "thr", logits, labels.astype(np.float32))
  bad = logits.copy()
  bad[3, 2] = np.nan
  _raises(r"val_logits contain NaN or inf", fit, "thr", bad, labels)
  _raises(r"8 calibration samples are too few for alpha=0.1.*need n >= 9", fit, "thr",
          logits[:8], labels[:8])
  _raises(r"mask shape", fit, "thr", logits, labels, mask=np.ones(3, bool))
  _raises(r"empty input: val_logits has shape \(0, 10\)", fit, "thr", logits[:0], labels[:0])
  _raises(r"val_logits must have shape \[..., C\]", fit, "thr", labels, labels)
  assert conformal.names() == ["thr", "aps", "raps", "saps"]

  p = fit("aps", logits, labels, 0.1, randomized=True, key=jax.random.key(0))
  _raises(r"key must be one PRNG key", p, logits, key=jax.random.split(jax.random.key(0), 2))
  _raises(r"logits has 4 classes but the predictor was fitted on 10", p, logits[:, :4],
          key=jax.random.key(0))
  _raises(r"sets must be a bool mask", conformal.coverage, logits, labels)
  _raises(r"labels shape", conformal.coverage, logits > 0, labels[:3])
  _raises(r"edges must be increasing", conformal.size_stratified_coverage, logits > 0, labels,
          edges=(3, 1))
