"""Adaptive label smoothing from objectness (Krothapalli & Abbott 2020)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs


def objectness_targets(labels: jax.Array, objectness: jax.Array, num_classes: int,
                       beta: float) -> jax.Array:
  """Soft targets of adaptive LS.

      a = 1 − objectness
      t = β·[(1 − a)·onehot + a/(C−1)·(1 − onehot)] + (1 − β)·onehot

  so the label keeps the fraction of the crop its objects cover and the rest is spread over the
  other classes. A context-only sample (objectness < 0, all objects removed) gets the uniform
  target `1/C`: with no object in view every class is equally likely (paper §3, "+Context").
  """
  onehot = jax.nn.one_hot(labels, num_classes)
  smoothing = 1.0 - jnp.clip(objectness, 0.0, 1.0)[..., None]
  adaptive = (1.0 - smoothing) * onehot + smoothing / (num_classes - 1) * (1.0 - onehot)
  target = beta * adaptive + (1.0 - beta) * onehot
  is_context = (objectness < 0)[..., None]
  return jnp.where(is_context, 1.0 / num_classes, target)


def adaptive_label_smoothing(x: LossInputs, *, beta: float) -> jax.Array:
  """Adaptive LS: cross-entropy `−Σ_k t_k log p_k` against `objectness_targets` (paper Eq. 4–5)."""
  t = objectness_targets(x.labels, x.objectness, x.logits.shape[-1], beta)
  return -jnp.sum(t * jax.nn.log_softmax(x.logits), axis=-1)
