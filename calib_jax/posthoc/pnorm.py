"""Logit-normalised confidence `max_logit_pnorm` and its held-out selection.

Logit normalisation: Cattelan & Silva 2023 ("How to fix a broken confidence estimator"); the
uncentred form is Eq. 17 of Xia et al. 2024 (label smoothing vs selective classification).
`select_pnorm` picks the p-norm with the lowest held-out AURC, or falls back to MSP.
"""
import functools
import numbers
from typing import Iterable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import program_store
from calib_jax import metrics
from calib_jax import arrays
from calib_jax.posthoc import scores

ArrayLike = jax.typing.ArrayLike


def _check_p(p) -> float:
  if isinstance(p, bool) or not isinstance(p, numbers.Real) or not p >= 1:
    raise ValueError(f"p must be a real number >= 1 (or inf), got {p!r}.")
  return float(p)


# p is traced (one compiled program for every finite p: `select_pnorm` tries nine of them);
# only whether it is infinite is static.
@functools.partial(program_store.jit, static_argnames=("infinite", "center"))
def _pnorm_score(logits, p: jax.Array, infinite: bool, center: bool):
  v = logits - jnp.mean(logits, axis=-1, keepdims=True) if center else logits
  scale = jnp.max(jnp.abs(v), axis=-1, keepdims=True)
  safe = jnp.where(scale > 0, scale, 1.0)
  if infinite:
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
  p = _check_p(p)
  return _pnorm_score(scores.logits_array(logits), jnp.float32(1.0 if np.isinf(p) else p),
                      bool(np.isinf(p)), bool(center))


def pnorm_aurcs(logits: ArrayLike, labels: ArrayLike, ps: Iterable[float] = range(1, 10), *,
                center: bool = True, mask: Optional[ArrayLike] = None) -> dict:
  """Held-out AURC of MSP (key `"msp"`) and of `max_logit_pnorm` for each p (keys = p)."""
  logits, labels, mask = arrays.flatten_probs_labels(logits, labels, mask)
  correct = _argmax_is(logits, labels)
  # Every AURC dispatched before any is fetched: the host waits once, not once per p.
  ps = list(ps)
  finite = [p for p in ps if not np.isinf(_check_p(p))]
  pending = {"msp": metrics.aurc(scores.msp(logits), correct, mask)}
  if finite:
    pending["finite"] = _finite_pnorm_aurcs(logits, correct, mask,
                                            jnp.asarray(finite, jnp.float32), bool(center))
  if len(finite) < len(ps):
    pending["inf"] = metrics.aurc(max_logit_pnorm(logits, float("inf"), center), correct, mask)
  got = jax.device_get(pending)
  out = {"msp": float(got["msp"])}
  out.update(zip(finite, map(float, got.get("finite", ()))))
  if "inf" in got:
    out.update({p: float(got["inf"]) for p in ps if np.isinf(p)})
  return out


# All finite p in one program: the scores' pass over the logits (a power per entry, ~0.5 s of
# CPU per p at 25,000 x 1,000) was nine programs, one per p; in one it is about half the CPU.
# Each p's score is `_pnorm_score`'s ops (traced p, mapped one p at a time), so the same bits.
@functools.partial(program_store.jit, static_argnames="center")
def _finite_pnorm_aurcs(logits, correct, mask, ps, center: bool):
  return lax.map(
      lambda p: metrics.aurc(_pnorm_score(logits, p, False, center), correct, mask), ps)


@program_store.jit
def _argmax_is(logits, labels):
  return jnp.argmax(logits, axis=-1) == labels


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
