"""Confidence scores and post-hoc calibration (SPEC §3).

Scores map logits `[..., C]` to one number per sample, higher = more confident:
`msp`, `max_logit`, `neg_entropy`, `max_logit_pnorm` (logit normalisation, Cattelan & Silva
2023; Xia et al. 2024 Eq. 17). `fit_temperature` minimises held-out NLL;
`select_temperature_from_grid` picks the grid value with the lowest held-out ECE (the label
relaxation paper's protocol); `select_pnorm` picks the p-norm with the lowest held-out AURC, or
falls back to MSP.
"""
import functools
import numbers
from typing import Iterable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import metrics
from calib_jax.metrics import _checks

ArrayLike = jax.typing.ArrayLike

_GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0


def _logits_array(logits: ArrayLike) -> jax.Array:
  if np.ndim(logits) < 1 or np.shape(logits)[-1] < 1:
    raise ValueError(f"logits must have shape [..., C] with C >= 1, got {np.shape(logits)}.")
  return _checks.as_float_array(logits, "logits")


def msp(logits: ArrayLike) -> jax.Array:
  """Maximum softmax probability `max_k softmax(z)_k`, shape `[...]`."""
  return jnp.max(jax.nn.softmax(_logits_array(logits), axis=-1), axis=-1)


def max_logit(logits: ArrayLike) -> jax.Array:
  """Maximum logit `max_k z_k`, shape `[...]`."""
  return jnp.max(_logits_array(logits), axis=-1)


def neg_entropy(logits: ArrayLike) -> jax.Array:
  """Negative predictive entropy `Σ_k p_k log p_k` (≤ 0; higher = more confident)."""
  logp = jax.nn.log_softmax(_logits_array(logits), axis=-1)
  return jnp.sum(jnp.exp(logp) * logp, axis=-1)


def _check_p(p) -> float:
  if isinstance(p, bool) or not isinstance(p, numbers.Real) or not p >= 1:
    raise ValueError(f"p must be a real number >= 1 (or inf), got {p!r}.")
  return float(p)


@functools.partial(jax.jit, static_argnames=("p", "center"))
def _pnorm_score(logits, p: float, center: bool):
  v = logits - jnp.mean(logits, axis=-1, keepdims=True) if center else logits
  scale = jnp.max(jnp.abs(v), axis=-1, keepdims=True)
  safe = jnp.where(scale > 0, scale, 1.0)
  if np.isinf(p):
    norm_over_scale = jnp.ones_like(scale[..., 0])
  else:
    # Dividing by max|v| first keeps |v|^p finite for large logits and large p.
    norm_over_scale = jnp.sum(jnp.abs(v / safe) ** p, axis=-1) ** (1.0 / p)
  score = jnp.max(v / safe, axis=-1) / norm_over_scale
  # All-equal logits: no direction at all, the least confident possible score.
  return jnp.where(scale[..., 0] > 0, score, 0.0)


def max_logit_pnorm(logits: ArrayLike, p: float, center: bool = True) -> jax.Array:
  """Max of the p-norm-normalised logits: `max_k z'_k`, `z' = v / ‖v‖_p`.

  `v = z − mean(z)` when `center` (Cattelan & Silva's default), else `v = z` (LS-vs-SC Eq. 17).
  A sample whose `v` is all zeros scores 0. Shape `[...]`.

  Args:
    logits: `[..., C]`.
    p: norm order, a real >= 1 or `float('inf')`.
    center: subtract the per-sample mean logit first.
  """
  return _pnorm_score(_logits_array(logits), _check_p(p), bool(center))


def apply_temperature(logits: ArrayLike, temperature) -> jax.Array:
  """Temperature-scaled logits `z / T` (pass them to softmax for calibrated probabilities)."""
  if isinstance(temperature, numbers.Real) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}.")
  return _logits_array(logits) / jnp.asarray(temperature, jnp.float32)


@functools.partial(jax.jit, static_argnames="iterations")
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
  logits, labels, mask = _checks.flatten_probs_labels(logits, labels, mask)
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
  logits, labels, mask = _checks.flatten_probs_labels(logits, labels, mask)
  eces = [float(metrics.ece(jax.nn.softmax(logits / t), labels, num_bins=num_bins, mask=mask))
          for t in temperatures]
  return temperatures[int(np.argmin(eces))]


def pnorm_aurcs(logits: ArrayLike, labels: ArrayLike, ps: Iterable[float] = range(1, 10), *,
                center: bool = True, mask: Optional[ArrayLike] = None) -> dict:
  """Held-out AURC of MSP (key `"msp"`) and of `max_logit_pnorm` for each p (keys = p)."""
  logits, labels, mask = _checks.flatten_probs_labels(logits, labels, mask)
  correct = jnp.argmax(logits, axis=-1) == labels
  out = {"msp": float(metrics.aurc(msp(logits), correct, mask))}
  for p in ps:
    out[p] = float(metrics.aurc(max_logit_pnorm(logits, p, center), correct, mask))
  return out


def select_pnorm(logits: ArrayLike, labels: ArrayLike, ps: Iterable[float] = range(1, 10), *,
                 center: bool = True,
                 mask: Optional[ArrayLike] = None) -> Optional[Union[int, float]]:
  """The p whose `max_logit_pnorm` has the lowest held-out AURC, or None to keep MSP.

  Returns:
    The best p from `ps` (smallest p on exact ties), or `None` when MSP's AURC is lower or
    equal — the fallback of Cattelan & Silva: then use `msp` as the score.
  """
  ps = list(ps)
  if not ps:
    raise ValueError("ps must contain at least one p.")
  for p in ps:
    _check_p(p)
  aurcs = pnorm_aurcs(logits, labels, ps, center=center, mask=mask)
  best = min(ps, key=lambda p: aurcs[p])
  return None if aurcs["msp"] <= aurcs[best] else best
