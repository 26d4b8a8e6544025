"""Logit normalisation (LogitNorm, Wei et al. ICML 2022)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, take_label

# Added to the norm before dividing, as the official code does (so z = 0 stays finite).
NORM_EPSILON = 1e-7


def l2_norm(z: jax.Array) -> jax.Array:
  """`‖z‖₂` over the class axis, with gradient `z/‖z‖` and 0 (not NaN) at z = 0."""
  # Double `where`: sqrt's derivative at 0 is infinite, and 0·inf would poison the gradient.
  squared = jnp.sum(z * z, axis=-1)
  positive = squared > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def logit_norm(x: LossInputs, *, temperature: float) -> jax.Array:
  """LogitNorm (Wei et al., ICML 2022, "Mitigating Neural Network Overconfidence with Logit
  Normalization"): cross-entropy of the logits scaled to norm 1/τ.

      L = −log softmax(u)_y,   u = z / (τ · (‖z‖₂ + 1e-7))

  As the official code (hongxin001/logitnorm_ood, `LogitNormLoss`) computes it: the 1e-7 is
  added to the norm (the paper's Eq. 6 has none), τ divides after the normalisation, and the
  cross-entropy is averaged over the batch. τ = 0.04 is that code's CIFAR-10 default.

  Gradient per example, with `n = ‖z‖₂ + 1e-7` and `g = softmax(u) − onehot(y)`:

      ∂L/∂z = (g − (g·z)·z / (‖z‖₂·n)) / (τ·n)

  i.e. `g` projected off the direction of z (the loss cannot change the logits' norm, up to
  the 1e-7) and scaled by 1/(τn). Only the direction of z is trained, so the logits a model
  learns with it have an arbitrary norm: evaluate `z` itself (as the paper does) or after
  temperature scaling, not `u`.
  """
  scaled = x.logits / (temperature * (l2_norm(x.logits) + NORM_EPSILON))[..., None]
  return -take_label(jax.nn.log_softmax(scaled), x.labels)
