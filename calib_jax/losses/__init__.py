"""The label-smoothing family of calibration losses (docs/conventions.md#losses).

    loss_fn = calib_jax.losses.get("mbls", margin=10.0)
    value = loss_fn(logits, labels, mask=None, objectness=None)   # float32 scalar

Every loss works on logits `[..., C]` (classification `[B, C]`, segmentation `[B, H, W, C]`),
averages over the entries `mask` selects (all masked -> 0.0), computes in float32 whatever the
input dtype, and is a pure function of arrays (jit-, vmap- and grad-able).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from calib_jax.losses import (adaptive, basic, batch_terms, margin, normalised, pairwise,
                              relaxation, schedule)
from calib_jax.losses._common import LossInputs, masked_mean, prepare
from calib_jax.losses.adaptive import objectness_targets
from calib_jax.losses.basic import smoothed_targets
from calib_jax.losses.hparams import Choice, Real

LossFn = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class _LossDef:
  fn: Callable[..., jax.Array]
  hparams: Mapping[str, Real | Choice]
  batch_level: bool = False          # `fn` returns the reduced scalar itself
  needs_objectness: bool = False


_LOSSES: dict[str, _LossDef] = {
    "ce": _LossDef(basic.cross_entropy, {}),
    "ls": _LossDef(basic.label_smoothing, {"epsilon": Real(0.1, 0.0, 1.0)}),
    "focal": _LossDef(basic.focal, {"gamma": Real(3.0)}),
    "flsd": _LossDef(basic.focal_sample_dependent, {"gamma": Real(3.0)}),
    "ecp": _LossDef(basic.confidence_penalty, {"beta": Real(0.1)}),
    "mbls": _LossDef(margin.margin_label_smoothing, {"margin": Real(10.0), "alpha": Real(0.1)}),
    "acls": _LossDef(margin.adaptive_conditional_label_smoothing, {
        "margin": Real(10.0),
        "lambda_pos": Real(0.1),
        "lambda_neg": Real(0.01),
        "winner_term": Choice("max", ("max", "max_minus_min")),
    }),
    "lr": _LossDef(relaxation.label_relaxation, {"alpha": Real(0.1, 0.0, 1.0, high_open=True)}),
    "als": _LossDef(adaptive.adaptive_label_smoothing, {"beta": Real(1.0, 0.0, 1.0)},
                    needs_objectness=True),
    "mdca": _LossDef(batch_terms.mdca, {"beta": Real(1.0)}, batch_level=True),
    "cpc": _LossDef(pairwise.pairwise_constraints, {"lambda_1v1": Real(1.0), "lambda_be": Real(1.0)}),
    "mmce": _LossDef(batch_terms.mmce, {"weight": Real(1.0)}, batch_level=True),
    "maxsup": _LossDef(margin.max_suppression, {"alpha": Real(0.1)}),
    "logitnorm": _LossDef(normalised.logit_norm,
                          {"temperature": Real(0.04, 0.0, low_open=True)}),
}


def names() -> list[str]:
  """Names accepted by `get`, in the order of docs/conventions.md#loss-formulas."""
  return list(_LOSSES)


def default_hparams(name: str) -> dict[str, Any]:
  """The hyper-parameters `get(name)` uses when none are given."""
  return {k: spec.default for k, spec in _lookup(name).hparams.items()}


def _lookup(name: str) -> _LossDef:
  if name not in _LOSSES:
    raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(names())}")
  return _LOSSES[name]


def get(name: str, **hparams: Any) -> LossFn:
  """Returns `loss_fn(logits, labels, *, mask=None, objectness=None) -> float32 scalar`.

  Args:
    name: one of `names()`.
    **hparams: the loss's hyper-parameters (see `default_hparams(name)`); unknown ones and values
      out of range raise here, before any tracing.
  """
  definition = _lookup(name)
  unknown = set(hparams) - set(definition.hparams)
  if unknown:
    raise ValueError(f"loss {name!r} got unknown hyper-parameter(s) {sorted(unknown)}; valid: "
                     f"{sorted(definition.hparams) or 'none'}")
  values = {k: spec.check(name, k, hparams.get(k, spec.default))
            for k, spec in definition.hparams.items()}
  return functools.partial(_apply, name, definition, hparams=values)


def traced(name: str, **hparams: Any) -> Callable[..., LossFn]:
  """Returns `bind(**values) -> loss_fn`: the loss with some real hyper-parameters given later,
  as arrays (a sweep's per-member values inside `jax.vmap`, with no retrace per value).

  `hparams` are checked as in `get` and fix the others; `bind`'s values are not checked (they
  may be tracers), so check them first with `check_hparam`. A `Choice` hyper-parameter (a
  string that picks the formula) cannot be bound: it changes the program.

  Every real hyper-parameter of the returned loss, bound or fixed, reaches the formula through
  `jax.lax.optimization_barrier`: the compiler sees an opaque float32 scalar, never its value.
  With a value it can see, XLA specialises the program (e.g. `p ** 2.0` becomes `p * p`) and
  rounds differently from the same step with a traced value, and over thousands of steps that
  last-bit difference grows to the seed-to-seed spread. So `bind()` with no values is the loss
  of a single training run (`experiment.build`) whose compiled step does the arithmetic of a
  sweep member with the same values, bit for bit on CPU; `get` leaves the values visible.
  """
  definition = _lookup(name)
  checked = dict(get(name, **hparams).keywords["hparams"])

  def bind(**values: Any) -> LossFn:
    for key in values:
      if not isinstance(definition.hparams.get(key), Real):
        raise ValueError(f"loss {name!r}: {key!r} is not a real hyper-parameter of it (real "
                         f"ones: {sorted(real_hparams(name)) or 'none'})")
    return functools.partial(_apply_opaque, name, definition, hparams={**checked, **values})

  return bind


def _apply_opaque(name: str, definition: _LossDef, logits, labels, *,
                  hparams: Mapping[str, Any], **inputs) -> jax.Array:
  """`_apply` with each real hyper-parameter hidden from the compiler (see `traced`); the
  barrier is applied here, at trace time, so a value fixed in Python is a runtime scalar."""
  hidden = {k: (jax.lax.optimization_barrier(jnp.asarray(v, jnp.float32))
                if isinstance(definition.hparams.get(k), Real) else v)
            for k, v in hparams.items()}
  return _apply(name, definition, logits, labels, hparams=hidden, **inputs)


def hparam_specs(name: str) -> dict[str, Real | Choice]:
  """Each hyper-parameter of loss `name` with its spec: a `Real` (a number, traceable; `.check`
  gives its range error) or a `Choice` (a string that picks a formula), `.default` either."""
  return dict(_lookup(name).hparams)


def real_hparams(name: str) -> list[str]:
  """The hyper-parameters of loss `name` that are real numbers (traceable; see `traced`)."""
  return [k for k, spec in _lookup(name).hparams.items() if isinstance(spec, Real)]


def check_hparam(name: str, key: str, value: Any) -> float:
  """`value` of hyper-parameter `key` of loss `name`, checked (a one-line error if invalid)."""
  definition = _lookup(name)
  if key not in definition.hparams:
    raise ValueError(f"loss {name!r} has no hyper-parameter {key!r}; valid: "
                     f"{sorted(definition.hparams) or 'none'}")
  return definition.hparams[key].check(name, key, value)


def loss_schedule_problems(name: str, loss_schedule: Any) -> list[str]:
  """What is wrong with a config's `loss_schedule` (`.name`, `.hparam`, `.end`) for loss `name`,
  one line each: an unknown schedule, a hyper-parameter that is not one of the loss's real ones,
  an end value out of the hyper-parameter's range."""
  if loss_schedule.name not in schedule.SCHEDULES:
    return [f"unknown loss_schedule.name {loss_schedule.name!r}; valid: "
            f"{', '.join(schedule.SCHEDULES)}"]
  if loss_schedule.name == "none":
    return []
  real = real_hparams(name)
  if loss_schedule.hparam not in real:
    return [f"loss_schedule.hparam={loss_schedule.hparam!r} is not a real hyper-parameter of "
            f"loss {name!r} (real ones: {', '.join(real) or 'none'})"]
  try:
    check_hparam(name, loss_schedule.hparam, loss_schedule.end)
  except (ValueError, TypeError) as e:
    return [f"loss_schedule.end: {e}"]
  return []


def _apply(name: str, definition: _LossDef, logits, labels, *, hparams: Mapping[str, Any],
           mask=None, objectness=None) -> jax.Array:
  if definition.needs_objectness and objectness is None:
    raise ValueError(f"loss {name!r} needs `objectness` (fraction of the crop covered by the "
                     "label's objects, < 0 for context-only samples)")
  inputs = prepare(name, logits, labels, mask, objectness)
  if definition.batch_level:
    return definition.fn(inputs, **hparams)
  return masked_mean(definition.fn(inputs, **hparams), inputs.weights)


def effective_target(loss_fn: LossFn, logits, labels, **kwargs) -> jax.Array:
  """The target distribution each entry is pushed towards: `p − ∇_z L` per entry (ACLS Eq. 8).

  `loss_fn` averages over the N valid entries, so the per-entry gradient is N times the gradient
  of its value. For `ce` this is `onehot(y)`, for `ls` the smoothed labels `q`. Entries that
  `mask` excludes get zero gradient, so their "target" is `p` itself.
  """
  logits = jnp.asarray(logits, jnp.float32)
  mask = kwargs.get("mask")
  count = jnp.asarray(labels).size if mask is None else jnp.sum(mask)
  grad = jax.grad(lambda z: loss_fn(z, labels, **kwargs))(logits)
  return jax.nn.softmax(logits) - jnp.maximum(count, 1) * grad


__all__ = ["get", "traced", "schedule", "hparam_specs", "real_hparams", "check_hparam", "names", "default_hparams", "effective_target", "smoothed_targets",
           "objectness_targets", "LossInputs"]
