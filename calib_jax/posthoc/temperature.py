"""Temperature scaling: `softmax(z / T)` with one scalar `T > 0` fitted on held-out data.

Guo, Pleiss, Sun & Weinberger (ICML 2017), "On calibration of modern neural networks".
`fit_temperature` minimises the held-out NLL; `select_temperature_from_grid` picks the grid
value with the lowest held-out ECE (the label-relaxation paper's protocol). Conventions (bins,
masks, float32) are those of the metrics; see docs/conventions.md.
"""
import functools
import numbers
from typing import Iterable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import program_store
from calib_jax import metrics
from calib_jax import arrays
from calib_jax.posthoc import scores

ArrayLike = jax.typing.ArrayLike

_GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0


def apply_temperature(logits: ArrayLike, temperature) -> jax.Array:
  """Temperature-scaled logits `z / T` (pass them to softmax for calibrated probabilities)."""
  if isinstance(temperature, numbers.Real) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}.")
  return scores.logits_array(logits) / jnp.asarray(temperature, jnp.float32)


@functools.partial(program_store.jit, static_argnames="iterations")
def _fit_log_temperature(logits, labels, mask, lo, hi, iterations: int):
  """Golden-section search of log T on the held-out NLL (unimodal: NLL is convex in 1/T)."""
  n = labels.shape[0]
  weights = jnp.ones(n, jnp.float32) if mask is None else mask.astype(jnp.float32)
  safe_labels = jnp.clip(labels, 0, logits.shape[1] - 1)  # masked entries may hold 255
  z_label = jnp.take_along_axis(logits, safe_labels[:, None], 1)[:, 0]

  def nll(log_t):
    inv_t = jnp.exp(-log_t)
    per = jax.nn.logsumexp(logits * inv_t, axis=-1) - z_label * inv_t
    return jnp.sum(jnp.where(weights > 0, per, 0.0))

  def step(_, carry):
    a, b, x1, x2, f1, f2 = carry
    move_right = f1 > f2  # minimum lies in [x1, b]
    a = jnp.where(move_right, x1, a)
    b = jnp.where(move_right, b, x2)
    new_x1 = jnp.where(move_right, x2, b - _GOLDEN * (b - a))
    new_x2 = jnp.where(move_right, a + _GOLDEN * (b - a), x1)
    x_eval = jnp.where(move_right, new_x2, new_x1)
    f_eval = nll(x_eval)
    new_f1 = jnp.where(move_right, f2, f_eval)
    new_f2 = jnp.where(move_right, f_eval, f1)
    return a, b, new_x1, new_x2, new_f1, new_f2

  x1 = hi - _GOLDEN * (hi - lo)
  x2 = lo + _GOLDEN * (hi - lo)
  carry = (lo, hi, x1, x2, nll(x1), nll(x2))
  a, b, x1, x2, f1, f2 = lax.fori_loop(0, iterations, step, carry)
  # Compare with the interval ends so an optimum at a bound is found exactly.
  candidates = jnp.stack([lo, hi, x1, x2])
  values = jnp.stack([nll(lo), nll(hi), f1, f2])
  return candidates[jnp.argmin(values)]


def fit_temperature(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None,
                    *, bounds=(0.05, 20.0), iterations: int = 48) -> float:
  """Temperature `T > 0` minimising the NLL of `softmax(logits / T)` on held-out data.

  A bounded golden-section search on `log T` (NLL is convex in `1/T`, hence unimodal in
  `log T`); 48 iterations shrink the interval by 1e-10, far below float32 noise.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    bounds: search interval `(T_min, T_max)`; the result is clipped to it.
    iterations: golden-section steps.

  Returns:
    T as a Python float.
  """
  lo, hi = bounds
  if not 0 < lo < hi:
    raise ValueError(f"bounds must satisfy 0 < T_min < T_max, got {bounds}.")
  logits, labels, mask = arrays.flatten_probs_labels(logits, labels, mask)
  log_t = _fit_log_temperature(logits, labels, mask, jnp.float32(np.log(lo)),
                               jnp.float32(np.log(hi)), int(iterations))
  return float(np.clip(np.exp(float(log_t)), lo, hi))


# The label-relaxation paper's temperature grid (Lienen & Huellermeier 2021, Sec. 5; official
# code `legacy/lr/metrics/ece.py`).
LR_PAPER_TEMPERATURES = (0.25, 0.5, 0.75, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0,
                         2.5, 3.0)


def select_temperature_from_grid(logits: ArrayLike, labels: ArrayLike,
                                 temperatures: Iterable[float] = LR_PAPER_TEMPERATURES, *,
                                 num_bins: int = 15, mask: Optional[ArrayLike] = None) -> float:
  """The temperature of `temperatures` with the lowest held-out ECE (first one on ties).

  This is how the label-relaxation paper calibrates its "CE + T opt." baseline: a grid searched
  for held-out ECE, not a continuous NLL fit (`fit_temperature`).
  """
  temperatures = [float(t) for t in temperatures]
  if not temperatures or min(temperatures) <= 0:
    raise ValueError(f"temperatures must be a non-empty list of values > 0, got {temperatures}.")
  logits, labels, mask = arrays.flatten_probs_labels(logits, labels, mask)
  eces = [float(metrics.ece(jax.nn.softmax(logits / t), labels, num_bins=num_bins, mask=mask))
          for t in temperatures]
  return temperatures[int(np.argmin(eces))]
