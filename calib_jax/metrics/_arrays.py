"""Arithmetic shared by the one-shot metrics (jax, float32, on device) and the streaming
accumulators' `compute()` (numpy, float64, on the host): one formula serves both."""
import jax
import jax.numpy as jnp
import numpy as np


def on_host(*xs) -> bool:
  """True when no argument is a jax array (or tracer): the numpy float64 path applies."""
  return not any(isinstance(x, jax.Array) for x in xs)


def safe_div(num, den):
  """`num / den` where `den > 0`, else 0.

  numpy inputs give float64 (the streaming results are finished in float64 and rounded once);
  jax inputs give float32.
  """
  if on_host(num, den):
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1), 0.0).astype(jnp.float32)
