"""Failure and out-of-distribution detection: AUROC, AUPR and FPR at a TPR, tie-aware.

Inputs are `scores [...]` with **higher = more confident / more in-distribution** (MSP, max
logit, negative entropy, negative energy, ...), `positives [...]` (bool) marking what is to be
detected, and an optional bool `mask [...]`:

* failure detection: `positives = ~correct`, the wrong predictions;
* OOD detection: `positives` marks the OOD samples in the concatenation of the test split
  (in-distribution, negatives) and the OOD set.

A detector flags a sample when its score is at or below a threshold, so positives should get
low scores. Sweeping the threshold up through the distinct scores gives the ROC points
`(FPR, TPR) = (flagged negatives / negatives, flagged positives / positives)`; samples with
exactly equal scores are flagged together (one ROC point per tie group). Equivalently, these
are scikit-learn's metrics with `y_true = positives` and `y_score = −scores`:

* `auroc`: area under the ROC curve by the trapezoid rule = `P(s_neg > s_pos) +
  ½ P(s_neg = s_pos)` (`roc_auc_score`);
* `aupr`: average precision `Σ_g (R_g − R_{g−1}) · Prec_g` over the tie groups
  (`average_precision_score`; "AUPR-Out" when the OOD set is positive; AUPR-In is
  `aupr(−scores, ~positives)`);
* `fpr_at_tpr`: the FPR of the first ROC point with `TPR ≥ tpr` (OpenOOD's FPR@95 for
  `tpr=0.95`: the share of in-distribution samples flagged when 95 % of the OOD set is).

The ranking and tie groups are those of the selective metrics (`selective.rank_errors`, one
sort). All are jit-able; out of a trace, input where one class is absent raises (AUROC/AUPR
are undefined), inside a user's jit it gives 0.
"""
import numbers
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import program_store
from calib_jax.metrics import _arrays
from calib_jax import arrays
from calib_jax.metrics import selective

ArrayLike = jax.typing.ArrayLike


def _flatten(scores, positives, mask):
  s_shape, p_shape = tuple(np.shape(scores)), tuple(np.shape(positives))
  if s_shape != p_shape:
    raise ValueError(f"scores shape {s_shape} must equal positives shape {p_shape}.")
  n = int(np.prod(s_shape))
  if n == 0:
    raise ValueError("empty input: detection metrics need >= 1 sample of each class.")
  scores = arrays.as_float_array(scores, "scores").reshape(n)
  positives = arrays.as_bool_array(positives, "positives").reshape(n)
  mask = arrays.flatten_mask(mask, s_shape)
  if arrays.is_concrete(positives, mask):
    valid = np.ones(n, bool) if mask is None else np.asarray(mask)
    num_pos = int(np.count_nonzero(np.asarray(positives) & valid))
    num_neg = int(np.count_nonzero(valid)) - num_pos
    if num_pos == 0 or num_neg == 0:
      raise ValueError(f"positives must hold both classes among the valid samples, got "
                       f"{num_pos} positive and {num_neg} negative.")
  return scores, positives, mask


def roc_points(scores: jax.Array, positives: jax.Array, mask: Optional[jax.Array]):
  """The tie-group ROC points, least confident first.

  Returns:
    `(tp, fp, prev_tp, prev_fp, end, num_pos, num_neg)`: float32 `[N]` counts of flagged
    positives/negatives at each position's tie group (meaningful where `end`, the last
    position of a group), the same at the previous group's end (0 before the first), and the
    class totals.
  """
  r = selective.rank_errors(-scores, positives, mask)   # ascending score, ties grouped
  total = scores.shape[0]
  idx = jnp.arange(total, dtype=jnp.int32)
  tp = r.errors                                          # exact at group ends
  fp = (idx + 1).astype(jnp.float32) - tp
  last_end = lax.cummax(jnp.where(r.boundary, idx, -1))
  prev = jnp.concatenate([jnp.full(1, -1, jnp.int32), last_end[:-1]])
  has_prev = prev >= 0
  prev_tp = jnp.where(has_prev, tp[jnp.maximum(prev, 0)], 0.0)
  prev_fp = jnp.where(has_prev, (prev + 1).astype(jnp.float32) - prev_tp, 0.0)
  num_pos = r.num_errors.astype(jnp.float32)
  num_neg = r.n.astype(jnp.float32) - num_pos
  return tp, fp, prev_tp, prev_fp, r.boundary, num_pos, num_neg


@program_store.jit
def _auroc(scores, positives, mask):
  tp, fp, prev_tp, prev_fp, end, num_pos, num_neg = roc_points(scores, positives, mask)
  dx = _arrays.safe_div(fp - prev_fp, num_neg)
  y_mid = _arrays.safe_div(tp + prev_tp, 2.0 * num_pos)
  return jnp.sum(jnp.where(end, dx * y_mid, 0.0))


@program_store.jit
def _aupr(scores, positives, mask):
  tp, fp, prev_tp, _, end, num_pos, _ = roc_points(scores, positives, mask)
  recall_step = _arrays.safe_div(tp - prev_tp, num_pos)
  precision = _arrays.safe_div(tp, tp + fp)
  return jnp.sum(jnp.where(end, recall_step * precision, 0.0))


@program_store.jit
def _fpr_at_tpr(scores, positives, mask, tpr):
  tp, fp, _, _, end, num_pos, num_neg = roc_points(scores, positives, mask)
  reached = end & (_arrays.safe_div(tp, num_pos) >= tpr)
  return jnp.min(jnp.where(reached, _arrays.safe_div(fp, num_neg), 1.0))


def auroc(scores: ArrayLike, positives: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Area under the ROC curve of flagging low scores: `P(s_neg > s_pos) + ½ P(tie)`.

  Args:
    scores: `[...]` confidence scores, higher = more confident / in-distribution.
    positives: `[...]` bool, True for what is to be detected (wrong predictions, OOD samples).
    mask: optional bool `[...]`, True for entries that count.

  Returns:
    float32 scalar in [0, 1]; 0.5 for an uninformative score, 1 when every positive scores
    below every negative. Equals `sklearn.metrics.roc_auc_score(positives, -scores)`.
  """
  return _auroc(*_flatten(scores, positives, mask))


def aupr(scores: ArrayLike, positives: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Average precision of flagging low scores, `Σ_g (R_g − R_{g−1}) · Prec_g` over tie groups.

  Equals `sklearn.metrics.average_precision_score(positives, -scores)`; a random score gets
  the positive rate. Arguments as `auroc`.
  """
  return _aupr(*_flatten(scores, positives, mask))


def fpr_at_tpr(scores: ArrayLike, positives: ArrayLike, tpr: float = 0.95,
               mask: Optional[ArrayLike] = None) -> jax.Array:
  """FPR at the first ROC point (lowest threshold) whose TPR is ≥ `tpr`.

  The share of negatives (correct predictions / in-distribution samples) flagged when at
  least `tpr` of the positives are; with scikit-learn's
  `fpr, t, _ = roc_curve(positives, -scores, drop_intermediate=False)` it is
  `fpr[argmax(t >= tpr)]`. Arguments as `auroc`; `tpr` in (0, 1].
  """
  if isinstance(tpr, numbers.Real) and not 0.0 < tpr <= 1.0:
    raise ValueError(f"tpr must be in (0, 1], got {tpr}.")
  return _fpr_at_tpr(*_flatten(scores, positives, mask), jnp.float32(tpr))
