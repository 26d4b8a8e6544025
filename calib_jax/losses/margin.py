"""Margin-based penalties on logit distances: MbLS (Liu et al. 2022) and ACLS (Park et al. 2023)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, predicted_logit
from calib_jax.losses.basic import cross_entropy


def margin_label_smoothing(x: LossInputs, *, margin: float, alpha: float) -> jax.Array:
  """Margin-based label smoothing (MbLS, Liu et al. CVPR 2022, Eq. 7).

      L = −log p_y + α · (1/C) Σ_k relu(max_j z_j − z_k − m)

  The paper writes `λ Σ_k relu(d_k − m)`; SPEC §1 fixes the official code's convention, a *mean*
  over the C classes (the argmax's own term is 0) with weight α, i.e. λ = α/C. The max is not
  stopped (as in the official code), so the regulariser's gradient is `−α/C` at every k ≠ ŷ with
  `d_k > m` and `+α/C · #{k: d_k > m}` at ŷ.
  """
  distances = predicted_logit(x.logits)[..., None] - x.logits
  penalty = jnp.mean(jax.nn.relu(distances - margin), axis=-1)
  return cross_entropy(x) + alpha * penalty


def adaptive_conditional_label_smoothing(x: LossInputs, *, margin: float, lambda_pos: float,
                                         lambda_neg: float, winner_term: str) -> jax.Array:
  """ACLS (Park et al. ICCV 2023, Eqs. 10–14).

      L = −log p_y + λ_pos · relu(z_ŷ − sg(min_k z_k) − M)²
                   + λ_neg · mean_{j≠ŷ} relu(sg(z_ŷ) − z_j − M)²

  Its gradient is Eq. 12 up to the factor 2: `2λ_pos·relu(z_ŷ − min z − M)` at ŷ and
  `−2λ_neg/(C−1)·relu(z_ŷ − z_j − M)` at j ≠ ŷ; the stop-gradients keep each term acting on the
  logit Eq. 12 assigns it to. `winner_term="max"` replaces the first penalty by `relu(z_ŷ − M)²`,
  as the official code does (SPEC §1 keeps the paper's form as the default).
  """
  num_classes = x.logits.shape[-1]
  z_top = predicted_logit(x.logits)
  if winner_term == "max_minus_min":
    winner_gap = z_top - jax.lax.stop_gradient(jnp.min(x.logits, axis=-1))
  else:
    winner_gap = z_top
  winner = jax.nn.relu(winner_gap - margin) ** 2

  is_top = jax.nn.one_hot(jnp.argmax(x.logits, axis=-1), num_classes, dtype=bool)
  loser_gaps = jax.lax.stop_gradient(z_top)[..., None] - x.logits
  losers = jnp.where(is_top, 0.0, jax.nn.relu(loser_gaps - margin) ** 2)
  loser = jnp.sum(losers, axis=-1) / (num_classes - 1)
  return cross_entropy(x) + lambda_pos * winner + lambda_neg * loser
