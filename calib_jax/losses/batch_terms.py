"""Losses with a batch-level calibration term: MDCA and MMCE.

They take all entries at once (segmentation pixels are flattened) and use valid entries only, as
docs/conventions.md#reductions fixes for batch-level terms.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.losses._common import LossInputs, masked_mean
from calib_jax.losses.basic import cross_entropy

MMCE_KERNEL_WIDTH = 0.4
# MMCE² is a difference of quadratic forms of similar size: at a GPU's or TPU's default matmul
# precision (TF32 or bfloat16 operands) their rounding is of the order of the difference itself.
_FULL_F32 = jax.lax.Precision.HIGHEST


def _flatten(x: LossInputs):
  num_classes = x.logits.shape[-1]
  return (x.logits.reshape(-1, num_classes), x.labels.reshape(-1), x.weights.reshape(-1))


def mdca(x: LossInputs, *, beta: float) -> jax.Array:
  """Multi-class difference in confidence and accuracy (Hebbalaguppe et al. CVPR 2022).

      L = mean_n(−log p_{n,y_n}) + β · (1/C) Σ_k | mean_n p_nk − mean_n onehot_nk |
  """
  logits, labels, weights = _flatten(x)
  num_classes = logits.shape[-1]
  count = jnp.maximum(jnp.sum(weights), 1.0)
  w = weights[:, None]
  mean_probs = jnp.sum(jax.nn.softmax(logits) * w, axis=0) / count
  mean_labels = jnp.sum(jax.nn.one_hot(labels, num_classes) * w, axis=0) / count
  calibration = jnp.mean(jnp.abs(mean_probs - mean_labels))
  return masked_mean(cross_entropy(x), x.weights) + beta * calibration


def _safe_sqrt(x: jax.Array) -> jax.Array:
  # sqrt has an infinite slope at 0, which a perfectly calibrated batch reaches.
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def mmce_weighted(confidence: jax.Array, correct: jax.Array, weights: jax.Array) -> jax.Array:
  """MMCE_w of Kumar et al. (ICML 2018), Laplacian kernel `exp(−|r − r'| / 0.4)`.

      MMCE_w² = Σ_{i,j∈C} (1−r_i)(1−r_j)k_ij / m_c² + Σ_{i,j∈W} r_i r_j k_ij / m_w²
                − 2 Σ_{i∈C, j∈W} (1−r_i) r_j k_ij / (m_c m_w)

  over the correct (C, m_c of them) and wrong (W, m_w) valid samples, `r` the confidence.
  Returns `sqrt(max(MMCE_w², 0))`. Memory is O(N²) in the number of entries.

  This is the formula of Kumar et al. (their MMCE_w; docs/conventions.md#mmce). Their released
  TensorFlow code differs in two ways: it divides each pair sum by the squared count a second
  time (by m_c⁴, m_w⁴ and (m_c·m_w)² instead of m_c², m_w², m_c·m_w), which shrinks the term by
  the batch's counts, and it drops the term (0) when a batch has no correct or no wrong sample.
  Here a batch with only one kind keeps the term of that kind, which the formula defines.
  """
  c = correct * weights
  w = (1.0 - correct) * weights
  m_c, m_w = jnp.sum(c), jnp.sum(w)
  kernel = jnp.exp(-jnp.abs(confidence[:, None] - confidence[None, :]) / MMCE_KERNEL_WIDTH)
  u = (1.0 - confidence) * c / jnp.maximum(m_c, 1.0)  # zero vector when there is no correct sample
  v = confidence * w / jnp.maximum(m_w, 1.0)
  u_kernel = jnp.matmul(u, kernel, precision=_FULL_F32)
  v_kernel = jnp.matmul(v, kernel, precision=_FULL_F32)
  squared = (jnp.dot(u_kernel, u, precision=_FULL_F32) + jnp.dot(v_kernel, v, precision=_FULL_F32)
             - 2.0 * jnp.dot(u_kernel, v, precision=_FULL_F32))
  return _safe_sqrt(squared)


def mmce(x: LossInputs, *, weight: float) -> jax.Array:
  """CE + weight · MMCE_w (Kumar et al. 2018); correctness uses argmax and is not differentiated."""
  logits, labels, weights = _flatten(x)
  probs = jax.nn.softmax(logits)
  confidence = jnp.max(probs, axis=-1)
  correct = jax.lax.stop_gradient((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
  return masked_mean(cross_entropy(x), x.weights) + weight * mmce_weighted(confidence, correct,
                                                                           weights)
