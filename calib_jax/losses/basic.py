"""Per-example losses on the predicted distribution alone: CE, LS, focal, FLSD, ECP.

Each function maps `LossInputs` (float32 logits `[..., C]`, safe int labels) and its
hyper-parameters to per-example values `[...]`; the registry averages them over valid entries.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, take_label


def cross_entropy(x: LossInputs) -> jax.Array:
  """Cross-entropy `−log p_y`.  Gradient: `p − onehot(y)`."""
  return -take_label(jax.nn.log_softmax(x.logits), x.labels)


def smoothed_targets(labels: jax.Array, num_classes: int, epsilon: float) -> jax.Array:
  """`q = (1−ε)·onehot(y) + ε/C` — the uniform part includes y, as `optax.smooth_labels`."""
  return (1.0 - epsilon) * jax.nn.one_hot(labels, num_classes) + epsilon / num_classes


def label_smoothing(x: LossInputs, *, epsilon: float) -> jax.Array:
  """Label smoothing (Szegedy et al. 2016): `−Σ_k q_k log p_k` with `q` from `smoothed_targets`.

  Gradient: `p − q`.
  """
  q = smoothed_targets(x.labels, x.logits.shape[-1], epsilon)
  return -jnp.sum(q * jax.nn.log_softmax(x.logits), axis=-1)


def _focal_from_log_prob(log_p_y: jax.Array, gamma) -> jax.Array:
  # 1 − p_y from log space keeps precision near p_y = 1; the double `where` keeps the gradient of
  # (1 − p_y)^γ finite at 1 − p_y = 0 when γ < 1 (the loss's true gradient there is 0).
  one_minus_p = -jnp.expm1(log_p_y)
  positive = one_minus_p > 0
  safe = jnp.where(positive, one_minus_p, 1.0)
  modulator = jnp.where(positive, safe ** gamma, jnp.where(gamma == 0, 1.0, 0.0))
  return -modulator * log_p_y


def focal(x: LossInputs, *, gamma: float) -> jax.Array:
  """Focal loss (Lin et al. 2017): `−(1 − p_y)^γ · log p_y`."""
  return _focal_from_log_prob(take_label(jax.nn.log_softmax(x.logits), x.labels), gamma)


def focal_sample_dependent(x: LossInputs, *, gamma: float) -> jax.Array:
  """FLSD (Mukhoti et al. 2020): focal loss with `γ_i = 5 if p_y < 0.2, 3 if p_y < 0.5, else γ`.

  `γ_i` is a per-sample constant: it is chosen from `sg(p_y)` and not differentiated.
  """
  log_p_y = take_label(jax.nn.log_softmax(x.logits), x.labels)
  p_y = jax.lax.stop_gradient(jnp.exp(log_p_y))
  gamma_i = jnp.where(p_y < 0.2, 5.0, jnp.where(p_y < 0.5, 3.0, gamma))
  return _focal_from_log_prob(log_p_y, gamma_i)


def confidence_penalty(x: LossInputs, *, beta: float) -> jax.Array:
  """Explicit confidence penalty (Pereyra et al. 2017): `−log p_y − β·H(p)`, `H = −Σ_k p_k log p_k`.

  The entropy is summed over classes as Pereyra et al. write it (docs/conventions.md#ecp); MbLS code
  (`calibrate/losses/penalty_entropy_loss.py`), whose ECP rows the MbLS and ACLS tables report,
  averages it over the C classes instead, so its weight α is `β·C` here: the papers' "ECP
  β = 0.1" at C = 10 is `beta=0.01` in this function.
  """
  log_p = jax.nn.log_softmax(x.logits)
  neg_entropy = jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
  return -take_label(log_p, x.labels) + beta * neg_entropy
