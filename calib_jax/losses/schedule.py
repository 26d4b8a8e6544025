"""Hyper-parameter schedules of a loss: a real hyper-parameter as a function of the step.

    loss_at_step = scheduled(losses.traced("maxsup"), "alpha", start=0.1, end=0.2,
                             steps_per_epoch=937, num_epochs=50)
    value = loss_at_step(step)(logits, labels, mask=mask)   # α of that step's epoch

The training step calls `loss_at_step(state.step)` inside the compiled program (the step is a
traced int), so one program serves every step; `start` may be a sweep member's traced value.
Configs name a schedule in `config.loss_schedule` (`calib_jax.config.base_config`).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

# "none": the loss's hyper-parameters are constants; "linear_epochs": one of them goes
# linearly from its `loss_kwargs` value to `end`, epoch by epoch (the MaxSup code's α).
SCHEDULES = ("none", "linear_epochs")


def linear_by_epoch(start: Any, end: Any, step: jax.Array, *, steps_per_epoch: int,
                    num_epochs: int) -> jax.Array:
  """`start + (end − start)·e / max(1, E − 1)` with `e = step // steps_per_epoch` (0-based epoch,
  at most E − 1): `start` in the first epoch, `end` in the last, constant within an epoch.

  This is the official MaxSup code's `MaxSupLoss` (`lam = 0.1 + 0.1·epoch/max(1, E − 1)`, set
  once per epoch). Its ImageNet trainer's `MaxSuppression` divides by E instead, so its last
  epoch reaches `start + (end − start)·(E − 1)/E`, not `end`.
  """
  epoch = jnp.minimum(step // steps_per_epoch, num_epochs - 1).astype(jnp.float32)
  start = jnp.asarray(start, jnp.float32)
  return start + (jnp.asarray(end, jnp.float32) - start) * epoch / max(1, num_epochs - 1)


def scheduled(bind: Callable[..., Callable], hparam: str, *, start: Any, end: float,
              steps_per_epoch: int, num_epochs: int,
              values: Mapping[str, Any] | None = None) -> Callable[[jax.Array], Callable]:
  """`loss_at_step(step) -> loss_fn`: `bind` (from `losses.traced`) with `hparam` at its
  `linear_by_epoch` value for `step` and the other `values` bound as given."""
  values = dict(values or {})

  def loss_at_step(step: jax.Array) -> Callable:
    value = linear_by_epoch(start, end, step, steps_per_epoch=steps_per_epoch,
                            num_epochs=num_epochs)
    return bind(**{**values, hparam: value})

  return loss_at_step
