"""Calibration metrics of a classifier's probabilities (docs/conventions.md#calibration-metrics).

All functions take `probs [..., C]` (leading dims are flattened, e.g. segmentation pixels),
integer `labels [...]` and an optional bool `mask [...]` selecting the valid entries. Results are
float32 scalars holding fractions (not percent).

Conventions: confidence `c = max_k p_k`, prediction `argmax p` (first index on ties), equal-width
bins with `b = clip(ceil(c·B) − 1, 0, B − 1)` computed in float32 (bins are `(lo, hi]`, `c = 0`
falls in bin 0).

The `*_from_bins` functions (`metrics.binned`) are the one formula of each binned metric: the
one-shot metrics here apply them to their bin sums on device (float32).

Shape errors are raised eagerly. Out-of-range labels and an all-false mask raise when the values
are concrete; inside a user's `jax.jit` they cannot be checked: out-of-range labels then count as
wrong predictions, and an all-false mask gives 0.0.
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import arrays
from calib_jax.metrics import _arrays
from calib_jax.metrics import _ranking
from calib_jax.metrics import _segments
from calib_jax.metrics import _sorting
# The binned formulas, also reached as `calibration.<name>` by the accumulators.
from calib_jax.metrics.binned import NORMS  # noqa: F401
from calib_jax.metrics.binned import ReliabilityBins
from calib_jax.metrics.binned import calibration_error_from_bins
from calib_jax.metrics.binned import check_norm
from calib_jax.metrics.binned import classwise_ece_from_bins
from calib_jax.metrics.binned import ece_from_bins
from calib_jax.metrics.binned import mce_from_bins
from calib_jax.metrics.binned import reliability_from_bins
from calib_jax.metrics.binned import rms_from_bins  # noqa: F401

ArrayLike = jax.typing.ArrayLike

# Above this many classes per bin, classwise ECE scatters only each row's top-B probabilities
# (every probability above 1/B is among them) instead of all C of them.
_TOP_K_CLASS_FACTOR = 4

# Rows per partial sum of classwise ECE's all-classes path: each (class, bin) sum adds at most
# this many entries in float32 before the partials are added (as `_segments.segment_sum_f32`
# bounds its chunks), with the chunk read off the row index instead of padded copies; more
# rows when the partials would pass `_CLASSWISE_MAX_PARTIALS` (16 MB, and int32 cell ids).
_CLASSWISE_CHUNK_ROWS = 128
_CLASSWISE_MAX_PARTIALS = 1 << 22


def bin_index(confidence: jax.Array, num_bins: int) -> jax.Array:
  """Equal-width bin of each confidence: `clip(ceil(c·B) − 1, 0, B − 1)` (bins are `(lo, hi]`)."""
  b = jnp.ceil(confidence * num_bins).astype(jnp.int32) - 1
  return jnp.clip(b, 0, num_bins - 1)


def confidence_and_correct(probs: jax.Array, labels: jax.Array):
  """Max probability and whether the argmax (first index on ties) equals the label."""
  pred, conf = arrays.prediction_and_confidence(probs)
  return conf, pred == labels


def brier_per_sample(probs: jax.Array, labels: jax.Array) -> jax.Array:
  """`Σ_k (p_k − onehot_k)² = Σ_k p_k² − 2 p_y + 1`, without materialising the one-hot."""
  p_label = jnp.take_along_axis(probs, jnp.clip(labels, 0, probs.shape[-1] - 1)[..., None],
                                axis=-1)[..., 0]
  in_range = (labels >= 0) & (labels < probs.shape[-1])
  return jnp.sum(jnp.square(probs), axis=-1) - 2.0 * jnp.where(in_range, p_label, 0.0) + 1.0


def _valid_count(mask: Optional[jax.Array], n: int) -> jax.Array:
  if mask is None:
    return jnp.float32(n)
  return jnp.sum(mask, dtype=jnp.int32).astype(jnp.float32)


_safe_div = _arrays.safe_div


def _route(index: jax.Array, mask: Optional[jax.Array], overflow: int) -> jax.Array:
  """Sends masked-out entries to an extra segment `overflow` that is dropped afterwards."""
  return index if mask is None else jnp.where(mask, index, overflow)


def bin_sums(conf: jax.Array, correct: jax.Array, mask: Optional[jax.Array], num_bins: int):
  """Per-bin sample counts (int32), confidence sums (f32) and correct counts (int32) of the
  equal-width confidence bins; masked-out entries are left out."""
  b = _route(bin_index(conf, num_bins), mask, num_bins)
  counts = jax.ops.segment_sum(jnp.ones_like(b), b, num_bins + 1)[:num_bins]
  conf_sum = _segments.segment_sum_f32(conf, b, num_bins + 1)[:num_bins]
  hits = jax.ops.segment_sum(correct.astype(jnp.int32), b, num_bins + 1)[:num_bins]
  return counts, conf_sum, hits


@functools.partial(jax.jit, static_argnames="num_bins")
def _ece(probs, labels, mask, num_bins):
  conf, correct = confidence_and_correct(probs, labels)
  _, conf_sum, hits = bin_sums(conf, correct, mask, num_bins)
  return ece_from_bins(conf_sum, hits, _valid_count(mask, labels.shape[0]))


@functools.partial(jax.jit, static_argnames="num_bins")
def _mce(probs, labels, mask, num_bins):
  conf, correct = confidence_and_correct(probs, labels)
  return mce_from_bins(*bin_sums(conf, correct, mask, num_bins))


@functools.partial(jax.jit, static_argnames="num_bins")
def _reliability_bins(probs, labels, mask, num_bins):
  conf, correct = confidence_and_correct(probs, labels)
  return reliability_from_bins(*bin_sums(conf, correct, mask, num_bins))


def aece_sums(conf: jax.Array, correct: jax.Array, mask: Optional[jax.Array], num_bins: int):
  """Per-group correct counts and confidence sums of the AECE's equal-mass groups (sizes:
  `aece_group_sizes`)."""
  key = _sorting.monotone_key(conf)
  bit = correct
  if mask is not None:
    key = jnp.where(mask, key, 0)
    bit = jnp.logical_and(bit, mask)
  return _ranking.adaptive_groups(key, bit, num_bins)


def aece_group_sizes(num_samples: jax.Array, num_bins: int) -> jax.Array:
  """int32 `[B]` sizes of the AECE's groups of `num_samples` items (`np.array_split` sizes)."""
  return jnp.diff(_ranking.group_starts(num_samples, num_bins, jnp)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("num_bins", "norm"))
def _aece(probs, labels, mask, num_bins, norm):
  conf, correct = confidence_and_correct(probs, labels)
  hits, conf_sum = aece_sums(conf, correct, mask, num_bins)
  n = labels.shape[0] if mask is None else jnp.sum(mask, dtype=jnp.int32)
  counts = aece_group_sizes(jnp.int32(n), num_bins)
  return calibration_error_from_bins(counts, conf_sum, hits, _valid_count(mask, labels.shape[0]),
                                     norm).astype(jnp.float32)


def classwise_bin_sums(probs: jax.Array, labels: jax.Array, mask: Optional[jax.Array],
                       num_bins: int):
  """Per-class equal-width bins on `p_k`: confidence sums `[C, B]` f32 and label hits `[C, B]`."""
  n, num_classes = probs.shape
  overflow = num_classes * num_bins
  classes = jnp.arange(num_classes, dtype=jnp.int32)
  if num_classes > _TOP_K_CLASS_FACTOR * num_bins:
    # At most B−1 probabilities of a row exceed 1/B (they sum to 1), so the row's top B hold
    # every entry outside bin 0; bin 0 gets the rest of the column sum.
    vals, cls = lax.top_k(probs, num_bins)
    b = bin_index(vals, num_bins)
    idx = jnp.where(b >= 1, cls * num_bins + b, overflow)
    if mask is not None:
      idx = jnp.where(mask[:, None], idx, overflow)
    high = _segments.segment_sum_f32(vals, idx, overflow + 1)[:overflow]
    high = high.reshape(num_classes, num_bins)
    col = jnp.sum(probs if mask is None else jnp.where(mask[:, None], probs, 0.0), axis=0)
    conf_sum = high.at[:, 0].set(col - jnp.sum(high[:, 1:], axis=1))
  else:
    # One scatter of the N·C probabilities into per-chunk partial sums, the chunk being
    # `row // _CLASSWISE_CHUNK_ROWS`: no padded copy of the [N, C] array (paired at C = 10,
    # N = 1e5-1e6: 0.8-0.9x the time of `segment_sum_f32` over the flattened entries).
    cells = overflow + 1                                   # + 1: masked-out entries
    rows = max(_CLASSWISE_CHUNK_ROWS, -(-n // max(1, _CLASSWISE_MAX_PARTIALS // cells)))
    num_chunks = -(-n // rows)
    idx = classes * num_bins + bin_index(probs, num_bins)
    if mask is not None:
      idx = jnp.where(mask[:, None], idx, overflow)
    chunk = jnp.arange(n, dtype=jnp.int32) // rows
    partials = jax.ops.segment_sum(probs.reshape(-1), (idx + chunk[:, None] * cells).reshape(-1),
                                   num_chunks * cells)
    conf_sum = jnp.sum(partials.reshape(num_chunks, cells), axis=0)
    conf_sum = conf_sum[:overflow].reshape(num_classes, num_bins)
  p_label = jnp.take_along_axis(probs, jnp.clip(labels, 0, num_classes - 1)[:, None], 1)[:, 0]
  in_range = (labels >= 0) & (labels < num_classes)
  hit_idx = jnp.where(in_range, labels * num_bins + bin_index(p_label, num_bins), overflow)
  hit_idx = _route(hit_idx, mask, overflow)
  hits = jax.ops.segment_sum(jnp.ones_like(hit_idx), hit_idx, overflow + 1)[:overflow]
  return conf_sum, hits.reshape(num_classes, num_bins)


@functools.partial(jax.jit, static_argnames="num_bins")
def _classwise_ece(probs, labels, mask, num_bins):
  conf_sum, hits = classwise_bin_sums(probs, labels, mask, num_bins)
  return classwise_ece_from_bins(conf_sum, hits, _valid_count(mask, labels.shape[0]))


def _masked_mean(x, mask, n):
  total = jnp.sum(x if mask is None else jnp.where(mask, x, 0.0))
  return _safe_div(total, _valid_count(mask, n))


def label_log_prob(x: jax.Array, labels: jax.Array, from_logits: bool) -> jax.Array:
  """`log p_y` per sample (`[N, C]` logits or probabilities, `[N]` labels): the NLL's one formula.

  From logits it is the exact `log_softmax(x)_y`; from probabilities `log max(p_y, tiny)` (so at
  most ≈ 87.3 per sample). Out-of-range labels read class `clip(y, 0, C − 1)`.
  """
  safe_labels = jnp.clip(labels, 0, x.shape[-1] - 1)[:, None]
  if from_logits:
    # `log_softmax(x)_y` with the same arithmetic, `(x_y − max) − log Σ exp(x − max)` (equal
    # to the bit), but gathering x_y first: no [N, C] log-probabilities are written, and the
    # streaming update shares `exp(x − max)` with its softmax. Paired CPU times on XLA:CPU
    # (N·C = 1e5·10 to 3e4·1000): the one-shot NLL from logits takes 0.5–0.85x the time of
    # log_softmax-then-gather, the streaming update from logits ~0.92x.
    top = jnp.max(x, axis=-1, keepdims=True)
    log_total = jnp.log(jnp.sum(jnp.exp(x - top), axis=-1))
    return (jnp.take_along_axis(x, safe_labels, 1)[:, 0] - top[:, 0]) - log_total
  p = jnp.take_along_axis(x, safe_labels, 1)[:, 0]
  return jnp.log(jnp.maximum(p, jnp.finfo(jnp.float32).tiny))


@functools.partial(jax.jit, static_argnames="from_logits")
def _nll(x, labels, mask, from_logits):
  return _masked_mean(-label_log_prob(x, labels, from_logits), mask, labels.shape[0])


@jax.jit
def _brier(probs, labels, mask):
  return _masked_mean(brier_per_sample(probs, labels), mask, labels.shape[0])


@jax.jit
def _accuracy(probs, labels, mask):
  _, correct = confidence_and_correct(probs, labels)
  return _masked_mean(correct.astype(jnp.float32), mask, labels.shape[0])


@jax.jit
def _average_confidence(probs, mask):
  return _masked_mean(jnp.max(probs, axis=-1), mask, probs.shape[0])


@jax.jit
def _over_under(probs, labels, mask):
  conf, correct = confidence_and_correct(probs, labels)
  valid = jnp.ones_like(correct) if mask is None else mask
  wrong, right = valid & ~correct, valid & correct
  over = _safe_div(jnp.sum(jnp.where(wrong, conf, 0.0)), jnp.sum(wrong, dtype=jnp.float32))
  under = _safe_div(jnp.sum(jnp.where(right, 1.0 - conf, 0.0)), jnp.sum(right, dtype=jnp.float32))
  return over, under


def ece(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
        mask: Optional[ArrayLike] = None) -> jax.Array:
  """Expected calibration error: `Σ_b |B_b|/N · |acc_b − conf_b|` over equal-width bins.

  Args:
    probs: `[..., C]` probabilities.
    labels: `[...]` integer labels.
    num_bins: number of equal-width confidence bins (static under jit).
    mask: optional bool `[...]`, True for entries that count.

  Returns:
    float32 scalar in [0, 1].
  """
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _ece(probs, labels, mask, num_bins)


def mce(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
        mask: Optional[ArrayLike] = None) -> jax.Array:
  """Maximum calibration error: max over non-empty equal-width bins of `|acc_b − conf_b|`."""
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _mce(probs, labels, mask, num_bins)


def aece(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
         mask: Optional[ArrayLike] = None, *, norm: str = "l1") -> jax.Array:
  """Adaptive ECE: equal-mass bins of the sorted confidences (`np.array_split` sizes).

  Confidences are sorted ascending and cut into `num_bins` contiguous groups whose sizes differ
  by at most one, larger groups first. Where a run of exactly equal confidences is cut by a
  group boundary, both sides get the run's mean accuracy (expectation over tie order), so ties
  never make the result order-dependent. The groups' gaps are combined in `norm`, as
  torch-uncertainty's `AdaptiveCalibrationError(norm=...)` does
  (`calibration_error_from_bins`, the formulas of `ece`, `rms_calibration_error` and `mce`):
  `"l1"` (default) `Σ_g |B_g|/N · |acc_g − conf_g|`, `"l2"`
  `sqrt(Σ_g |B_g|/N · (acc_g − conf_g)²)`, `"max"` `max_g |acc_g − conf_g|` over non-empty
  groups (there are empty groups only when fewer samples than bins are valid).
  """
  num_bins = arrays.check_num_bins(num_bins)
  norm = check_norm(norm)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _aece(probs, labels, mask, num_bins, norm)


def classwise_ece(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
                  mask: Optional[ArrayLike] = None) -> jax.Array:
  """Classwise ECE: per class k, equal-width bins on `p_k` against `1[y = k]`; mean over C.

  C is the number of columns of `probs` (classes absent from `labels` still count). Rows must
  be probability vectors (sum ≈ 1): for large C only each row's top `num_bins` entries are
  binned individually, which is exact when at most `num_bins` entries exceed `1/num_bins`.
  """
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _classwise_ece(probs, labels, mask, num_bins)


def reliability_bins(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
                     mask: Optional[ArrayLike] = None) -> ReliabilityBins:
  """Per-bin counts, mean confidence and accuracy of the equal-width confidence bins."""
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _reliability_bins(probs, labels, mask, num_bins)


def nll(probs: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None, *,
        from_logits: bool = False) -> jax.Array:
  """Mean negative log-likelihood of the labels.

  With probabilities, `p_y` is clipped at the smallest normal float32 (so at most ≈ 87.3 per
  sample); pass logits with `from_logits=True` for the exact log-softmax value.
  """
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _nll(probs, labels, mask, bool(from_logits))


def brier(probs: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Brier score `Σ_k (p_k − onehot_k)²` (sum over classes), mean over samples; in [0, 2]."""
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _brier(probs, labels, mask)


def accuracy(probs: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Fraction of samples whose argmax (first index on ties) equals the label."""
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _accuracy(probs, labels, mask)


def average_confidence(probs: ArrayLike, labels: Optional[ArrayLike] = None,
                       mask: Optional[ArrayLike] = None) -> jax.Array:
  """Mean of `max_k p_k`; `labels` is accepted for a uniform signature but not needed."""
  if labels is None:
    leading = tuple(jnp.shape(probs))[:-1]
    labels = jnp.zeros(leading, jnp.int32)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _average_confidence(probs, mask)


def overconfidence(probs: ArrayLike, labels: ArrayLike,
                   mask: Optional[ArrayLike] = None) -> jax.Array:
  """Mean confidence over the wrong predictions (0.0 when there are none)."""
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _over_under(probs, labels, mask)[0]


def underconfidence(probs: ArrayLike, labels: ArrayLike,
                    mask: Optional[ArrayLike] = None) -> jax.Array:
  """Mean of `1 − confidence` over the correct predictions (0.0 when there are none)."""
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _over_under(probs, labels, mask)[1]
