"""Schedules and optimisers against independent numpy re-implementations of the PyTorch rules."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.training import optim


def _values(schedule, steps):
  return np.array([float(schedule(s)) for s in steps])


def test_multistep_changes_at_epoch_boundaries():
  sched = optim.make_schedule(name="multistep", base_lr=0.1, total_steps=100, steps_per_epoch=10,
                              boundaries_epochs=(2, 5), decay_factor=0.1)
  steps = [0, 19, 20, 49, 50, 99]
  np.testing.assert_allclose(_values(sched, steps), [0.1, 0.1, 0.01, 0.01, 0.001, 0.001],
                             rtol=1e-6)


def test_warmup_then_cosine_matches_formula():
  base, total, warm = 0.4, 50, 10
  sched = optim.make_schedule(name="cosine", base_lr=base, total_steps=total, steps_per_epoch=5,
                              warmup_epochs=2)
  expected = [base * s / warm if s < warm else
              base * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
              for s in range(total + 1)]
  np.testing.assert_allclose(_values(sched, range(total + 1)), expected, rtol=1e-5, atol=1e-7)


def test_poly_and_constant():
  sched = optim.make_schedule(name="poly", base_lr=0.01, total_steps=40, steps_per_epoch=4,
                              poly_power=0.9)
  steps = np.arange(41)
  np.testing.assert_allclose(_values(sched, steps), 0.01 * (1 - steps / 40) ** 0.9,
                             rtol=1e-5, atol=1e-9)
  const = optim.make_schedule(name="constant", base_lr=0.05, total_steps=10, steps_per_epoch=1)
  np.testing.assert_allclose(_values(const, [0, 5, 9]), 0.05, rtol=1e-7)


def _reference_lr(step: int, *, name: str, base_lr: float, total_steps: int,
                  steps_per_epoch: int, warmup_epochs: float, boundaries_epochs: tuple,
                  decay_factor: float, poly_power: float, time_decay: float) -> float:
  """The schedule formulas in plain Python, as the hand-written schedules computed them."""
  warmup = int(round(warmup_epochs * steps_per_epoch))
  if warmup > 0 and step < warmup:
    lr = base_lr * step / warmup
  elif name == "constant":
    lr = base_lr
  elif name == "multistep":
    passed = sum(step >= int(round(e * steps_per_epoch)) for e in boundaries_epochs)
    lr = base_lr * decay_factor ** passed
  else:
    progress = min(max((step - warmup) / max(total_steps - warmup, 1), 0.0), 1.0)
    if name == "cosine":
      lr = base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
      lr = base_lr * (1.0 - progress) ** poly_power
  return lr / (1.0 + time_decay * step) if time_decay > 0 else lr


@pytest.mark.parametrize("time_decay", [0.0, 2e-3])
@pytest.mark.parametrize("warmup_epochs", [0.0, 1.5])
@pytest.mark.parametrize("name", optim.SCHEDULES)
def test_schedules_equal_reference_formulas(name, warmup_epochs, time_decay):
  # A boundary inside the warm-up (epoch 1 = step 8 < 12), a repeated one, a fractional one.
  settings = dict(name=name, base_lr=0.4, total_steps=80, steps_per_epoch=8,
                  warmup_epochs=warmup_epochs, boundaries_epochs=(1, 3, 3, 6.5),
                  decay_factor=0.2, poly_power=0.9, time_decay=time_decay)
  steps = np.arange(90)  # Past the end of training too.
  got = np.asarray(jax.jit(optim.make_schedule(**settings))(jnp.asarray(steps)))
  expected = [_reference_lr(int(s), **settings) for s in steps]
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
  assert float(optim.make_schedule(**settings)(17)) == pytest.approx(expected[17], rel=1e-6)


def test_unknown_names_list_valid_ones():
  with pytest.raises(ValueError, match="cosine"):
    optim.make_schedule(name="linear", base_lr=0.1, total_steps=1, steps_per_epoch=1)
  with pytest.raises(ValueError, match="adamw"):
    optim.make_optimizer(name="rmsprop", learning_rate=0.1)


def _run(tx, params, grads_seq):
  opt_state = tx.init(params)
  for g in grads_seq:
    updates, opt_state = tx.update(g, opt_state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params


def _grads(seed, n=3):
  rng = np.random.default_rng(seed)
  return [{"a": rng.normal(size=(3,)).astype(np.float32),
           "b": rng.normal(size=(2, 2)).astype(np.float32)} for _ in range(n)]


def _params():
  return {"a": np.array([1.0, -2.0, 0.5], np.float32), "b": np.ones((2, 2), np.float32)}


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_torch_rule(nesterov):
  lr, mom, wd = 0.1, 0.9, 5e-3
  grads = _grads(0)
  tx = optim.make_optimizer(name="sgd", learning_rate=lr, momentum=mom, nesterov=nesterov,
                            weight_decay=wd)
  got = _run(tx, _params(), grads)
  # torch.optim.SGD: d = g + wd*p; buf = mom*buf + d; step = d + mom*buf (nesterov) or buf.
  for k in ("a", "b"):
    p, buf = _params()[k].astype(np.float64), None
    for g in grads:
      d = g[k] + wd * p
      buf = d if buf is None else mom * buf + d
      p = p - lr * (d + mom * buf if nesterov else buf)
    np.testing.assert_allclose(got[k], p, rtol=1e-5)


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_variants_match_torch_rule(name):
  lr, wd, b1, b2, eps = 1e-2, 0.05, 0.9, 0.999, 1e-8
  grads = _grads(1)
  tx = optim.make_optimizer(name=name, learning_rate=lr, weight_decay=wd, b1=b1, b2=b2, eps=eps)
  got = _run(tx, _params(), grads)
  for k in ("a", "b"):
    p = _params()[k].astype(np.float64)
    m = v = 0.0
    for t, g in enumerate(grads, start=1):
      g = g[k] + (wd * p if name == "adam" else 0.0)
      m = b1 * m + (1 - b1) * g
      v = b2 * v + (1 - b2) * g * g
      step = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
      p = p - lr * (step + (wd * p if name == "adamw" else 0.0))
    np.testing.assert_allclose(got[k], p, rtol=1e-5)


def test_clipping_uses_raw_gradient_and_multipliers_scale_subtrees():
  grads = [{"a": np.array([3.0, 4.0, 0.0], np.float32), "b": np.zeros((2, 2), np.float32)}]
  tx = optim.make_optimizer(name="sgd", learning_rate=1.0, momentum=0.0, weight_decay=0.1,
                            grad_clip_norm=1.0, lr_multipliers={"b": 0.5})
  got = _run(tx, _params(), grads)
  # Global norm 5 -> clipped to [0.6, 0.8, 0]; the decay term is added after clipping.
  np.testing.assert_allclose(got["a"], [1 - 0.6 - 0.1, -2 - 0.8 + 0.2, 0.5 - 0.05], rtol=1e-6)
  np.testing.assert_allclose(got["b"], 1 - 0.5 * 0.1, rtol=1e-6)
