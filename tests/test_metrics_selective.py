"""Tie-aware selective metrics against numpy (docs/conventions.md#selective-classification)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import metrics
from calib_jax.metrics import _ranking
from calib_jax.metrics import calibration
from calib_jax.metrics import _sorting
from calib_jax.metrics import selective

N = 400


# ---------------------------------------------------------------- numpy references
def ref_tie_errors(scores, correct):
  """E_k for k = 1..N: sort descending, each tie group's samples count its mean error."""
  order = np.argsort(-scores.astype(np.float64), kind="stable")
  s, err = scores[order], ~correct[order]
  out = np.zeros(len(s))
  i, before = 0, 0.0
  while i < len(s):
    j = i
    while j + 1 < len(s) and s[j + 1] == s[i]:
      j += 1
    m, e = j - i + 1, err[i:j + 1].sum()
    for t in range(1, m + 1):
      out[i + t - 1] = before + t * e / m
    before += e
    i = j + 1
  return out, s


def ref_aurc(scores, correct):
  e, _ = ref_tie_errors(scores, correct)
  return np.mean(e / np.arange(1, len(e) + 1))


def ref_aurc_opt(correct):
  n, n_ok = len(correct), int(correct.sum())
  k = np.arange(1, n + 1)
  return np.mean(np.maximum(k - n_ok, 0) / k)


def ref_coverage_at_risk(scores, correct, risk):
  e, s = ref_tie_errors(scores, correct)
  n = len(e)
  best = 0
  for k in range(1, n + 1):
    boundary = k == n or s[k] != s[k - 1]
    if boundary and e[k - 1] / k <= risk:
      best = k
  return best / n


def ref_risk_at_coverage(scores, correct, coverage):
  e, _ = ref_tie_errors(scores, correct)
  k = max(1, -(-round(coverage * 10**6) * len(e) // 10**6))  # ceil, coverage in ppm
  return e[k - 1] / k


def _data(seed, n=N, decimals=None):
  rng = np.random.default_rng(seed)
  scores = rng.random(n).astype(np.float32)
  if decimals is not None:
    scores = np.round(scores, decimals).astype(np.float32)  # many ties
  correct = rng.random(n) < 0.3 + 0.6 * scores  # informative but imperfect
  return scores, correct


# ---------------------------------------------------------------- tests
def test_reference_tie_rule_is_the_expectation_over_orderings():
  # Brute force: average E_k over all orderings that respect the scores.
  scores = np.array([0.9, 0.5, 0.5, 0.5, 0.2, 0.2], np.float32)
  correct = np.array([True, False, True, False, True, False])
  groups = [[0], [1, 2, 3], [4, 5]]
  total, count = np.zeros(6), 0
  for perms in itertools.product(*[itertools.permutations(g) for g in groups]):
    order = [i for p in perms for i in p]
    total += np.cumsum(~correct[order])
    count += 1
  np.testing.assert_allclose(ref_tie_errors(scores, correct)[0], total / count)
  curve_cov, curve_risk = metrics.risk_coverage_curve(scores, correct)
  np.testing.assert_allclose(curve_risk, total / count / np.arange(1, 7), atol=1e-6)
  np.testing.assert_allclose(curve_cov, np.arange(1, 7) / 6, atol=1e-7)


def test_hand_derived_aurc_with_a_tie():
  scores = np.array([0.9, 0.8, 0.8, 0.3], np.float32)
  correct = np.array([True, False, True, False])
  # E = 0, .5, 1, 2 -> risks 0, .25, 1/3, .5
  np.testing.assert_allclose(metrics.aurc(scores, correct), (0.25 + 1 / 3 + 0.5) / 4, atol=1e-6)
  np.testing.assert_allclose(metrics.augrc(scores, correct), (0 + .5 + 1 + 2) / 16, atol=1e-6)
  # Oracle: two rights then two errors: risks 0, 0, 1/3, 1/2.
  np.testing.assert_allclose(metrics.eaurc(scores, correct),
                             (0.25 + 1 / 3 + 0.5) / 4 - (1 / 3 + 0.5) / 4, atol=1e-6)
  # Boundaries at k = 1 (risk 0), 3 (1/3), 4 (1/2); k = 2 is inside the tie.
  np.testing.assert_allclose(metrics.coverage_at_risk(scores, correct, 0.3), 0.25)
  np.testing.assert_allclose(metrics.coverage_at_risk(scores, correct, 0.4), 0.75)
  np.testing.assert_allclose(metrics.risk_at_coverage(scores, correct, 0.5), 0.25)
  np.testing.assert_allclose(metrics.risk_at_coverage(scores, correct, 0.3), 0.25)  # k = 2
  # vmap over two score vectors (the numpy sort callback is batched too).
  batched = jax.vmap(metrics.aurc)(np.stack([scores, -scores]), np.stack([correct, correct]))
  np.testing.assert_allclose(batched, [ref_aurc(scores, correct), ref_aurc(-scores, correct)],
                             atol=1e-6)


def _check_summary(summary, scores, correct, risks, coverages):
  np.testing.assert_allclose(summary["aurc"], ref_aurc(scores, correct), atol=1e-6)
  np.testing.assert_allclose(summary["eaurc"],
                             ref_aurc(scores, correct) - ref_aurc_opt(correct), atol=1e-6)
  e, _ = ref_tie_errors(scores, correct)
  np.testing.assert_allclose(summary["augrc"], e.mean() / len(e), atol=1e-6)
  np.testing.assert_allclose(summary["coverage_at_risk"],
                             [ref_coverage_at_risk(scores, correct, q) for q in risks],
                             atol=1e-7)
  np.testing.assert_allclose(summary["risk_at_coverage"],
                             [ref_risk_at_coverage(scores, correct, c) for c in coverages],
                             atol=1e-6)


RISKS, COVERAGES = (0.05, 0.2, 0.35), (0.1, 0.3, 0.8, 1.0)


@pytest.mark.parametrize("decimals", [None, 2])
def test_random_scores_with_and_without_ties_match_reference(decimals):
  scores, correct = _data(0 if decimals is None else 1, decimals=decimals)
  summary = metrics.selective_summary(scores, correct, risks=RISKS, coverages=COVERAGES)
  _check_summary(summary, scores, correct, RISKS, COVERAGES)


def test_single_metric_functions_equal_the_summary():
  scores, correct = _data(10, decimals=2)
  summary = metrics.selective_summary(scores, correct, risks=(0.2,), coverages=(0.3,))
  np.testing.assert_allclose(metrics.aurc(scores, correct), summary["aurc"], atol=1e-7)
  np.testing.assert_allclose(metrics.risk_at_coverage(scores, correct, 0.3),
                             summary["risk_at_coverage"][0], atol=1e-7)
  np.testing.assert_allclose(metrics.coverage_at_risk(scores, correct, 0.2),
                             summary["coverage_at_risk"][0], atol=1e-7)


def test_constant_score_model_has_aurc_equal_to_error_rate():
  _, correct = _data(2)
  scores = np.full(N, 0.7, np.float32)
  error_rate = 1 - correct.mean()
  summary = metrics.selective_summary(scores, correct, risks=(error_rate + 1e-3,
                                                              error_rate - 1e-3),
                                      coverages=(0.1, 0.6))
  np.testing.assert_allclose(summary["aurc"], error_rate, atol=1e-6)
  np.testing.assert_allclose(summary["risk_at_coverage"], [error_rate] * 2, atol=1e-6)
  # The only tie-group boundary is full coverage.
  np.testing.assert_array_equal(summary["coverage_at_risk"], [1.0, 0.0])


def test_perfect_ranking_has_zero_eaurc():
  _, correct = _data(3)
  scores = correct.astype(np.float32) + np.linspace(0, 0.5, N, dtype=np.float32)
  assert abs(float(metrics.selective_summary(scores, correct)["eaurc"])) < 1e-6
  assert float(metrics.selective_summary(-scores, correct)["eaurc"]) > 0.1


def test_mixed_sign_scores_and_negative_zero():
  rng = np.random.default_rng(4)
  scores = np.round(rng.normal(size=N) * 3, 1).astype(np.float32)
  scores[:5] = -0.0
  scores[5:10] = 0.0  # -0.0 and +0.0 are one tie group
  correct = rng.random(N) < 0.6
  summary = metrics.selective_summary(scores, correct, risks=RISKS, coverages=COVERAGES)
  _check_summary(summary, scores, correct, RISKS, COVERAGES)


@pytest.mark.parametrize("masked", [False, True])
def test_numpy_and_lax_ranking_paths_agree(masked):
  rng = np.random.default_rng(5)
  scores = np.round(rng.normal(size=300), 1).astype(np.float32)
  key = np.maximum(np.asarray(_sorting.monotone_key(scores)), 1)
  bit = rng.random(300) < 0.5
  if masked:
    valid = rng.random(300) < 0.7
    key, bit = np.where(valid, key, 0).astype(np.uint32), bit & valid
  bit8 = bit.astype(np.uint8)
  cpu = jax.jit(_ranking._callback_tie_errors)(key, bit8)  # pylint: disable=protected-access
  lax_path = jax.jit(_ranking._lax_tie_errors)(key, bit8)  # pylint: disable=protected-access
  # Ties spread their errors with the same integer-and-quotient arithmetic: equal to the bit.
  np.testing.assert_array_equal(cpu[0], lax_path[0])
  np.testing.assert_array_equal(cpu[1], lax_path[1])
  np.testing.assert_array_equal(_ranking.tie_errors(key, bit)[0], lax_path[0])  # n ≤ threshold
  conf_key = np.where(key > 0, _sorting.monotone_key(np.abs(scores) / 4), 0).astype(np.uint32)
  for num_bins in (7, 500):  # 500 > n: empty groups
    cpu = jax.jit(_ranking._callback_adaptive_groups, static_argnums=2)(  # pylint: disable=protected-access
        conf_key, bit8, num_bins)
    lax_path = jax.jit(_ranking._lax_adaptive_groups, static_argnums=2)(  # pylint: disable=protected-access
        conf_key, bit8, num_bins)
    np.testing.assert_array_equal(cpu[0], lax_path[0])
    # Confidence sums: numpy adds in float64, XLA in float32 chunks (within a few ulp).
    np.testing.assert_allclose(cpu[1], lax_path[1], rtol=1e-6)
  # Wide key ranges take the uint64 packing in numpy.
  wide = np.array([0, 2**32 - 1, 5, 2**31 + 7, 5], np.uint32)
  keys, bits = _sorting.numpy_sort_with_bit(wide, np.array([1, 0, 1, 1, 0], np.uint8))
  np.testing.assert_array_equal(keys, np.sort(wide))
  np.testing.assert_array_equal(bits, [1, 0, 1, 1, 0])  # ties (key 5): bit 0 first
  t = jax.jit(_sorting.lax_sorted_ties)(wide, np.array([0, 0, 1, 1, 0], np.uint8))  # key 0: bit 0
  np.testing.assert_array_equal(t.first, [0, 1, 1, 3, 4])
  np.testing.assert_array_equal(t.last, [0, 2, 2, 3, 4])
  np.testing.assert_array_equal(t.bits_upto, [0, 1, 1, 2, 2])
  np.testing.assert_array_equal(t.bits_below, [0, 0, 0, 1, 2])



def test_tie_runs_and_counts_before_on_hand_cases():
  # Positions 0-1-2 tied (one run of 3), 4-5 (2), 7-8-9-10 (4).
  starts, sizes = _ranking._tie_runs(np.array([0, 1, 4, 7, 8, 9]))  # pylint: disable=protected-access
  np.testing.assert_array_equal(starts, [0, 4, 7])
  np.testing.assert_array_equal(sizes, [3, 2, 4])
  assert _ranking._tie_runs(np.array([], np.int64))[0].size == 0  # pylint: disable=protected-access
  bits = np.random.default_rng(6).integers(0, 2, 50).astype(np.int32)
  positions = np.array([0, 50, 7, 7, 49, 1, 0, 23])    # unsorted, repeated, both ends
  running = np.concatenate([[0], np.cumsum(bits)])
  np.testing.assert_array_equal(_ranking._counts_before(bits, positions), running[positions])  # pylint: disable=protected-access


@pytest.mark.parametrize("pattern", ["pairs", "spanning", "masked_spanning"])
def test_host_and_lax_paths_agree_above_the_xla_threshold(pattern):
  # The host path's tie bookkeeping visits only the tied entries: isolated pairs among distinct
  # scores, and one run of equal scores that spans several AECE groups (n = 3000, 15 groups
  # of 200: the run of 700 covers three boundaries), give the lax path's values to the bit.
  n = 3000
  rng = np.random.default_rng(7)
  scores = rng.random(n).astype(np.float32)
  if pattern == "pairs":
    scores[1::7] = scores[::7][:len(scores[1::7])]
  else:
    scores[rng.permutation(n)[:700]] = np.float32(0.41)
  bit = (rng.random(n) < 0.4).astype(np.uint8)
  key = np.asarray(_sorting.monotone_key(scores))
  if pattern == "masked_spanning":
    valid = rng.random(n) < 0.8
    key, bit = np.where(valid, key, 0).astype(np.uint32), bit * valid
  bit = bit.astype(np.uint8)
  rank_key = np.where(key > 0, np.maximum(key, 1), 0).astype(np.uint32)
  host = jax.jit(_ranking._callback_tie_errors)(rank_key, bit)  # pylint: disable=protected-access
  lax_path = jax.jit(_ranking._lax_tie_errors)(rank_key, bit)  # pylint: disable=protected-access
  np.testing.assert_array_equal(host[0], lax_path[0])
  np.testing.assert_array_equal(host[1], lax_path[1])
  for num_bins in (15, 4):
    host = jax.jit(_ranking._callback_adaptive_groups, static_argnums=2)(key, bit, num_bins)  # pylint: disable=protected-access
    lax_path = jax.jit(_ranking._lax_adaptive_groups, static_argnums=2)(key, bit, num_bins)  # pylint: disable=protected-access
    np.testing.assert_array_equal(host[0], lax_path[0])
    np.testing.assert_allclose(host[1], lax_path[1], rtol=1e-6)


@pytest.mark.exact_across_programs
def test_large_tie_groups_spread_errors_exactly_in_both_paths():
  # One tie group of 3000 (products up to 3000² would round in float32) and one of 70000
  # (past the int32 product, the float32 formula): numpy and XLA still agree to the bit.
  for n_tied, n in ((3000, 4000), (70000, 80000)):
    rng = np.random.default_rng(n)
    scores = rng.random(n).astype(np.float32)
    scores[:n_tied] = 0.5
    key = np.asarray(_sorting.monotone_key(scores))
    bit = (rng.random(n) < 0.37).astype(np.uint8)
    cpu = jax.jit(_ranking._callback_tie_errors)(key, bit)  # pylint: disable=protected-access
    lax_path = jax.jit(_ranking._lax_tie_errors)(key, bit)  # pylint: disable=protected-access
    np.testing.assert_array_equal(cpu[0], lax_path[0])
    # The exact value where integer arithmetic reaches: E_k of the tie group's members.
    order = np.argsort(-scores, kind="stable")
    errors_above = int(bit[order][:np.count_nonzero(scores > 0.5)].sum())
    group_errors = int(bit[scores == 0.5].sum())
    start = np.count_nonzero(scores > 0.5)
    taken = np.arange(1, n_tied + 1)
    exact = errors_above + taken * group_errors / n_tied
    np.testing.assert_allclose(np.asarray(cpu[0])[start:start + n_tied], exact, rtol=1.2e-7)


def test_small_inputs_compile_without_host_callbacks_when_cacheable_sorts_are_on(monkeypatch):
  """With `use_cacheable_cpu_sorts(True)` (eval.py's compilation cache), the rank metrics of
  n ≤ XLA_SORT_MAX_N are pure XLA (cacheable); above it, or by default, a host sort (faster to
  compile)."""
  def texts(n):
    scores = jnp.linspace(0.0, 1.0, n)
    correct = scores > 0.3
    probs = jnp.stack([scores, 1.0 - scores], axis=-1)
    return [selective._aurc.lower(scores, correct, None).as_text(),  # pylint: disable=protected-access
            calibration._aece.lower(probs, correct.astype(jnp.int32), None, 15, "l1").as_text()]  # pylint: disable=protected-access

  limit = _ranking.XLA_SORT_MAX_N
  # Shapes traced nowhere else: jit's trace cache does not see the patched setting.
  monkeypatch.delenv(_ranking.CACHEABLE_SORTS_ENV, raising=False)
  assert not _ranking.xla_sorts_on_cpu(limit - 1)
  assert all("callback" in t for t in texts(limit - 1))
  metrics.use_cacheable_cpu_sorts(True)  # tests/conftest.py switches it off after the test
  assert _ranking.xla_sorts_on_cpu(limit) and not _ranking.xla_sorts_on_cpu(limit + 1)
  assert not any("callback" in t for t in texts(limit))
  assert all("callback" in t for t in texts(limit + 1))


@pytest.mark.parametrize("cacheable", [False, True])
def test_rank_summary_equals_aece_and_selective_summary(cacheable, monkeypatch):
  """One sort for AECE and the selective metrics gives what the two calls give: the host path
  (the default) and, with cacheable sorts on (n ≤ XLA_SORT_MAX_N), the XLA path."""
  monkeypatch.delenv(_ranking.CACHEABLE_SORTS_ENV, raising=False)
  if cacheable:
    metrics.use_cacheable_cpu_sorts(True)  # tests/conftest.py switches it off after the test
  rng = np.random.default_rng(8)
  n, c = 600 + cacheable, 5                 # shapes traced nowhere else (trace-time switch)
  probs = rng.dirichlet(np.full(c, 0.3), n).astype(np.float32)
  probs = np.round(probs, 2).astype(np.float32)          # tie runs, cut by AECE's groups
  labels = np.where(rng.random(n) < 0.7, probs.argmax(1), rng.integers(0, c, n))
  conf, correct = metrics.confidence_and_correct(probs, labels)
  mask = rng.random(n) < 0.8
  for kw in ({}, {"mask": mask}):
    for norm, num_bins in (("l1", 15), ("max", 7)):
      summary = metrics.rank_summary(conf, correct, num_bins=num_bins, norm=norm,
                                     risks=RISKS, coverages=COVERAGES, **kw)
      np.testing.assert_allclose(summary["aece"], metrics.aece(probs, labels, num_bins,
                                                               norm=norm, **kw), atol=1e-7)
      expected = metrics.selective_summary(conf, correct, risks=RISKS, coverages=COVERAGES, **kw)
      assert sorted(summary) == sorted([*expected, "aece"])
      for key, value in expected.items():
        np.testing.assert_allclose(summary[key], value, atol=1e-7, err_msg=key)
  assert float(metrics.rank_summary(conf, ~np.asarray(correct))["aece"]) > 0.3  # it can fail
  with pytest.raises(ValueError, match="norm"):
    metrics.rank_summary(conf, correct, norm="l3")
