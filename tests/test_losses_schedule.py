"""Loss hyper-parameter schedules (`calib_jax.losses.schedule`, `config.loss_schedule`): MaxSup's
linear alpha over the epochs, fed to the loss by the training step, and its config errors."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from calib_jax import experiment, losses
from calib_jax.config import ConfigError
from calib_jax.losses import schedule
from calib_jax.training import optim, parallel, programs, state as state_lib
from calib_jax.training import step as step_lib

from test_run_loop import tiny_config
from test_training_step import Linear


def test_linear_by_epoch_is_the_official_maxsup_formula():
  """`lam = 0.1 + 0.1·epoch/max(1, E − 1)`, constant within an epoch, clamped after the last."""
  steps = jnp.arange(14)
  values = np.asarray(schedule.linear_by_epoch(0.1, 0.2, steps, steps_per_epoch=3, num_epochs=4))
  epochs = np.minimum(np.arange(14) // 3, 3)
  np.testing.assert_allclose(values, 0.1 + 0.1 * epochs / 3, rtol=1e-6)
  assert values[0] == np.float32(0.1)  # the start exactly
  one_epoch = schedule.linear_by_epoch(0.1, 0.2, jnp.array(5), steps_per_epoch=10, num_epochs=1)
  np.testing.assert_allclose(one_epoch, 0.1, rtol=1e-6)  # E = 1: the start throughout


def test_the_train_step_feeds_each_step_its_epochs_alpha():
  """With the learning rate 0 the logits stay put, so the step's reported loss is MaxSup at the
  alpha of that step's epoch: the step reads `state.step` inside the compiled program."""
  rng = np.random.default_rng(0)
  batch = {"image": rng.normal(size=(8, 5)).astype(np.float32) * 3,
           "label": rng.integers(0, 3, 8).astype(np.int32), "mask": np.ones(8, bool)}
  model = Linear()
  variables = model.init({"params": jax.random.key(0)}, batch["image"][:1])
  sched = optim.make_schedule(name="constant", base_lr=0.0, total_steps=6, steps_per_epoch=2)
  tx = optax.sgd(0.0)
  mesh = parallel.make_mesh(jax.devices()[:1])
  state = parallel.replicate(state_lib.create(variables, tx, jax.random.key(1)), mesh)
  loss_at_step = schedule.scheduled(losses.traced("maxsup"), "alpha", start=0.1, end=0.3,
                                    steps_per_epoch=2, num_epochs=3)
  train_step = programs.train_program(programs.of_train_step(step_lib.make_train_step(
      model, losses.get("ce"), tx, sched, loss_at_step=loss_at_step)),
      programs.single_run_layout(mesh), per_step=True, resident=False)
  logits = model.apply(variables, batch["image"])
  reported = []
  for _ in range(6):
    state, metrics = train_step(state, parallel.to_global(batch, mesh))
    reported.append(float(metrics["loss"]))
  expected = [float(losses.get("maxsup", alpha=a)(logits, batch["label"]))
              for a in (0.1, 0.1, 0.2, 0.2, 0.3, 0.3)]
  np.testing.assert_allclose(reported, expected, rtol=1e-5)


def test_a_config_schedule_starts_at_loss_kwargs_and_ends_at_end():
  config = tiny_config(**{"loss": "maxsup", "loss_kwargs.alpha": 0.1, "num_train_steps": -1,
                          "num_epochs": 3, "steps_per_epoch": 4, "loss_schedule.name":
                          "linear_epochs", "loss_schedule.hparam": "alpha",
                          "loss_schedule.end": 0.2})
  built = experiment.build(config)
  z = jnp.asarray(np.random.default_rng(1).normal(size=(4, 10)) * 2, jnp.float32)
  y = jnp.arange(4)
  at = built.loss_at_step()
  for step, alpha in ((0, 0.1), (5, 0.15), (11, 0.2)):
    np.testing.assert_allclose(at(jnp.asarray(step))(z, y), losses.get("maxsup", alpha=alpha)(z, y),
                               rtol=1e-6)
  # A sweep member's (traced) alpha is the start of its own schedule.
  np.testing.assert_allclose(built.loss_at_step({"alpha": jnp.float32(0.3)})(jnp.asarray(11))(z, y),
                             losses.get("maxsup", alpha=0.2)(z, y), rtol=1e-6)
  assert experiment.build(tiny_config(loss="maxsup")).loss_at_step() is None  # default: off


@pytest.mark.parametrize("overrides,message", [
    ({"loss_schedule.name": "cosine"}, r"unknown loss_schedule.name 'cosine'; valid: none, "
     r"linear_epochs"),
    ({"loss_schedule.name": "linear_epochs", "loss_schedule.hparam": "beta"},
     r"loss_schedule.hparam='beta' is not a real hyper-parameter of loss 'maxsup' \(real ones: "
     r"alpha\)"),
    ({"loss_schedule.name": "linear_epochs", "loss_schedule.hparam": "alpha",
      "loss_schedule.end": -1.0}, r"loss_schedule.end: maxsup: alpha=-1.0 is outside"),
])
def test_bad_schedules_are_one_line_each(overrides, message):
  with pytest.raises(ConfigError, match=message):
    experiment.build(tiny_config(loss="maxsup", **overrides))
