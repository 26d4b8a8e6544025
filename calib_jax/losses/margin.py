"""Margin-based penalties on logit distances: MbLS (Liu et al. 2022) and ACLS (Park et al. 2023)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, predicted_logit
from calib_jax.losses.basic import cross_entropy


def margin_label_smoothing(x: LossInputs, *, margin: float, alpha: float) -> jax.Array:
  """Margin-based label smoothing (MbLS, Liu et al. CVPR 2022, Eq. 7).

      L = −log p_y + α · (1/C) Σ_k relu(max_j z_j − z_k − m)

  The paper writes `λ Σ_k relu(d_k − m)`; docs/conventions.md#mbls takes the official code's *mean*
  over the C classes (the argmax's own term is 0) with weight α, i.e. λ = α/C. The max is not
  stopped (as in the official code), so the regulariser's gradient is `−α/C` at every k ≠ ŷ with
  `d_k > m` and `+α/C · #{k: d_k > m}` at ŷ.
  """
  distances = predicted_logit(x.logits)[..., None] - x.logits
  penalty = jnp.mean(jax.nn.relu(distances - margin), axis=-1)
  return cross_entropy(x) + alpha * penalty


def adaptive_conditional_label_smoothing(x: LossInputs, *, margin: float, lambda_pos: float,
                                         lambda_neg: float, winner_term: str) -> jax.Array:
  """ACLS (Park et al. ICCV 2023), as the official code computes it (docs/conventions.md#acls).

      L = −log p_y + λ_pos · relu(z_ŷ − M)² + λ_neg · mean_{j≠ŷ} relu(sg(z_ŷ) − z_j − M)²

  `winner_term="max"` (default) is cvlab-yonsei/ACLS `calibrate/losses/acls.py`, value and
  gradient: the winner penalty acts on the raw max logit (not stopped there), the loser penalty
  on the distance to the stopped max. Its regulariser gradient is `2λ_pos·relu(z_ŷ − M)` at ŷ
  and `−2λ_neg/(C−1)·relu(z_ŷ − z_j − M)` at j ≠ ŷ. It does not sum to zero over classes on
  purpose: the winner term pins the overall logit level, switching itself off once every logit
  has moved below M. The official trainer's `pos_lambda · alpha` and `neg_lambda · alpha`
  (1.0·0.1, 0.1·0.1) are `lambda_pos` and `lambda_neg` here.

  `winner_term="max_minus_min"` reads the paper's Eq. 13 as a function:
  `λ_pos·relu(z_ŷ − min_k z_k − M)²` with the min differentiated, which adds
  `−2λ_pos·relu(z_ŷ − min z − M)` at the argmin.

  Where this differs from the paper: Eq. 12 assigns the winner's gradient `2λ_pos·relu(z_ŷ −
  min z − M)` to ŷ alone (the min held constant). That vector field is the gradient of no
  function: nothing resists a common shift of every logit, and on the label-relaxation paper's
  2×1024 MLP the mean logit drifts down until training diverges. Neither form here does that.
  On ties of the max the first index is ŷ (the official code penalises every tied logit).
  """
  num_classes = x.logits.shape[-1]
  z_top = predicted_logit(x.logits)
  if winner_term == "max_minus_min":
    winner_gap = z_top - jnp.min(x.logits, axis=-1)
  else:
    winner_gap = z_top
  winner = jax.nn.relu(winner_gap - margin) ** 2

  is_top = jax.nn.one_hot(jnp.argmax(x.logits, axis=-1), num_classes, dtype=bool)
  loser_gaps = jax.lax.stop_gradient(z_top)[..., None] - x.logits
  losers = jnp.where(is_top, 0.0, jax.nn.relu(loser_gaps - margin) ** 2)
  loser = jnp.sum(losers, axis=-1) / (num_classes - 1)
  return cross_entropy(x) + lambda_pos * winner + lambda_neg * loser


def max_suppression(x: LossInputs, *, alpha: float) -> jax.Array:
  """MaxSup (Zhou et al. 2025, "MaxSup: Overcoming Representation Collapse in Label Smoothing").

      L = −log p_y + α · (max_k z_k − (1/C) Σ_k z_k)

  As the official code (`MaxSupLoss`) computes it: the top-1 logit (not the true class's, as
  label smoothing's implicit penalty `z_y − mean z` would) minus the mean over all C classes
  (the top one included), neither term stopped, the per-example values averaged over the batch
  like the cross-entropy. It is MbLS with margin 0: `mean_k relu(max z − z_k) = max z − mean z`.

  Gradient per example: `p − onehot(y) + α·(onehot(ŷ) − 1/C)`, ŷ = argmax (first index on ties;
  torch's `topk` picks one of the tied logits too). The regulariser's gradient sums to zero over
  the classes: it does not move the logits' common level, only pulls the top one to the mean.

  The official trainers raise α linearly over the epochs (0.1 → 0.2); that schedule is
  `config.loss_schedule` (`calib_jax.losses.schedule`), not part of this function.
  """
  penalty = predicted_logit(x.logits) - jnp.mean(x.logits, axis=-1)
  return cross_entropy(x) + alpha * penalty
