"""Confidence scores: one number per sample from logits `[..., C]`, higher = more confident
(or, for OOD detection, more in-distribution).

`msp` (Hendrycks & Gimpel 2017), `max_logit` (Hendrycks et al. 2022), `neg_entropy` and
`energy` (Liu et al. 2020, "Energy-based out-of-distribution detection"). The p-norm score is
in `calib_jax.posthoc.pnorm`.
"""
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import arrays

ArrayLike = jax.typing.ArrayLike


def logits_array(logits: ArrayLike) -> jax.Array:
  """Validates `[..., C]` logits (C >= 1) and converts them to float32."""
  if np.ndim(logits) < 1 or np.shape(logits)[-1] < 1:
    raise ValueError(f"logits must have shape [..., C] with C >= 1, got {np.shape(logits)}.")
  return arrays.as_float_array(logits, "logits")


def msp(logits: ArrayLike) -> jax.Array:
  """Maximum softmax probability `max_k softmax(z)_k`, shape `[...]`."""
  return jnp.max(jax.nn.softmax(logits_array(logits), axis=-1), axis=-1)


def max_logit(logits: ArrayLike) -> jax.Array:
  """Maximum logit `max_k z_k`, shape `[...]`."""
  return jnp.max(logits_array(logits), axis=-1)


def neg_entropy(logits: ArrayLike) -> jax.Array:
  """Negative predictive entropy `Σ_k p_k log p_k` (≤ 0; higher = more confident)."""
  logp = jax.nn.log_softmax(logits_array(logits), axis=-1)
  return jnp.sum(jnp.exp(logp) * logp, axis=-1)


def energy(logits: ArrayLike, temperature: float = 1.0) -> jax.Array:
  """Negative free energy `T · logsumexp(z / T)`, shape `[...]`; higher = more in-distribution.

  Liu, Wang, Owens & Li (NeurIPS 2020) score a sample by `−E(x; f) = T · log Σ_k exp(z_k / T)`
  (their Eq. 1 negated, so that larger means in-distribution like the other scores); `T = 1`
  is their default. It tends to `max_logit` as `T → 0`.

  Args:
    logits: `[..., C]`.
    temperature: `T > 0` (a Python number).
  """
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
      temperature > 0 and np.isfinite(temperature)):
    raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}.")
  t = jnp.float32(temperature)
  return t * jax.nn.logsumexp(logits_array(logits) / t, axis=-1)
