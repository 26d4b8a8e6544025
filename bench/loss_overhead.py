"""Cost of each calibration loss inside a jit-compiled train step, relative to plain CE.

    .venv/bin/python bench/loss_overhead.py [--model small_cnn] [--batch 128] [--repeats 7]

The trainer's own SGD step (`calib_jax.training.step.make_train_step`: forward, loss, backward,
update) of the model on a fixed batch is compiled per loss. Losses are timed round-robin, in a
fresh random order every repeat, so that drift in machine load hits them alike; the table shows
the median time per step and its ratio to CE. On a busy machine that ratio is noisy, so the
table also shows the loss's own cost: value and gradient of the loss alone on logits of the
step's shape (jit, median), and that cost as a fraction of the CE step. Not a test: it prints
numbers.
"""
from __future__ import annotations

import random
import statistics
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp

from calib_jax import losses, models
from calib_jax.training import optim, state as state_lib, step as step_lib

_MODEL = flags.DEFINE_string("model", "small_cnn", "a model of the zoo")
_NUM_CLASSES = flags.DEFINE_integer("num-classes", 10, "classes of the logits")
_BATCH = flags.DEFINE_integer("batch", 128, "batch size")
_IMAGE_SIZE = flags.DEFINE_integer("image-size", 32, "side of the square input images")
_STEPS = flags.DEFINE_integer("steps", 5, "steps per timing")
_REPEATS = flags.DEFINE_integer("repeats", 7, "timings of each loss (the median is reported)")
_LOSSES = flags.DEFINE_string("losses", ",".join(losses.names()), "comma-separated losses")


def time_steps(step, state, batch, steps: int) -> float:
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  return (time.perf_counter() - start) / steps


def time_loss_alone(loss_fn, logits, labels, extra, calls: int = 50) -> float:
  grad_fn = jax.jit(jax.value_and_grad(lambda z: loss_fn(z, labels, **extra)))
  jax.block_until_ready(grad_fn(logits))
  samples = []
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(calls):
      out = grad_fn(logits)
    jax.block_until_ready(out)
    samples.append((time.perf_counter() - start) / calls)
  return statistics.median(samples)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  model_name, num_classes, batch_size = _MODEL.value, _NUM_CLASSES.value, _BATCH.value
  image_size, steps_per_timing, repeats = _IMAGE_SIZE.value, _STEPS.value, _REPEATS.value
  key = jax.random.key(0)
  images = jax.random.normal(key, (batch_size, image_size, image_size, 3))
  labels = jax.random.randint(key, (batch_size,), 0, num_classes)
  model = models.get(model_name, num_classes)
  variables = model.init({"params": key}, images[:1], train=False)
  schedule = optim.make_schedule(name="constant", base_lr=0.01, total_steps=10**6,
                                 steps_per_epoch=100)
  tx = optim.make_optimizer(name="sgd", learning_rate=schedule, momentum=0.9)
  state = state_lib.create(variables, tx, key)

  names = _LOSSES.value.split(",")
  steps = {}
  for name in names:
    extra = {"objectness": jnp.linspace(-0.1, 1.0, batch_size)} if name == "als" else {}
    batch = {"image": images, "label": labels, **extra}
    step = jax.jit(step_lib.make_train_step(model, losses.get(name), tx, schedule))
    time_steps(step, state, batch, 2)  # compile + warm up
    steps[name] = (step, batch, extra)

  times = {name: [] for name in names}
  order = list(names)
  shuffler = random.Random(0)
  for _ in range(repeats):
    shuffler.shuffle(order)
    for name in order:
      step, batch, _ = steps[name]
      times[name].append(time_steps(step, state, batch, steps_per_timing))

  medians = {name: statistics.median(t) for name, t in times.items()}
  base = medians.get("ce", min(medians.values()))
  logits = jax.random.normal(key, (batch_size, num_classes))
  alone = {name: time_loss_alone(losses.get(name), logits, labels, steps[name][2])
           for name in names}
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, model {model_name}, "
        f"batch {batch_size}x{image_size}x{image_size}x3, {num_classes} classes, "
        f"median of {repeats}x{steps_per_timing} steps")
  print(f"{'loss':<8}{'ms/step':>10}{'vs ce':>9}{'loss alone (us)':>17}{'% of ce step':>14}")
  for name in names:
    print(f"{name:<8}{medians[name] * 1e3:>10.2f}{medians[name] / base:>9.3f}"
          f"{alone[name] * 1e6:>17.1f}{100 * alone[name] / base:>14.3f}")


if __name__ == "__main__":
  app.run(main)
