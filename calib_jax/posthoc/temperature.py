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

def apply_temperature(logits: ArrayLike, temperature) -> jax.Array:
  """Temperature-scaled logits `z / T` (pass them to softmax for calibrated probabilities)."""
  if isinstance(temperature, numbers.Real) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}.")
  return scores.logits_array(logits) / jnp.asarray(temperature, jnp.float32)


@functools.partial(program_store.jit, static_argnames="iterations")
def _fit_inverse_temperature(logits, labels, mask, s_lo, s_hi, iterations: int):
  """Safeguarded Newton on `s = 1/T` for the held-out NLL `f(s) = Σ_i lse(s z_i) − s z_{i,y_i}`.

  `f` is convex in `s`: `f'(s) = Σ_i E_p[z_i] − z_{i,y_i}` and `f''(s) = Σ_i Var_p[z_i] >= 0`
  (p = softmax(s z_i)), both from one pass over the logits. Each step keeps a bracket
  `[a, b]` of the minimum (left of it `f' < 0`); a Newton step that leaves the bracket bisects
  it instead, unless it points past an unevaluated bound, which is then tried (an optimum at a
  bound is found exactly). Where `f'' = 0` in float32 (every softmax one-hot, or the variances
  below float32's range) `f` is linear: the step goes to the side `-f'` points to. A flat `f`
  (`f' = 0`: equal logits in every row) keeps the start, `s = 1` clipped to the bounds. Stops when
  the Newton step is <= 1e-6 relative (~16 float32 ulps of s: at the rounding of the slope), or the
  bracket is that narrow, or after `iterations` steps. A NaN or infinite slope (a NaN logit, a
  +inf one, a -inf label logit: the NLL is NaN or infinite) stops at `s_hi`, the lowest T, as the
  golden-section search this replaced returned; a -inf logit off the label is a class of p = 0.
  """
  n = labels.shape[0]
  weights = jnp.ones(n, jnp.float32) if mask is None else mask.astype(jnp.float32)
  safe_labels = jnp.clip(labels, 0, logits.shape[1] - 1)  # masked entries may hold 255
  # Logits minus their row max (s > 0 keeps it the max of s z): exp never overflows. The
  # label's is exact (a -inf there is an infinite NLL); the others are floored at -110 / s_lo,
  # where exp(s z) is 0 in float32 for every s >= s_lo as it was, so that e z and e z² are 0,
  # not NaN (0 * inf), beside a -inf logit or a square that overflows (|z| > 1.8e19).
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  shifted = jnp.maximum(logits - row_max, -110.0 / s_lo)
  shifted_label = jnp.take_along_axis(logits, safe_labels[:, None], 1)[:, 0] - row_max[:, 0]
  valid = weights > 0

  def slope_and_curvature(s):
    e = jnp.exp(s * shifted)
    total = jnp.sum(e, axis=-1)
    mean = jnp.sum(e * shifted, axis=-1) / total
    second = jnp.sum(e * jnp.square(shifted), axis=-1) / total
    slope = jnp.sum(jnp.where(valid, mean - shifted_label, 0.0))
    curvature = jnp.sum(jnp.where(valid, jnp.maximum(second - jnp.square(mean), 0.0), 0.0))
    return slope, curvature

  def step(carry):
    i, s, a, b, a_open, b_open, _ = carry
    slope, curvature = slope_and_curvature(s)
    right = slope < 0  # the minimum lies right of s
    a = jnp.where(right, s, a)
    b = jnp.where(right, b, s)
    a_open = a_open & ~right
    b_open = b_open & right
    # No curvature: f is linear here, so the step is unbounded towards the side -f' points to
    # (a bound still open, else a bisection); a zero slope is the minimum (a flat f).
    linear = jnp.where(slope < 0, jnp.inf, -jnp.inf)
    newton = jnp.where(curvature > 0, s - slope / jnp.where(curvature > 0, curvature, 1.0), linear)
    newton = jnp.where(slope == 0, s, newton)
    inside = (newton > a) & (newton < b)
    new = jnp.where(inside, newton, 0.5 * (a + b))
    new = jnp.where(~inside & b_open & (newton >= b), b, new)
    new = jnp.where(~inside & a_open & (newton <= a), a, new)
    # A Newton step of ~16 float32 ulps of s is at the rounding of the slope: s is the minimum.
    done = (jnp.abs(newton - s) <= 1e-6 * s) | (b - a <= 1e-6 * s)
    new = jnp.where(done, s, new)
    broken = ~(jnp.isfinite(slope) & jnp.isfinite(curvature))  # NaN or infinite logits
    return i + 1, jnp.where(broken, s_hi, new), a, b, a_open, b_open, done | broken

  def keep_going(carry):
    i, *_, done = carry
    return (i < iterations) & ~done

  start = jnp.clip(jnp.float32(1.0), s_lo, s_hi)  # T = 1: the logits as they are
  carry = (jnp.int32(0), start, s_lo, s_hi, jnp.bool_(True), jnp.bool_(True), jnp.bool_(False))
  return lax.while_loop(keep_going, step, carry)[1]


def fit_temperature(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None,
                    *, bounds=(0.05, 20.0), iterations: int = 48) -> float:
  """Temperature `T > 0` minimising the NLL of `softmax(logits / T)` on held-out data.

  A safeguarded Newton search on `1/T` (NLL is convex in `1/T`), kept inside `bounds`; it
  usually stops after 5–10 steps, when a Newton step would move `1/T` by at most 1e-6 relative.
  Equal logits in every row (a flat NLL) give T = 1 clipped to `bounds`; logits that make the NLL
  NaN or infinite (a NaN, a +inf, a -inf at the label) give `T_min`.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    bounds: search interval `(T_min, T_max)`; the result is clipped to it.
    iterations: search steps at most.

  Returns:
    T as a Python float.
  """
  lo, hi = bounds
  if not 0 < lo < hi:
    raise ValueError(f"bounds must satisfy 0 < T_min < T_max, got {bounds}.")
  logits, labels, mask = arrays.flatten_probs_labels(logits, labels, mask)
  inverse_t = _fit_inverse_temperature(logits, labels, mask, jnp.float32(1.0 / hi),
                                       jnp.float32(1.0 / lo), int(iterations))
  return float(np.clip(1.0 / float(inverse_t), lo, hi))


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
