"""`ConfidenceHistogram`: the streaming accumulator of AECE and the selective metrics.

AECE and the selective metrics (AURC, E-AURC, AUGRC, coverage@risk, risk@coverage) rank the
samples by confidence, which sums cannot do exactly. The accumulator keeps a fine histogram of
the confidence (per bin: samples, errors, and Σ (bin top − c)), treats each fine bin as a tie
group, and `compute()` returns, besides the metrics, a rigorous upper bound of their deviation
from the exact one-shot values (`aurc_error_bound`, `aece_error_bound`, `augrc_error_bound`).

Fine histogram: bins are uniform in the float32 bit pattern of `u = 1 − c` with `score_bits`
mantissa bits, i.e. a relative resolution of `2^−score_bits` in `1 − c` down to `u = 2^−24`.
Confidences near 1 are resolved as finely as float32 itself stores them: a bin narrower than
float32's spacing holds a single value, is an exact tie group, and contributes no error.

With `E_a` the errors before a bin of `m` samples and `e` errors, `a` samples before it, and
errors spread evenly inside it, `AURC = Σ_bins Σ_{t=1}^{m} (E_a + t·e/m)/(a + t) / N`
`= Σ_bins [E_a·H + (e/m)(m − a·H)] / N` with `H = Σ_{t=1}^{m} 1/(a + t)`;
`AUGRC = Σ_bins [m·E_a + e(m + 1)/2] / N²`; AECE cuts the ascending order into equal-mass groups,
splitting a fine bin proportionally, and applies `calibration.ece_from_bins` to the groups.
"""
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import arrays
from calib_jax.metrics import calibration
from calib_jax.metrics import selective
from calib_jax.metrics._arrays import safe_div
from calib_jax.metrics.accumulators import (Accumulator, Batch, finish, pytree_dataclass,
                                            static_field, to_host)

_MIN_EXPONENT = 103           # float32 exponent field of 2^−24, the finest step of 1 − c
_BASE_BITS = _MIN_EXPONENT << 23
_TINY_EPS = 2.0**-24
_HARMONIC_EXACT = 16          # below this, harmonic numbers come from a table


def num_fine_bins(score_bits: int) -> int:
  """Number of fine confidence bins for `score_bits` mantissa bits."""
  return 24 * 2**score_bits + 2


def fine_bin(conf: jax.Array, score_bits: int) -> jax.Array:
  """Fine histogram index of each confidence; index 0 is `c = 1`, increasing as c decreases."""
  u = 1.0 - jnp.clip(conf, 0.0, 1.0)
  bits = lax.bitcast_convert_type(u, jnp.int32)
  idx = ((bits - _BASE_BITS) >> (23 - score_bits)) + 1
  return jnp.where(bits < _BASE_BITS, 0, idx).astype(jnp.int32)


@functools.lru_cache(maxsize=None)
def _fine_bin_tops(score_bits: int) -> np.ndarray:
  """Largest confidence `1 − u_lo` of each fine bin (float32); confidences are stored as
  offsets below it, which keeps their float32 sums accurate."""
  k = num_fine_bins(score_bits)
  j = np.arange(1, k, dtype=np.int64)
  lo = (_BASE_BITS + ((j - 1) << (23 - score_bits))).astype(np.uint32).view(np.float32)
  return np.concatenate([[1.0], 1.0 - lo.astype(np.float64)]).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _fine_bin_widths(score_bits: int):
  """Width in c of each fine bin, plus one float32 ulp for the rounding of `1 − c`; and
  whether the bin can hold only one float32 value (an exact tie group)."""
  k = num_fine_bins(score_bits)
  j = np.arange(1, k, dtype=np.int64)
  lo = (_BASE_BITS + ((j - 1) << (23 - score_bits))).astype(np.uint32).view(np.float32)
  hi = (_BASE_BITS + (j << (23 - score_bits))).astype(np.uint32).view(np.float32)
  hi = np.minimum(hi, np.float32(1.0))
  width = np.concatenate([[0.0], hi.astype(np.float64) - lo]).astype(np.float64)
  # A bin no wider than float32's spacing of 1 − c (for c ≥ 0.5) holds one value: exact tie.
  single = np.concatenate([[True], (width[1:] <= _TINY_EPS) & (hi <= 0.5)])
  return np.where(single, 0.0, width + _TINY_EPS).astype(np.float32), single


def _harmonic_gap(a: np.ndarray, m: np.ndarray) -> np.ndarray:
  """`Σ_{t=1}^{m} 1/(a + t)` for integer arrays a ≥ 0, m ≥ 0 (float64, relative error < 1e-12)."""
  a = np.asarray(a, np.float64)
  top = a + np.asarray(m, np.float64)
  table = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, _HARMONIC_EXACT + 1))])
  exact = (table[np.minimum(top, _HARMONIC_EXACT).astype(np.int64)]
           - table[np.minimum(a, _HARMONIC_EXACT).astype(np.int64)])
  x0 = np.maximum(a, _HARMONIC_EXACT) + 0.5
  x1 = np.maximum(top, _HARMONIC_EXACT) + 0.5
  # H(x) = ln(x + 1/2) + γ + 1/(24 (x + 1/2)^2) − 7/(960 (x + 1/2)^4) + O(x^-6).
  asym = (np.log1p((x1 - x0) / x0) + (1 / (24 * x1**2) - 1 / (24 * x0**2))
          - 7 / 960 * (1 / x1**4 - 1 / x0**4))
  return exact + asym


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
  return np.concatenate([[0], np.cumsum(x)])


def _selective_from_histogram(m, e, score_bits: int, risks, coverages) -> dict:
  """AURC-family metrics from the fine histogram (int64 counts `m` and errors `e` per bin, in
  descending-confidence order)."""
  _, exact_bin = _fine_bin_widths(score_bits)
  n = int(m.sum())
  a = _exclusive_cumsum(m)[:-1]
  e_before = _exclusive_cumsum(e)[:-1].astype(np.float64)
  gap = _harmonic_gap(a, m)
  mean_err = safe_div(e, m)
  # Σ_{t=1}^{m} (E_a + t·e/m)/(a + t) = E_a·gap + (e/m)·(m − a·gap)
  aurc = safe_div(np.sum(e_before * gap + mean_err * (m - a * gap)), n)
  num_errors = int(e.sum())
  n_ok = n - num_errors
  aurc_opt = safe_div(num_errors - n_ok * _harmonic_gap(n_ok, num_errors), n)
  augrc = safe_div(np.sum(m * e_before + e * (m + 1) / 2), float(n) * n)
  # Within a bin of m samples with e errors, any order moves E by at most min(e, m − e).
  minority = np.where(exact_bin, 0, np.minimum(e, m - e))
  out = {"aurc": aurc, "eaurc": aurc - aurc_opt, "augrc": augrc,
         "aurc_error_bound": safe_div(np.sum(minority * gap), n),
         "augrc_error_bound": safe_div(np.sum(minority * m), float(n) * n)}
  k_end = a + m
  e_end = e_before + e
  for q in risks:
    ok = (m > 0) & (e_end <= q * np.maximum(k_end, 1))
    out[selective.coverage_at_risk_key(q)] = safe_div(np.max(np.where(ok, k_end, 0)), n)
  for c in coverages:
    # selective.coverage_index's formula in Python integers (n may exceed int32 here).
    k = min(max(1, -(-selective.coverage_ppm(c) * n // selective.COVERAGE_RESOLUTION)), max(n, 1))
    j = min(int(np.searchsorted(k_end, k, side="left")), len(m) - 1)
    out[selective.risk_at_coverage_key(c)] = safe_div(
        e_before[j] + (k - a[j]) * mean_err[j], k if n else 0)
  return out


def _aece_from_histogram(counts, errors, offsets, score_bits: int, num_bins: int):
  """AECE with equal-mass groups cut inside fine bins proportionally, plus its error bound
  (int64 counts and errors, float64 offsets per fine bin)."""
  widths, exact_bin = _fine_bin_widths(score_bits)
  tops = _fine_bin_tops(score_bits).astype(np.float64)
  # Ascending confidence = descending fine index.
  m = counts[::-1]
  hits = (counts - errors)[::-1].astype(np.float64)
  conf = (counts * tops - offsets)[::-1]
  widths, exact_bin = widths[::-1].astype(np.float64), exact_bin[::-1]
  n = int(m.sum())
  q, r = divmod(n, num_bins)
  g = np.arange(num_bins + 1)
  split = np.where(g <= r, g * (q + 1), r * (q + 1) + (g - r) * q)
  cum_m = _exclusive_cumsum(m)
  j = np.clip(np.searchsorted(cum_m, split, side="right") - 1, 0, len(m) - 1)
  taken = (split - cum_m[j]).astype(np.float64)
  mj = np.maximum(m[j], 1).astype(np.float64)
  hits_at = _exclusive_cumsum(hits)[j] + taken * hits[j] / mj
  conf_at = _exclusive_cumsum(conf)[j] + taken * conf[j] / mj
  aece = calibration.ece_from_bins(np.diff(conf_at), np.diff(hits_at), n)
  # A cut inside bin j misplaces at most min(taken, rest, hits, misses) correct samples and
  # min(taken, rest)·width of confidence; each cut affects two groups.
  rest = mj - taken
  dev = (np.minimum(np.minimum(taken, rest), np.minimum(hits[j], mj - hits[j]))
         + np.minimum(taken, rest) * widths[j])
  dev = np.where(exact_bin[j] | (taken <= 0), 0.0, dev)
  return aece, safe_div(2.0 * np.sum(dev[1:-1]), n)


@pytree_dataclass
class ConfidenceHistogram(Accumulator):
  """Fine histogram of the confidence: AECE and the selective metrics (see the module doc).

  `compute()` gives aece (`num_bins` equal-mass groups), aurc, eaurc, augrc, their error bounds
  and one key per operating point: `coverage_at_{r}pct_risk` for r in `risks`,
  `risk_at_{c}pct_coverage` for c in `coverages` (e.g. coverage_at_5pct_risk,
  risk_at_80pct_coverage).
  """
  num_bins: int = static_field()
  score_bits: int = static_field()
  counts: jax.Array         # int32 [K], samples per fine bin
  errors: jax.Array         # int32 [K], wrong predictions per fine bin
  offsets: jax.Array        # f32 [K], Σ (bin top − c)

  @classmethod
  def init(cls, num_bins: int = 15, *, score_bits: int = 12) -> "ConfidenceHistogram":
    """Empty histogram of `24·2^score_bits + 2` fine bins; `num_bins` AECE groups."""
    num_bins = arrays.check_num_bins(num_bins)
    if not isinstance(score_bits, int) or not 0 <= score_bits <= 16:
      raise ValueError(f"score_bits must be an int in [0, 16], got {score_bits!r}.")
    k = num_fine_bins(score_bits)
    return cls(num_bins=num_bins, score_bits=score_bits, counts=jnp.zeros(k, jnp.int32),
               errors=jnp.zeros(k, jnp.int32), offsets=jnp.zeros(k, jnp.float32))

  def add(self, b: Batch) -> "ConfidenceHistogram":
    k = self.counts.shape[0]
    fine = fine_bin(b.confidence, self.score_bits)
    offsets = jnp.asarray(_fine_bin_tops(self.score_bits))[fine] - b.confidence
    fine = jnp.where(b.valid, fine, k)  # masked entries go to a dropped extra bin
    wrong = b.valid & ~b.correct
    return self.replace(
        counts=self.counts + jax.ops.segment_sum(jnp.ones_like(fine), fine, k + 1)[:k],
        errors=self.errors + jax.ops.segment_sum(wrong.astype(jnp.int32), fine, k + 1)[:k],
        offsets=self.offsets + jax.ops.segment_sum(offsets, fine, k + 1)[:k])

  def compute(self, *, risks: Sequence[float] = (0.01, 0.05, 0.10),
              coverages: Sequence[float] = (0.5, 0.8, 0.9, 0.95)) -> dict:
    """aece, aurc, eaurc, augrc, the error bounds and the operating points (see the class)."""
    for q in risks:
      if not 0 <= q <= 1:
        raise ValueError(f"risks must be in [0, 1], got {q}.")
    for c in coverages:
      if not 0 < c <= 1:
        raise ValueError(f"coverages must be in (0, 1], got {c}.")
    counts, errors, offsets = (to_host(x) for x in (self.counts, self.errors, self.offsets))
    out = _selective_from_histogram(counts, errors, self.score_bits,
                                    tuple(float(q) for q in risks),
                                    tuple(float(c) for c in coverages))
    out["aece"], out["aece_error_bound"] = _aece_from_histogram(
        counts, errors, offsets, self.score_bits, self.num_bins)
    return finish(out)
