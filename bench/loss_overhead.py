"""Cost of each calibration loss inside a jit-compiled train step, relative to plain CE.

    .venv/bin/python bench/loss_overhead.py [--model small_cnn] [--batch 128] [--repeats 7]

The trainer's own SGD step (`calib_jax.training.step.make_train_step`: forward, loss, backward,
update) of the model on a fixed batch is compiled per loss. Losses are timed round-robin, in a fresh random order every repeat, so that drift in
machine load hits them alike; the table shows the median time per step and its ratio to CE.
On a busy machine that ratio is noisy, so the table also shows the loss's own cost: value and
gradient of the loss alone on logits of the step's shape (jit, median), and that cost as a
fraction of the CE step. Not a test: it prints numbers.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import jax
import jax.numpy as jnp

from calib_jax import losses, models
from calib_jax.training import optim, state as state_lib, step as step_lib


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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="small_cnn")
  parser.add_argument("--num-classes", type=int, default=10)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--image-size", type=int, default=32)
  parser.add_argument("--steps", type=int, default=5, help="steps per timing")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--losses", default=",".join(losses.names()))
  args = parser.parse_args()

  key = jax.random.key(0)
  images = jax.random.normal(key, (args.batch, args.image_size, args.image_size, 3))
  labels = jax.random.randint(key, (args.batch,), 0, args.num_classes)
  model = models.get(args.model, args.num_classes)
  variables = model.init({"params": key}, images[:1], train=False)
  schedule = optim.make_schedule(name="constant", base_lr=0.01, total_steps=10**6,
                                 steps_per_epoch=100)
  tx = optim.make_optimizer(name="sgd", learning_rate=schedule, momentum=0.9)
  state = state_lib.create(variables, tx, key)

  names = args.losses.split(",")
  steps = {}
  for name in names:
    extra = {"objectness": jnp.linspace(-0.1, 1.0, args.batch)} if name == "als" else {}
    batch = {"image": images, "label": labels, **extra}
    step = jax.jit(step_lib.make_train_step(model, losses.get(name), tx, schedule))
    time_steps(step, state, batch, 2)  # compile + warm up
    steps[name] = (step, batch, extra)

  times = {name: [] for name in names}
  order = list(names)
  shuffler = random.Random(0)
  for _ in range(args.repeats):
    shuffler.shuffle(order)
    for name in order:
      step, batch, _ = steps[name]
      times[name].append(time_steps(step, state, batch, args.steps))

  medians = {name: statistics.median(t) for name, t in times.items()}
  base = medians.get("ce", min(medians.values()))
  logits = jax.random.normal(key, (args.batch, args.num_classes))
  alone = {name: time_loss_alone(losses.get(name), logits, labels, steps[name][2])
           for name in names}
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, model {args.model}, "
        f"batch {args.batch}x{args.image_size}x{args.image_size}x3, {args.num_classes} classes, "
        f"median of {args.repeats}x{args.steps} steps")
  print(f"{'loss':<8}{'ms/step':>10}{'vs ce':>9}{'loss alone (us)':>17}{'% of ce step':>14}")
  for name in names:
    print(f"{name:<8}{medians[name] * 1e3:>10.2f}{medians[name] / base:>9.3f}"
          f"{alone[name] * 1e6:>17.1f}{100 * alone[name] / base:>14.3f}")


if __name__ == "__main__":
  main()
