"""Streaming accumulation of every metric over batches and devices.

```python
acc = metrics.StreamingMetrics.init(num_classes=C)
for batch in eval_set:
  acc = acc.update(logits=logits, labels=labels, mask=mask)   # or probs=...
acc = acc.psum("batch")       # inside shard_map / pmap, to combine devices
summary = acc.result()        # dict of float32 scalars (and per-bin arrays)
```

The state is an immutable pytree whose leaves are all sums, so `merge` is `+` and combining
devices is a `psum`. ECE, MCE, classwise ECE, NLL, Brier, accuracy, confidence and mIoU are
exact (bin sums). AECE and the selective metrics (AURC, E-AURC, AUGRC, coverage@risk,
risk@coverage) come from a fine histogram of the confidence, treating each fine bin as a tie
group; `result()` also returns a rigorous upper bound of their deviation from the exact
one-shot values (`aurc_error_bound`, `aece_error_bound`, `augrc_error_bound`).

Fine histogram: bins are uniform in the float32 bit pattern of `u = 1 − c` with `score_bits`
mantissa bits, i.e. a relative resolution of `2^−score_bits` in `1 − c` down to `u = 2^−24`.
Confidences near 1 are resolved as finely as float32 itself stores them: a bin narrower than
float32's spacing holds a single value, is an exact tie group, and contributes no error.
"""
import functools
from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax.metrics import _checks
from calib_jax.metrics import calibration
from calib_jax.metrics import segmentation

ArrayLike = jax.typing.ArrayLike

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


def _fine_bin_tops(score_bits: int) -> np.ndarray:
  """Largest confidence `1 − u_lo` of each fine bin (float32); confidences are stored as
  offsets below it, which keeps their float32 sums accurate."""
  k = num_fine_bins(score_bits)
  j = np.arange(1, k, dtype=np.int64)
  lo = (_BASE_BITS + ((j - 1) << (23 - score_bits))).astype(np.uint32).view(np.float32)
  return np.concatenate([[1.0], 1.0 - lo.astype(np.float64)]).astype(np.float32)


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


def _harmonic_gap(a: jax.Array, m: jax.Array) -> jax.Array:
  """`Σ_{t=1}^{m} 1/(a + t)` for int arrays a ≥ 0, m ≥ 0, accurate in float32."""
  table = jnp.asarray(np.cumsum([0.0] + [1.0 / k for k in range(1, _HARMONIC_EXACT + 1)]),
                      jnp.float32)
  top = a + m
  lo_cut = jnp.minimum(a, _HARMONIC_EXACT)
  hi_cut = jnp.minimum(top, _HARMONIC_EXACT)
  exact = table[hi_cut] - table[lo_cut]
  x0 = jnp.maximum(a, _HARMONIC_EXACT).astype(jnp.float32) + 0.5
  x1 = jnp.maximum(top, _HARMONIC_EXACT).astype(jnp.float32) + 0.5
  # H(x) ≈ ln(x + 1/2) + γ + 1/(24 (x + 1/2)^2), error < 1e-7 for x ≥ 16.
  asym = jnp.log1p((x1 - x0) / x0) + (1.0 / (24.0 * x1 * x1) - 1.0 / (24.0 * x0 * x0))
  return exact + asym


@flax.struct.dataclass
class StreamingMetrics:
  """Sums from which every metric is computed; see the module docstring."""
  num_classes: int = flax.struct.field(pytree_node=False)
  num_bins: int = flax.struct.field(pytree_node=False)
  score_bits: int = flax.struct.field(pytree_node=False)
  count: jax.Array               # int32 [], valid samples
  num_correct: jax.Array         # int32 []
  nll_sum: jax.Array             # f32 []
  brier_sum: jax.Array           # f32 []
  confidence_sum: jax.Array      # f32 []
  wrong_confidence_sum: jax.Array   # f32 [], Σ c over wrong predictions
  right_doubt_sum: jax.Array        # f32 [], Σ (1 − c) over correct predictions
  bin_counts: jax.Array          # int32 [B]
  bin_confidence: jax.Array      # f32 [B]
  bin_hits: jax.Array            # int32 [B]
  class_confidence: jax.Array    # f32 [C, B]
  class_hits: jax.Array          # int32 [C, B]
  fine_counts: jax.Array         # int32 [K]
  fine_errors: jax.Array         # int32 [K]
  fine_offsets: jax.Array        # f32 [K], Σ (bin top − c)
  confusion: Optional[jax.Array]  # int32 [C, C] or None

  @classmethod
  def init(cls, num_classes: int, num_bins: int = 15, *, score_bits: int = 12,
           confusion: bool = True) -> "StreamingMetrics":
    """Empty accumulator.

    Args:
      num_classes: C, the width of the logits.
      num_bins: equal-width bins for ECE/MCE/classwise ECE and the number of AECE groups.
      score_bits: resolution of the fine confidence histogram (24·2^bits + 2 bins).
      confusion: also accumulate a `[C, C]` confusion matrix for mIoU.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
      raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
    num_bins = _checks.check_num_bins(num_bins)
    if not isinstance(score_bits, int) or not 0 <= score_bits <= 16:
      raise ValueError(f"score_bits must be an int in [0, 16], got {score_bits!r}.")
    k = num_fine_bins(score_bits)
    zi, zf = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
    return cls(
        num_classes=num_classes, num_bins=num_bins, score_bits=score_bits,
        count=zi, num_correct=zi, nll_sum=zf, brier_sum=zf, confidence_sum=zf,
        wrong_confidence_sum=zf, right_doubt_sum=zf,
        bin_counts=jnp.zeros(num_bins, jnp.int32),
        bin_confidence=jnp.zeros(num_bins, jnp.float32),
        bin_hits=jnp.zeros(num_bins, jnp.int32),
        class_confidence=jnp.zeros((num_classes, num_bins), jnp.float32),
        class_hits=jnp.zeros((num_classes, num_bins), jnp.int32),
        fine_counts=jnp.zeros(k, jnp.int32), fine_errors=jnp.zeros(k, jnp.int32),
        fine_offsets=jnp.zeros(k, jnp.float32),
        confusion=(jnp.zeros((num_classes, num_classes), jnp.int32) if confusion else None))

  def update(self, *, labels: ArrayLike, logits: Optional[ArrayLike] = None,
             probs: Optional[ArrayLike] = None,
             mask: Optional[ArrayLike] = None) -> "StreamingMetrics":
    """Adds a batch: exactly one of `logits [..., C]` / `probs [..., C]`, labels `[...]`.

    NLL is exact from logits (log-softmax); from probs, `p_y` is clipped at float32 tiny.
    `mask [...]` (bool) selects valid entries, e.g. padding or segmentation ignore pixels.
    Out-of-range labels at valid positions raise when concrete (not inside a trace).
    """
    if (logits is None) == (probs is None):
      raise ValueError("pass exactly one of logits= or probs=.")
    x = logits if logits is not None else probs
    shape = tuple(np.shape(x))
    if not shape or shape[-1] != self.num_classes:
      raise ValueError(
          f"{'logits' if logits is not None else 'probs'} must have shape [..., "
          f"{self.num_classes}], got {shape}.")
    if int(np.prod(shape[:-1])) == 0:
      return self  # an empty batch adds nothing
    x, labels, mask = _checks.flatten_probs_labels(x, labels, mask)
    return _update(self, x, labels, mask, logits is not None)

  def merge(self, other: "StreamingMetrics") -> "StreamingMetrics":
    """Sum of two accumulators with the same configuration."""
    if not isinstance(other, StreamingMetrics):
      raise TypeError(f"can only merge with StreamingMetrics, got {type(other).__name__}.")
    config = (self.num_classes, self.num_bins, self.score_bits, self.confusion is None)
    other_config = (other.num_classes, other.num_bins, other.score_bits,
                    other.confusion is None)
    if config != other_config:
      raise ValueError(f"cannot merge accumulators with configs {config} and {other_config}.")
    return jax.tree_util.tree_map(jnp.add, self, other)

  def psum(self, axis_name) -> "StreamingMetrics":
    """Sums the accumulators of all devices along `axis_name` (inside shard_map/pmap)."""
    return jax.tree_util.tree_map(lambda x: lax.psum(x, axis_name), self)

  def result(self, *, risks: Sequence[float] = (0.01, 0.05, 0.10),
             coverages: Sequence[float] = (0.5, 0.8, 0.9, 0.95)) -> dict:
    """All metrics as a dict of float32 arrays (fractions, not percent).

    Scalars: accuracy, ece, mce, aece, classwise_ece, nll, brier, average_confidence,
    overconfidence, underconfidence, aurc, eaurc, augrc, the error bounds of the histogram
    estimates (aurc_error_bound, aece_error_bound, augrc_error_bound), num_samples, and when
    tracked miou. One key per operating point: `coverage_at_{r}pct_risk` for r in `risks`,
    `risk_at_{c}pct_coverage` for c in `coverages` (e.g. coverage_at_5pct_risk,
    risk_at_80pct_coverage). Arrays: reliability_counts / reliability_confidence /
    reliability_accuracy `[B]`, and per_class_iou `[C]` when tracked. An empty accumulator
    gives zeros.
    """
    for q in risks:
      if not 0 <= q <= 1:
        raise ValueError(f"risks must be in [0, 1], got {q}.")
    for c in coverages:
      if not 0 < c <= 1:
        raise ValueError(f"coverages must be in (0, 1], got {c}.")
    return _result(self, tuple(float(q) for q in risks), tuple(float(c) for c in coverages))


def _percent_name(x: float) -> str:
  return f"{x * 100:g}".replace(".", "p")


@functools.partial(jax.jit, static_argnames="from_logits")
def _update(state: StreamingMetrics, x, labels, mask, from_logits: bool) -> StreamingMetrics:
  num_classes, num_bins = state.num_classes, state.num_bins
  if from_logits:
    logp = jax.nn.log_softmax(x, axis=-1)
    probs = jnp.exp(logp)
  else:
    probs = x
    logp = None
  safe_labels = jnp.clip(labels, 0, num_classes - 1)
  valid = jnp.ones(labels.shape, bool) if mask is None else mask
  conf, correct = calibration.confidence_and_correct(probs, labels)
  wrong = valid & ~correct
  right = valid & correct

  def total(v):
    return jnp.sum(jnp.where(valid, v, 0.0))

  if logp is not None:
    lp = jnp.take_along_axis(logp, safe_labels[:, None], 1)[:, 0]
  else:
    p_y = jnp.take_along_axis(probs, safe_labels[:, None], 1)[:, 0]
    lp = jnp.log(jnp.maximum(p_y, jnp.finfo(jnp.float32).tiny))
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  brier = jnp.sum(jnp.square(probs - onehot), axis=-1)

  counts, conf_sum, hits = calibration.bin_sums(conf, correct, mask, num_bins)
  class_conf, class_hits = calibration.classwise_bin_sums(probs, labels, mask, num_bins)

  k = state.fine_counts.shape[0]
  fine = fine_bin(conf, state.score_bits)
  offsets = jnp.asarray(_fine_bin_tops(state.score_bits))[fine] - conf
  fine = jnp.where(valid, fine, k)
  fine_counts = jax.ops.segment_sum(jnp.ones_like(fine), fine, k + 1)[:k]
  fine_errors = jax.ops.segment_sum(wrong.astype(jnp.int32), fine, k + 1)[:k]
  fine_offsets = jax.ops.segment_sum(offsets, fine, k + 1)[:k]

  confusion = state.confusion
  if confusion is not None:
    pred = jnp.argmax(probs, axis=-1).astype(jnp.int32)
    confusion = confusion + segmentation._confusion(pred, labels, mask, num_classes)  # pylint: disable=protected-access

  return state.replace(
      count=state.count + jnp.sum(valid, dtype=jnp.int32),
      num_correct=state.num_correct + jnp.sum(right, dtype=jnp.int32),
      nll_sum=state.nll_sum - total(lp),
      brier_sum=state.brier_sum + total(brier),
      confidence_sum=state.confidence_sum + total(conf),
      wrong_confidence_sum=state.wrong_confidence_sum + jnp.sum(jnp.where(wrong, conf, 0.0)),
      right_doubt_sum=state.right_doubt_sum + jnp.sum(jnp.where(right, 1.0 - conf, 0.0)),
      bin_counts=state.bin_counts + counts,
      bin_confidence=state.bin_confidence + conf_sum,
      bin_hits=state.bin_hits + hits,
      class_confidence=state.class_confidence + class_conf,
      class_hits=state.class_hits + class_hits,
      fine_counts=state.fine_counts + fine_counts,
      fine_errors=state.fine_errors + fine_errors,
      fine_offsets=state.fine_offsets + fine_offsets,
      confusion=confusion)


def _div(num, den):
  den = jnp.asarray(den, jnp.float32)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0).astype(jnp.float32)


def _exclusive_cumsum(x):
  return jnp.concatenate([jnp.zeros(1, x.dtype), jnp.cumsum(x)])


def _selective_from_histogram(state: StreamingMetrics, risks, coverages):
  """AURC-family metrics from the fine histogram (bins in descending-confidence order)."""
  widths, single = _fine_bin_widths(state.score_bits)
  exact_bin = jnp.asarray(single)
  m, e = state.fine_counts, state.fine_errors
  n = state.count
  nf = n.astype(jnp.float32)
  a = _exclusive_cumsum(m)[:-1]
  e_before = _exclusive_cumsum(e)[:-1].astype(jnp.float32)
  mf, ef, af = m.astype(jnp.float32), e.astype(jnp.float32), a.astype(jnp.float32)
  gap = _harmonic_gap(a, m)
  mean_err = _div(ef, mf)
  aurc_terms = e_before * gap + mean_err * (mf - af * gap)
  aurc = _div(jnp.sum(aurc_terms), nf)
  num_errors = jnp.sum(e)
  n_ok = n - num_errors
  aurc_opt = _div(num_errors.astype(jnp.float32) - n_ok.astype(jnp.float32)
                  * _harmonic_gap(n_ok, num_errors), nf)
  augrc = _div(jnp.sum(mf * e_before + ef * (mf + 1.0) / 2.0), nf * nf)
  minority = jnp.where(exact_bin, 0.0, jnp.minimum(ef, mf - ef))
  aurc_bound = _div(jnp.sum(minority * gap), nf)
  augrc_bound = _div(jnp.sum(minority * mf), nf * nf)

  # Operating points; k and E at the end of every fine bin.
  k_end = a + m
  e_end = e_before + ef
  nonempty = m > 0
  out = {"aurc": aurc, "eaurc": aurc - aurc_opt, "augrc": augrc,
         "aurc_error_bound": aurc_bound, "augrc_error_bound": augrc_bound}
  for q in risks:
    ok = nonempty & (e_end / jnp.maximum(k_end, 1).astype(jnp.float32) <= q)
    out[f"coverage_at_{_percent_name(q)}pct_risk"] = _div(
        jnp.max(jnp.where(ok, k_end, 0)).astype(jnp.float32), nf)
  for c in coverages:
    kk = jnp.clip(jnp.ceil(c * nf * (1.0 - 2.0**-22)).astype(jnp.int32), 1, jnp.maximum(n, 1))
    j = jnp.clip(jnp.searchsorted(k_end, kk, side="left"), 0, m.shape[0] - 1)
    errors_k = e_before[j] + (kk - a[j]).astype(jnp.float32) * mean_err[j]
    out[f"risk_at_{_percent_name(c)}pct_coverage"] = _div(errors_k, kk)
  return out, jnp.asarray(widths), exact_bin


def _aece_from_histogram(state: StreamingMetrics, widths, exact_bin):
  """AECE with equal-mass groups cut inside fine bins proportionally, plus its error bound."""
  # Ascending confidence = descending fine index.
  m = state.fine_counts[::-1]
  hits = (state.fine_counts - state.fine_errors)[::-1].astype(jnp.float32)
  tops = jnp.asarray(_fine_bin_tops(state.score_bits))
  conf = (state.fine_counts.astype(jnp.float32) * tops - state.fine_offsets)[::-1]
  widths, exact_bin = widths[::-1], exact_bin[::-1]
  n = state.count
  num_bins = state.num_bins
  q, r = n // num_bins, n % num_bins
  g = jnp.arange(num_bins + 1, dtype=jnp.int32)
  split = jnp.where(g <= r, g * (q + 1), r * (q + 1) + (g - r) * q)
  cum_m = _exclusive_cumsum(m)
  cum_h = _exclusive_cumsum(hits)
  cum_c = _exclusive_cumsum(conf)
  j = jnp.clip(jnp.searchsorted(cum_m, split, side="right") - 1, 0, m.shape[0] - 1)
  taken = (split - cum_m[j]).astype(jnp.float32)
  mj = jnp.maximum(m[j], 1).astype(jnp.float32)
  hits_at = cum_h[j] + taken * hits[j] / mj
  conf_at = cum_c[j] + taken * conf[j] / mj
  group_gap = jnp.abs(jnp.diff(hits_at) - jnp.diff(conf_at))
  aece = _div(jnp.sum(group_gap), n)
  rest = mj - taken
  hj = hits[j]
  dev = jnp.minimum(jnp.minimum(taken, rest), jnp.minimum(hj, mj - hj))
  dev = dev + jnp.minimum(taken, rest) * widths[j]
  dev = jnp.where(exact_bin[j] | (taken <= 0), 0.0, dev)
  return aece, _div(2.0 * jnp.sum(dev[1:-1]), n)


@functools.partial(jax.jit, static_argnames=("risks", "coverages"))
def _result(state: StreamingMetrics, risks, coverages) -> dict:
  n = state.count
  gaps = jnp.abs(state.bin_hits.astype(jnp.float32) - state.bin_confidence)
  class_gap = jnp.abs(state.class_hits.astype(jnp.float32) - state.class_confidence)
  out = {
      "num_samples": n,
      "accuracy": _div(state.num_correct.astype(jnp.float32), n),
      "ece": _div(jnp.sum(gaps), n),
      "mce": jnp.max(jnp.where(state.bin_counts > 0,
                               gaps / jnp.maximum(state.bin_counts, 1), 0.0)),
      "classwise_ece": _div(jnp.sum(class_gap), n * state.num_classes),
      "nll": _div(state.nll_sum, n),
      "brier": _div(state.brier_sum, n),
      "average_confidence": _div(state.confidence_sum, n),
      "overconfidence": _div(state.wrong_confidence_sum, n - state.num_correct),
      "underconfidence": _div(state.right_doubt_sum, state.num_correct),
      "reliability_counts": state.bin_counts,
      "reliability_confidence": _div(state.bin_confidence, state.bin_counts),
      "reliability_accuracy": _div(state.bin_hits.astype(jnp.float32), state.bin_counts),
  }
  selective, widths, exact_bin = _selective_from_histogram(state, risks, coverages)
  out.update(selective)
  out["aece"], out["aece_error_bound"] = _aece_from_histogram(state, widths, exact_bin)
  if state.confusion is not None:
    out["miou"], out["per_class_iou"] = segmentation.iou_from_confusion(state.confusion)
  return out
