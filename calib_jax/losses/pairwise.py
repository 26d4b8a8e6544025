"""Calibration by pairwise constraints (CPC, Cheng & Vasconcelos, CVPR 2022)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, take_label
from calib_jax.losses.basic import cross_entropy


def pairwise_constraints(x: LossInputs, *, lambda_1v1: float, lambda_be: float) -> jax.Array:
  """CPC with the normalisation of the public implementation (docs/conventions.md#cpc):

      L = −log p_y + λ_1v1 · mean_{k≠y} −log σ(z_y − z_k)
                   + λ_be · 1/(2(C−1)(C−2)) · Σ_{k≠y} Σ_{l≠y, l≠k} −log σ(z_k − z_l)

  `σ` is the sigmoid, so `log σ(z_a − z_b) = log(p_a / (p_a + p_b))`, and `−log σ(u) =
  softplus(−u)` keeps both terms finite for any logits. The 1-vs-1 term is the mean over the
  C−1 non-label classes; the binary-exclusion term runs over ordered pairs of distinct non-label
  classes. This is what the calibration papers' CPC baselines ran (by-liu/CALS
  `calibrate/losses/cpc_loss.py`, the code behind the MbLS and ACLS tables). That code also sums
  the k = l terms, a constant `log 2 / (2(C−2))` per example with no gradient, left out here.

  The ACLS supplement (Eqs. 2–4) writes plain sums, `λ'_1v1·Σ_{k≠y}` and `λ'_be·Σ_{k,l≠y}
  [log σ(z_k − z_l) + log σ(z_l − z_k)]`; they equal this loss with `lambda_1v1 = λ'_1v1·(C−1)`
  and `lambda_be = λ'_be·4(C−1)(C−2)` (288× at C = 10). Memory is O(C²) per entry; for C < 3
  the exclusion term is 0 (no pair of non-label classes).
  """
  num_classes = x.logits.shape[-1]
  z = x.logits
  z_y = take_label(z, x.labels)
  others = 1.0 - jax.nn.one_hot(x.labels, num_classes)
  one_vs_one = jnp.sum(others * jax.nn.softplus(z - z_y[..., None]), axis=-1)
  one_vs_one = one_vs_one / (num_classes - 1)
  # diffs[..., k, l] = z_l − z_k, so softplus(diffs) = −log σ(z_k − z_l).
  diffs = z[..., None, :] - z[..., :, None]
  distinct = 1.0 - jnp.eye(num_classes)
  pair_weights = others[..., :, None] * others[..., None, :] * distinct
  exclusion = jnp.sum(pair_weights * jax.nn.softplus(diffs), axis=(-2, -1))
  exclusion = exclusion / (2.0 * (num_classes - 1) * max(num_classes - 2, 1))
  return cross_entropy(x) + lambda_1v1 * one_vs_one + lambda_be * exclusion
