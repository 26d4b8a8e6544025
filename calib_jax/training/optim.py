"""Optimisers and learning-rate schedules from a config, PyTorch-equivalent where the papers were.

The papers' recipes were run in PyTorch, so the optimisers reproduce PyTorch's update rules:
`sgd` and `adam` add *coupled* L2 weight decay to the gradient before momentum (torch.optim.SGD /
Adam `weight_decay`), `adamw` uses decoupled decay (torch.optim.AdamW == optax.adamw). Gradient
clipping acts on the raw gradient, before the decay term is added, as `clip_grad_norm_` does.

Schedules are optax schedules of the optimiser step. Epoch-valued settings (boundaries, warm-up)
are converted with `steps_per_epoch`, so a multi-step schedule changes at the first step of the
epoch where PyTorch's per-epoch `MultiStepLR` would.
"""
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax


SCHEDULES = ("constant", "multistep", "cosine", "poly")
OPTIMIZERS = ("sgd", "adam", "adamw")


def _epochs_to_steps(epochs: float, steps_per_epoch: int) -> int:
  return int(round(epochs * steps_per_epoch))


def make_schedule(
    *,
    name: str,
    base_lr: float,
    total_steps: int,
    steps_per_epoch: int,
    warmup_epochs: float = 0.0,
    boundaries_epochs: Sequence[float] = (),
    decay_factor: float = 0.1,
    poly_power: float = 0.9,
    time_decay: float = 0.0,
) -> optax.Schedule:
  """Returns `step -> learning rate`.

  Args:
    name: `constant`; `multistep` (multiply by `decay_factor` at each boundary, in epochs);
      `cosine` (from `base_lr` after warm-up to 0 at `total_steps`); `poly` (`base_lr·(1 −
      s/total)^power`, the DeepLab "poly" policy).
    base_lr: peak learning rate.
    total_steps: length of training in optimiser steps.
    steps_per_epoch: converts epoch-valued arguments to steps.
    warmup_epochs: linear warm-up from 0 to `base_lr` over this many epochs (0 = none); the
      main schedule takes over at the end of the warm-up, with cosine/poly decaying over the
      remaining steps and multi-step boundaries kept at their absolute epochs.
    boundaries_epochs: multi-step boundaries, in epochs.
    decay_factor: multi-step factor.
    poly_power: exponent of the poly schedule.
    time_decay: Keras-style inverse time decay on top of the schedule, `lr / (1 + time_decay ·
      step)` (the `decay` argument of Keras' SGD, which the label-relaxation code uses; 0 = off).
  """
  if name not in SCHEDULES:
    raise ValueError(f"Unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
  warmup_steps = _epochs_to_steps(warmup_epochs, steps_per_epoch)
  decay_steps = max(total_steps - warmup_steps, 1)
  if name == "constant":
    main = optax.constant_schedule(base_lr)
  elif name == "multistep":
    # join_schedules hands the main schedule the steps since the end of the warm-up, so the
    # boundaries move back by the warm-up to stay at their absolute epochs (one that falls
    # inside the warm-up is then already passed). Repeated boundaries multiply their factors.
    scales: dict[int, float] = {}
    for epochs in boundaries_epochs:
      boundary = _epochs_to_steps(epochs, steps_per_epoch) - warmup_steps
      scales[boundary] = scales.get(boundary, 1.0) * decay_factor
    main = optax.piecewise_constant_schedule(base_lr, scales)
  elif name == "cosine":
    main = optax.cosine_decay_schedule(base_lr, decay_steps=decay_steps)
  else:
    poly = optax.polynomial_schedule(
        init_value=base_lr, end_value=0.0, power=poly_power, transition_steps=decay_steps)
    # From the end of the decay on, the constant end value: at that step XLA can fuse optax's
    # `1 - count / transition_steps` into a slightly negative base, whose power is NaN.
    main = optax.join_schedules([poly, optax.constant_schedule(0.0)], boundaries=[decay_steps])
  if warmup_steps > 0:
    warmup = optax.linear_schedule(0.0, base_lr, transition_steps=warmup_steps)
    main = optax.join_schedules([warmup, main], boundaries=[warmup_steps])

  def schedule(step):
    step = jnp.asarray(step, jnp.int32)
    lr = main(step)
    if time_decay > 0:  # optax has no inverse time decay on top of another schedule.
      lr = lr / (1.0 + time_decay * step)
    return jnp.asarray(lr, jnp.float32)

  return schedule


def schedule_from_config(schedule: Any, *, base_lr: float, total_steps: int,
                         steps_per_epoch: int) -> optax.Schedule:
  """`make_schedule` from a config's `schedule` sub-config (checked by `schedule_problems`, which
  `experiment.build` runs with every other check before anything is built)."""
  return make_schedule(
      name=schedule.name,
      base_lr=base_lr,
      total_steps=total_steps,
      steps_per_epoch=steps_per_epoch,
      warmup_epochs=schedule.warmup_epochs,
      boundaries_epochs=tuple(schedule.boundaries_epochs),
      decay_factor=schedule.decay_factor,
      poly_power=schedule.poly_power,
      time_decay=schedule.time_decay,
  )


def _scale_by_top_level_multiplier(
    multipliers: Mapping[str, float]) -> optax.GradientTransformation:
  """Multiplies the updates of each top-level parameter subtree named in `multipliers`.

  Scaling the final update is exactly a per-group learning rate (PyTorch param groups), weight
  decay included, because every optimiser here is linear in the learning rate.
  """

  def update_fn(updates, state, params=None):
    del params
    if not multipliers:
      return updates, state
    return {k: jax.tree.map(lambda u, m=multipliers.get(k, 1.0): u * m, v)
            for k, v in updates.items()}, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(
    *,
    name: str,
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.9,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    grad_clip_norm: float = 0.0,
    lr_multipliers: Mapping[str, float] | None = None,
) -> optax.GradientTransformation:
  """Builds the optimiser chain `clip -> (coupled decay) -> method -> lr -> per-subtree lr`.

  Args:
    name: `sgd` (heavy-ball / Nesterov momentum as torch.optim.SGD, dampening 0), `adam`
      (torch.optim.Adam) or `adamw` (decoupled decay, torch.optim.AdamW).
    learning_rate: constant or schedule.
    momentum: SGD momentum (0 = plain SGD).
    nesterov: Nesterov momentum for SGD.
    weight_decay: L2 coefficient (coupled for sgd/adam, decoupled for adamw); applied to every
      parameter, as PyTorch does by default.
    b1, b2, eps: Adam moments.
    grad_clip_norm: clip the global gradient norm to this value (0 = no clipping).
    lr_multipliers: top-level parameter name -> learning-rate multiplier (e.g. a backbone trained
      at a tenth of the head's rate).
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"Unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
  # An array weight decay (a sweep member's, traced) always gets the decay term, so every
  # member's optimiser has the same structure; a member with 0 adds 0·p.
  decays = not isinstance(weight_decay, (int, float)) or weight_decay > 0
  chain = []
  if grad_clip_norm > 0:
    chain.append(optax.clip_by_global_norm(grad_clip_norm))
  if name in ("sgd", "adam") and decays:
    chain.append(optax.add_decayed_weights(weight_decay))
  if name == "sgd":
    if momentum > 0:
      chain.append(optax.trace(decay=momentum, nesterov=nesterov))
  else:
    chain.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    if name == "adamw" and decays:
      chain.append(optax.add_decayed_weights(weight_decay))
  chain.append(optax.scale_by_learning_rate(learning_rate))
  chain.append(_scale_by_top_level_multiplier(dict(lr_multipliers or {})))
  return optax.chain(*chain)


def optimizer_from_config(optimizer: Any, schedule: optax.Schedule, *,
                          weight_decay: Any = None) -> optax.GradientTransformation:
  """`make_optimizer` from a config's `optimizer` sub-config with the learning rate `schedule`
  (checked by `optimizer_problems`, run by `experiment.build`; `sam_rho` is read by the train
  step). `weight_decay`, if given, replaces the config's (a sweep member's traced value)."""
  return make_optimizer(
      name=optimizer.name,
      learning_rate=schedule,
      momentum=optimizer.momentum,
      nesterov=optimizer.nesterov,
      weight_decay=optimizer.weight_decay if weight_decay is None else weight_decay,
      b1=optimizer.b1,
      b2=optimizer.b2,
      eps=optimizer.eps,
      grad_clip_norm=optimizer.grad_clip_norm,
      lr_multipliers=dict(optimizer.lr_multipliers),
  )
