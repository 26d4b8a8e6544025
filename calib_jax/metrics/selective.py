"""Tie-aware selective-classification metrics (docs/conventions.md#selective-classification).

Inputs are `scores [...]` (higher = more confident), `correct [...]` (bool) and an optional bool
`mask [...]`; leading dims are flattened. Samples are ranked by score, descending, and samples
with exactly equal scores are accepted or rejected together: within a tie group every sample's
error counts as the group's mean error (the expectation over the orderings of the ties). With
`E_k` the tie-aware number of errors among the k most confident samples and n valid samples:

* `risk_coverage_curve`: coverage `k/n`, risk `E_k/k`, k = 1..n;
* `aurc = mean_k E_k/k`; `eaurc = aurc − aurc_opt` (errors ranked last); `augrc = mean_k E_k/n`;
* `coverage_at_risk`: largest `k/n` at a tie-group boundary with `E_k/k ≤ risk` (0 if none);
* `risk_at_coverage`: `E_k/k` at `k = ceil(coverage·n)`, the coverage read in parts per million
  (`coverage_index`, exact integer arithmetic).

All are jit-able; errors and the tie bookkeeping are int32, risks float32.
"""
import functools
import numbers
from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from calib_jax import program_store
from calib_jax import arrays
from calib_jax.metrics import _ranking
from calib_jax.metrics import _sorting
from calib_jax.metrics import binned
from calib_jax.metrics import calibration

ArrayLike = jax.typing.ArrayLike


class RankedErrors(NamedTuple):
  """Tie-aware error counts along the descending score order (entries past `n` are padding)."""
  errors: jax.Array      # float32 [N], E_k for k = index + 1 (0 past n)
  boundary: jax.Array    # bool [N], True where a tie group ends (and index < n)
  num_errors: jax.Array  # int32 [], errors among the valid samples
  n: jax.Array           # int32 [], number of valid samples


def rank_errors(scores: jax.Array, errors: jax.Array,
                mask: Optional[jax.Array]) -> RankedErrors:
  """Ranks by score (descending) and computes the tie-aware cumulative errors `E_k`."""
  key = jnp.maximum(_sorting.monotone_key(scores), 1)  # key 0 is reserved for masked entries
  bit = errors
  if mask is not None:
    key = jnp.where(mask, key, 0)
    bit = bit & mask
  tie_errors, boundary = _ranking.tie_errors(key, bit)
  n = jnp.int32(scores.shape[0]) if mask is None else jnp.sum(mask, dtype=jnp.int32)
  num_errors = jnp.sum(bit, dtype=jnp.int32)
  return RankedErrors(tie_errors, boundary, num_errors, n)


def _aurc_from_ranked(r: RankedErrors) -> jax.Array:
  k = jnp.arange(1, r.errors.shape[0] + 1, dtype=jnp.float32)
  return jnp.sum(r.errors / k) / r.n.astype(jnp.float32)


def optimal_aurc(num_errors: jax.Array, n: jax.Array, length: int) -> jax.Array:
  """AURC of an oracle that ranks every error last (no ties): `mean_k max(0, k − n_ok)/k`."""
  k = jnp.arange(1, length + 1, dtype=jnp.int32)
  n_ok = n - num_errors
  e = jnp.where(k <= n, jnp.maximum(k - n_ok, 0), 0).astype(jnp.float32)
  return jnp.sum(e / k.astype(jnp.float32)) / n.astype(jnp.float32)


def _coverage_at_risk_from_ranked(r: RankedErrors, risk) -> jax.Array:
  k = jnp.arange(1, r.errors.shape[0] + 1, dtype=jnp.int32)
  ok = r.boundary & (r.errors / k.astype(jnp.float32) <= risk)
  return jnp.max(jnp.where(ok, k, 0)).astype(jnp.float32) / r.n.astype(jnp.float32)


COVERAGE_RESOLUTION = 10**6  # coverages are read in parts per million


def coverage_ppm(coverage):
  """`round(coverage·10⁶)`: the coverage as an integer number of parts per million.

  A decimal coverage such as 0.7 is not a binary float (0.7·10 is 7.000000000000001 in float64
  and its ceil 8); rounding to parts per million first makes `ceil(coverage·n)` exact.
  """
  if isinstance(coverage, numbers.Real):
    return round(float(coverage) * COVERAGE_RESOLUTION)
  return jnp.round(jnp.asarray(coverage, jnp.float32) * COVERAGE_RESOLUTION).astype(jnp.int32)


def coverage_index(coverage, n) -> jax.Array:
  """`k = ceil(a·n / 10⁶)` in [1, n] for `a = coverage_ppm(coverage)`, exactly, in int32.

  `a·n` overflows int32 (up to 10⁶ · 2³¹), so it is split into parts that each fit: with
  `n = q·10⁶ + r`, `a = 1000·a_hi + a_lo` and `a_hi·r = 1000·u_hi + u_lo`,
  `a·n = a·q·10⁶ + u_hi·10⁶ + (1000·u_lo + a_lo·r)`, the last term below 1.001·10⁹, so
  `k = a·q + u_hi + ceil((1000·u_lo + a_lo·r) / 10⁶)`. A float32 product `coverage·n` is off by
  one from about n = 4·10⁶ on (its spacing there is 0.25–0.5).
  """
  a = jnp.asarray(coverage_ppm(coverage), jnp.int32)
  n = jnp.asarray(n, jnp.int32)
  q, r = n // COVERAGE_RESOLUTION, n % COVERAGE_RESOLUTION
  a_hi, a_lo = a // 1000, a % 1000
  u = a_hi * r
  u_hi, u_lo = u // 1000, u % 1000
  rest = 1000 * u_lo + a_lo * r
  k = a * q + u_hi + (rest + COVERAGE_RESOLUTION - 1) // COVERAGE_RESOLUTION
  return jnp.clip(k, 1, jnp.maximum(n, 1))


def _risk_at_k(r: RankedErrors, k: jax.Array) -> jax.Array:
  return r.errors[k - 1] / k.astype(jnp.float32)


@jax.jit
def _ranked(scores, correct, mask):
  return rank_errors(scores, ~correct, mask)


@jax.jit
def _curve(scores, correct, mask):
  r = rank_errors(scores, ~correct, mask)
  total = scores.shape[0]
  k = jnp.minimum(jnp.arange(1, total + 1, dtype=jnp.int32), r.n)
  risk = r.errors[k - 1] / k.astype(jnp.float32)
  return k.astype(jnp.float32) / r.n.astype(jnp.float32), risk


@program_store.jit
def _aurc(scores, correct, mask):
  return _aurc_from_ranked(rank_errors(scores, ~correct, mask))


def _eaurc_from_ranked(r: RankedErrors) -> jax.Array:
  return _aurc_from_ranked(r) - optimal_aurc(r.num_errors, r.n, r.errors.shape[0])


def _augrc_from_ranked(r: RankedErrors) -> jax.Array:
  n = r.n.astype(jnp.float32)
  return jnp.sum(r.errors) / (n * n)


@jax.jit
def _eaurc(scores, correct, mask):
  return _eaurc_from_ranked(rank_errors(scores, ~correct, mask))


@jax.jit
def _augrc(scores, correct, mask):
  return _augrc_from_ranked(rank_errors(scores, ~correct, mask))


@jax.jit
def _coverage_at_risk(scores, correct, mask, risk):
  return _coverage_at_risk_from_ranked(rank_errors(scores, ~correct, mask), risk)


@jax.jit
def _risk_at_coverage(scores, correct, mask, k):
  return _risk_at_k(rank_errors(scores, ~correct, mask), k)


def _percent(x: float) -> str:
  return f"{float(x) * 100:g}".replace(".", "p")


def coverage_at_risk_key(risk: float) -> str:
  """Result key of coverage@risk, e.g. `coverage_at_5pct_risk` (0.05), `..._0p5pct_...` (0.005)."""
  return f"coverage_at_{_percent(risk)}pct_risk"


def risk_at_coverage_key(coverage: float) -> str:
  """Result key of risk@coverage, e.g. `risk_at_80pct_coverage` (0.8)."""
  return f"risk_at_{_percent(coverage)}pct_coverage"


def _check_fraction(value, name: str, *, allow_zero: bool) -> None:
  if isinstance(value, numbers.Real):
    lo_ok = value >= 0 if allow_zero else value > 0
    if not (lo_ok and value <= 1):
      interval = "[0, 1]" if allow_zero else "(0, 1]"
      raise ValueError(f"{name} must be in {interval}, got {value}.")


def risk_coverage_curve(scores: ArrayLike, correct: ArrayLike,
                        mask: Optional[ArrayLike] = None):
  """Tie-aware risk–coverage curve.

  Returns:
    `(coverage, risk)`, float32 arrays of length N: coverage `k/n` and risk `E_k/k` for
    k = 1..n. With a mask (n < N valid samples) the trailing N − n entries repeat the last
    point (coverage 1), so the arrays keep a static shape.
  """
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  return _curve(scores, correct, mask)


def aurc(scores: ArrayLike, correct: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Area under the tie-aware risk–coverage curve, `mean_k E_k/k` (a fraction)."""
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  return _aurc(scores, correct, mask)


def eaurc(scores: ArrayLike, correct: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Excess AURC: `aurc − aurc_opt`, the oracle ranking every error last."""
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  return _eaurc(scores, correct, mask)


def augrc(scores: ArrayLike, correct: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Area under the generalised risk–coverage curve, `mean_k E_k/n` (Traub et al., 2024)."""
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  return _augrc(scores, correct, mask)


def coverage_at_risk(scores: ArrayLike, correct: ArrayLike, risk: float,
                     mask: Optional[ArrayLike] = None) -> jax.Array:
  """Largest coverage `k/n` at a tie-group boundary whose risk `E_k/k` is ≤ `risk` (else 0)."""
  _check_fraction(risk, "risk", allow_zero=True)
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  return _coverage_at_risk(scores, correct, mask, jnp.float32(risk))


def risk_at_coverage(scores: ArrayLike, correct: ArrayLike, coverage: float,
                     mask: Optional[ArrayLike] = None) -> jax.Array:
  """Tie-aware risk `E_k/k` at `k = ceil(coverage·n)` (`coverage_index`); coverage in (0, 1]."""
  _check_fraction(coverage, "coverage", allow_zero=False)
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  n = jnp.int32(scores.shape[0]) if mask is None else jnp.sum(mask, dtype=jnp.int32)
  k = coverage_index(coverage, n)
  return _risk_at_coverage(scores, correct, mask, k)


def _summary_of_ranked(r: RankedErrors, risks, coverages) -> dict:
  value = _aurc_from_ranked(r)
  n = r.n.astype(jnp.float32)
  return {
      "aurc": value,
      "eaurc": value - optimal_aurc(r.num_errors, r.n, r.errors.shape[0]),
      "augrc": jnp.sum(r.errors) / (n * n),
      "coverage_at_risk": jax.vmap(lambda q: _coverage_at_risk_from_ranked(r, q))(risks),
      "risk_at_coverage": jax.vmap(
          lambda c: _risk_at_k(r, coverage_index(c, r.n)))(coverages),
  }


@jax.jit
def _summary(scores, correct, mask, risks, coverages):
  return _summary_of_ranked(rank_errors(scores, ~correct, mask), risks, coverages)


@functools.partial(jax.jit, static_argnames=("num_bins", "norm"))
def _rank_summary(confidence, correct, mask, risks, coverages, num_bins, norm):
  key = jnp.maximum(_sorting.monotone_key(confidence), 1)  # key 0 is reserved for masked
  error = ~correct
  if mask is not None:
    key = jnp.where(mask, key, 0)
    error = error & mask
  errors, boundary, hits, conf_sum = _ranking.ranked_and_groups(key, error, num_bins)
  total = confidence.shape[0]
  n = jnp.int32(total) if mask is None else jnp.sum(mask, dtype=jnp.int32)
  r = RankedErrors(errors, boundary, jnp.sum(error, dtype=jnp.int32), n)
  out = _summary_of_ranked(r, risks, coverages)
  # As `calibration.aece` finishes its groups' sums.
  counts = calibration.aece_group_sizes(n, num_bins)
  out["aece"] = binned.calibration_error_from_bins(
      counts, conf_sum, hits, n.astype(jnp.float32), norm).astype(jnp.float32)
  return out


def _operating_points(risks, coverages) -> tuple[jax.Array, jax.Array]:
  """The summaries' risk and coverage levels, checked, as float32 arrays."""
  for q in risks:
    _check_fraction(q, "risk", allow_zero=True)
  for c in coverages:
    _check_fraction(c, "coverage", allow_zero=False)
  return jnp.asarray(risks, jnp.float32), jnp.asarray(coverages, jnp.float32)


def selective_summary(scores: ArrayLike, correct: ArrayLike, mask: Optional[ArrayLike] = None,
                      *, risks=(0.01, 0.05, 0.1), coverages=(0.5, 0.8, 0.9, 0.95)) -> dict:
  """All selective metrics from one sort: aurc, eaurc, augrc, and the operating points.

  Returns a dict with scalar `aurc`, `eaurc`, `augrc`, and `coverage_at_risk [len(risks)]`,
  `risk_at_coverage [len(coverages)]` (float32 arrays, in the order given).
  """
  risks, coverages = _operating_points(risks, coverages)
  scores, correct, mask = arrays.flatten_scores_correct(scores, correct, mask)
  return _summary(scores, correct, mask, risks, coverages)


def rank_summary(confidence: ArrayLike, correct: ArrayLike, mask: Optional[ArrayLike] = None,
                 *, num_bins: int = 15, norm: str = "l1", risks=(0.01, 0.05, 0.1),
                 coverages=(0.5, 0.8, 0.9, 0.95)) -> dict:
  """`selective_summary` and the adaptive ECE of the same top-label confidences, one sort.

  A report that needs AECE and the selective metrics of one model ranks its confidences once
  (one host sort on CPU) instead of once per metric. `confidence [...]` holds the top-label
  probabilities `max_k p_k` and `correct [...]` whether the argmax is right
  (`metrics.confidence_and_correct`); AECE's groups are those of `calibration.aece`
  (`num_bins`, `norm`), the other keys those of `selective_summary` (`risks`, `coverages`).

  Returns:
    `selective_summary`'s dict with `aece` added: the same values as `aece(probs, labels,
    num_bins, mask, norm=norm)` and `selective_summary(confidence, correct, mask, ...)` (the
    same integer counts; the float32 sums may round in another order, ~1e-7).
  """
  num_bins = arrays.check_num_bins(num_bins)
  norm = binned.check_norm(norm)
  risks, coverages = _operating_points(risks, coverages)
  confidence, correct, mask = arrays.flatten_scores_correct(confidence, correct, mask)
  return _rank_summary(confidence, correct, mask, risks, coverages, num_bins, norm)


def ranked_reduction(metric_fn) -> Optional[Callable[[RankedErrors], jax.Array]]:
  """For `aurc`, `eaurc` or `augrc`: the reduction it applies to `rank_errors(scores,
  ~correct, mask)` (its value is `reduction(rank_errors(...))`, the same operations); None for
  any other function. `metrics.bootstrap` ranks each resample from its counts of the samples
  (`ranked_counts.ranked_from_counts`, no sort) and reduces it as the metric does."""
  return {aurc: _aurc_from_ranked, eaurc: _eaurc_from_ranked,
          augrc: _augrc_from_ranked}.get(metric_fn)

