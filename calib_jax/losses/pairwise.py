"""Calibration by pairwise constraints (CPC, Cheng & Vasconcelos, CVPR 2022)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, take_label
from calib_jax.losses.basic import cross_entropy


def pairwise_constraints(x: LossInputs, *, lambda_1v1: float, lambda_be: float) -> jax.Array:
  """CPC as written in the ACLS supplement, Eqs. 2–4:

      L = −log p_y + λ_1v1 · (−Σ_{k≠y} log(p_y / (p_y + p_k)))
                   + λ_be · (−Σ_{k,l≠y} [log(p_k/(p_k+p_l)) + log(p_l/(p_k+p_l))])

  With `log(p_a/(p_a+p_b)) = −softplus(z_b − z_a)` both terms are softplus sums of logit
  differences, finite for any logits. The double sum runs over all ordered pairs of non-label
  classes as written, so its k = l terms add the constant 2·log 2 each (no gradient).
  Memory is O(C²) per entry.
  """
  num_classes = x.logits.shape[-1]
  z = x.logits
  z_y = take_label(z, x.labels)
  others = 1.0 - jax.nn.one_hot(x.labels, num_classes)
  one_vs_one = jnp.sum(others * jax.nn.softplus(z - z_y[..., None]), axis=-1)
  diffs = z[..., :, None] - z[..., None, :]
  pair_weights = others[..., :, None] * others[..., None, :]
  between = jnp.sum(pair_weights * (jax.nn.softplus(diffs) + jax.nn.softplus(-diffs)),
                    axis=(-2, -1))
  return cross_entropy(x) + lambda_1v1 * one_vs_one + lambda_be * between
