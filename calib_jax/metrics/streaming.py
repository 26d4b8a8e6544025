"""Streaming accumulation of every metric over batches and devices.

```python
acc = metrics.StreamingMetrics.init(num_classes=C)
for batch in eval_set:
  acc = acc.update(logits=logits, labels=labels, mask=mask)   # or probs=...
acc = acc.psum("batch")       # inside shard_map / pmap, to combine devices
summary = acc.result()        # on the host: dict of float32 scalars (and per-bin arrays)
```

The state is an immutable pytree whose leaves are all sums, so `merge` is `+` and combining
devices is a `psum`; `init`, `update`, `merge` and `psum` are jit-able and run on device.
`result()` reads the sums (a few MB) and finishes on the host in float64. ECE, MCE, classwise ECE, NLL, Brier, accuracy, confidence and mIoU are
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
import math
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
    """All metrics as a dict of numpy float32 values (fractions, not percent).

    Runs on the host in float64 from the accumulated sums (a few MB); call it outside `jit`,
    after `psum`/`merge` have combined the devices.

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
  safe_labels = jnp.clip(labels, 0, num_classes - 1)
  if from_logits:
    # The same arithmetic as jax.nn.softmax, so streaming(logits) == one-shot(softmax(logits)).
    shifted = x - jnp.max(x, axis=-1, keepdims=True)
    unnormalized = jnp.exp(shifted)
    total_exp = jnp.sum(unnormalized, axis=-1)
    probs = unnormalized / total_exp[:, None]
    lp = jnp.take_along_axis(shifted, safe_labels[:, None], 1)[:, 0] - jnp.log(total_exp)
  else:
    probs = x
    p_y = jnp.take_along_axis(probs, safe_labels[:, None], 1)[:, 0]
    lp = jnp.log(jnp.maximum(p_y, jnp.finfo(jnp.float32).tiny))
  valid = jnp.ones(labels.shape, bool) if mask is None else mask
  # The barrier keeps XLA from re-fusing the argmax into each of the scatters below.
  pred, conf = lax.optimization_barrier(calibration.prediction_and_confidence(probs))
  correct = pred == labels
  wrong = valid & ~correct
  right = valid & correct

  def total(v):
    return jnp.sum(jnp.where(valid, v, 0.0))

  brier = calibration.brier_per_sample(probs, labels)

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
    confusion = confusion + segmentation.confusion_counts(pred, labels, mask, num_classes)

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


def _div(num, den) -> np.ndarray:
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
  return np.concatenate([[0], np.cumsum(x)])


def _selective_from_histogram(state: "_HostState", risks, coverages) -> dict:
  """AURC-family metrics from the fine histogram (bins in descending-confidence order)."""
  _, exact_bin = _fine_bin_widths(state.score_bits)
  m = state.fine_counts.astype(np.int64)
  e = state.fine_errors.astype(np.int64)
  n = int(m.sum())
  a = _exclusive_cumsum(m)[:-1]
  e_before = _exclusive_cumsum(e)[:-1].astype(np.float64)
  gap = _harmonic_gap(a, m)
  mean_err = _div(e, m)
  # Σ_{t=1}^{m} (E_a + t·e/m)/(a + t) = E_a·gap + (e/m)·(m − a·gap)
  aurc = _div(np.sum(e_before * gap + mean_err * (m - a * gap)), n)
  num_errors = int(e.sum())
  n_ok = n - num_errors
  aurc_opt = _div(num_errors - n_ok * _harmonic_gap(n_ok, num_errors), n)
  augrc = _div(np.sum(m * e_before + e * (m + 1) / 2), float(n) * n)
  # Within a bin of m samples with e errors, any order moves E by at most min(e, m − e).
  minority = np.where(exact_bin, 0, np.minimum(e, m - e))
  out = {"aurc": aurc, "eaurc": aurc - aurc_opt, "augrc": augrc,
         "aurc_error_bound": _div(np.sum(minority * gap), n),
         "augrc_error_bound": _div(np.sum(minority * m), float(n) * n)}
  k_end = a + m
  e_end = e_before + e
  for q in risks:
    ok = (m > 0) & (e_end <= q * np.maximum(k_end, 1))
    out[f"coverage_at_{_percent_name(q)}pct_risk"] = _div(np.max(np.where(ok, k_end, 0)), n)
  for c in coverages:
    k = min(max(1, math.ceil(c * n)), max(n, 1))
    j = min(int(np.searchsorted(k_end, k, side="left")), len(m) - 1)
    out[f"risk_at_{_percent_name(c)}pct_coverage"] = _div(
        e_before[j] + (k - a[j]) * mean_err[j], k if n else 0)
  return out


def _aece_from_histogram(state: "_HostState"):
  """AECE with equal-mass groups cut inside fine bins proportionally, plus its error bound."""
  widths, exact_bin = _fine_bin_widths(state.score_bits)
  tops = _fine_bin_tops(state.score_bits).astype(np.float64)
  # Ascending confidence = descending fine index.
  m = state.fine_counts.astype(np.int64)[::-1]
  hits = (state.fine_counts.astype(np.int64) - state.fine_errors)[::-1].astype(np.float64)
  conf = (state.fine_counts * tops - state.fine_offsets.astype(np.float64))[::-1]
  widths, exact_bin = widths[::-1].astype(np.float64), exact_bin[::-1]
  n = int(m.sum())
  q, r = divmod(n, state.num_bins)
  g = np.arange(state.num_bins + 1)
  split = np.where(g <= r, g * (q + 1), r * (q + 1) + (g - r) * q)
  cum_m = _exclusive_cumsum(m)
  j = np.clip(np.searchsorted(cum_m, split, side="right") - 1, 0, len(m) - 1)
  taken = (split - cum_m[j]).astype(np.float64)
  mj = np.maximum(m[j], 1).astype(np.float64)
  hits_at = _exclusive_cumsum(hits)[j] + taken * hits[j] / mj
  conf_at = _exclusive_cumsum(conf)[j] + taken * conf[j] / mj
  aece = _div(np.sum(np.abs(np.diff(hits_at) - np.diff(conf_at))), n)
  # A cut inside bin j misplaces at most min(taken, rest, hits, misses) correct samples and
  # min(taken, rest)·width of confidence; each cut affects two groups.
  rest = mj - taken
  dev = (np.minimum(np.minimum(taken, rest), np.minimum(hits[j], mj - hits[j]))
         + np.minimum(taken, rest) * widths[j])
  dev = np.where(exact_bin[j] | (taken <= 0), 0.0, dev)
  return aece, _div(2.0 * np.sum(dev[1:-1]), n)


class _HostState:
  """The accumulator's arrays pulled to the host as numpy (float64 for sums)."""

  def __init__(self, state: StreamingMetrics):
    self.num_classes, self.num_bins = state.num_classes, state.num_bins
    self.score_bits = state.score_bits
    for name in ("count", "num_correct", "nll_sum", "brier_sum", "confidence_sum",
                 "wrong_confidence_sum", "right_doubt_sum", "bin_counts", "bin_confidence",
                 "bin_hits", "class_confidence", "class_hits", "fine_counts", "fine_errors",
                 "fine_offsets", "confusion"):
      value = getattr(state, name)
      if value is not None:
        value = np.asarray(value)
        value = value.astype(np.float64 if value.dtype.kind == "f" else np.int64)
      setattr(self, name, value)


def _result(state: StreamingMetrics, risks, coverages) -> dict:
  h = _HostState(state)
  n = int(h.count)
  gaps = np.abs(h.bin_hits - h.bin_confidence)
  out = {
      "num_samples": n,
      "accuracy": _div(h.num_correct, n),
      "ece": _div(gaps.sum(), n),
      "mce": np.max(np.where(h.bin_counts > 0, _div(gaps, h.bin_counts), 0.0)),
      "classwise_ece": _div(np.abs(h.class_hits - h.class_confidence).sum(),
                            n * h.num_classes),
      "nll": _div(h.nll_sum, n),
      "brier": _div(h.brier_sum, n),
      "average_confidence": _div(h.confidence_sum, n),
      "overconfidence": _div(h.wrong_confidence_sum, n - h.num_correct),
      "underconfidence": _div(h.right_doubt_sum, h.num_correct),
      "reliability_counts": h.bin_counts.astype(np.int32),
      "reliability_confidence": _div(h.bin_confidence, h.bin_counts),
      "reliability_accuracy": _div(h.bin_hits, h.bin_counts),
  }
  out.update(_selective_from_histogram(h, risks, coverages))
  out["aece"], out["aece_error_bound"] = _aece_from_histogram(h)
  if h.confusion is not None:
    miou, per_class = segmentation.iou_from_confusion(jnp.asarray(h.confusion))
    out["miou"], out["per_class_iou"] = np.asarray(miou), np.asarray(per_class)
  return {key: (value if key in ("num_samples", "reliability_counts")
                else np.asarray(value, np.float32))
          for key, value in out.items()}
