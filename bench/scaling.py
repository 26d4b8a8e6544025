"""Training throughput of the data-parallel train step on 1/2/4/8 (fake CPU) devices.

    .venv/bin/python bench/scaling.py [--devices 1,2,4,8] [--batch 128] [--steps 5]

Each device count runs in its own process (XLA fixes the device count at start-up with
`--xla_force_host_platform_device_count`), building the real train step of `calib_jax.training`
(jit over a 1-D mesh, batch sharded, state replicated) for `small_cnn` with a fixed global batch.
Fake CPU devices share the machine's cores, so this measures the partitioning overhead of the
sharded program, not a speed-up: on N real accelerators the step would run N shards in parallel.
Not a test: it prints numbers.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags, logging

_DEVICES = flags.DEFINE_string("devices", "1,2,4,8", "comma-separated fake CPU device counts")
_BATCH = flags.DEFINE_integer("batch", 128, "global batch")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps per repeat")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed repeats (the median is reported)")
_CHILD = flags.DEFINE_boolean("child", False, "internal: measure in this process (the device "
                              "count is already fixed) and print one JSON line")


def measure(batch: int, steps: int, repeats: int) -> dict:
  """Runs in a child process with the device count already fixed."""
  import jax
  import numpy as np

  from calib_jax import losses, models
  from calib_jax.training import optim, parallel, programs, state as state_lib
  from calib_jax.training import step as step_lib

  mesh = parallel.make_mesh(jax.devices())
  model = models.get("small_cnn", 10)
  rng = np.random.default_rng(0)
  host_batch = {"image": rng.normal(size=(batch, 32, 32, 3)).astype(np.float32),
                "label": rng.integers(0, 10, batch).astype(np.int32),
                "mask": np.ones(batch, bool)}
  schedule = optim.make_schedule(name="constant", base_lr=0.01, total_steps=10**6,
                                 steps_per_epoch=100)
  tx = optim.make_optimizer(name="sgd", learning_rate=schedule, momentum=0.9, weight_decay=5e-4)
  variables = model.init({"params": jax.random.key(0)}, host_batch["image"][:1], train=False)
  state = parallel.replicate(state_lib.create(variables, tx, jax.random.key(1)), mesh)
  train_step = programs.train_program(
      programs.of_train_step(step_lib.make_train_step(model, losses.get("ce"), tx, schedule,
                                                      steps_per_epoch=100)),
      programs.single_run_layout(mesh), per_step=True, resident=False)
  global_batch = parallel.to_global(host_batch, mesh)

  start = time.perf_counter()
  state, metrics = train_step(state, global_batch)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - start
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = train_step(state, global_batch)
      jax.block_until_ready(metrics)  # as the trainer does; collectives on fake CPUs need it
    samples.append((time.perf_counter() - start) / steps)
  step_s = statistics.median(samples)
  return {"devices": jax.device_count(), "step_s": step_s, "examples_per_s": batch / step_s,
          "compile_s": compile_s}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  batch, steps, repeats = _BATCH.value, _STEPS.value, _REPEATS.value
  if _CHILD.value:
    print(json.dumps(measure(batch, steps, repeats)))
    return

  rows = []
  for count in (int(n) for n in _DEVICES.value.split(",")):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([sys.executable, __file__, "--child", "--batch", str(batch),
                          "--steps", str(steps), "--repeats", str(repeats)],
                         env=env, check=True, capture_output=True, text=True).stdout
    rows.append(json.loads(out.strip().splitlines()[-1]))
  base = rows[0]["examples_per_s"]
  print(f"small_cnn, global batch {batch}x32x32x3, SGD step, fake CPU devices on "
        f"{os.cpu_count()} cores, median of {repeats}x{steps} steps")
  print(f"{'devices':>8}{'ms/step':>10}{'examples/s':>12}{'vs 1 device':>13}{'compile s':>11}")
  for row in rows:
    print(f"{row['devices']:>8}{row['step_s'] * 1e3:>10.1f}{row['examples_per_s']:>12.0f}"
          f"{row['examples_per_s'] / base:>13.2f}{row['compile_s']:>11.1f}")


if __name__ == "__main__":
  app.run(main)
