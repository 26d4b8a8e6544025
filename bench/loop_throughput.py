"""Training-loop overhead: steps/s of the whole loop vs the bare jit train step.

    .venv/bin/python bench/loop_throughput.py [--steps 1500] [--repeats 3]

Recipe: `configs/fashion_mnist_mlp.py:ce` (2x1024 MLP, batch 64, SGD Nesterov). "bare" runs the
trainer's own compiled step (`step.make_train_step` + `step.jit_train_step`) on one
device-resident batch, blocking once at the end. "loop" is `loop.train_and_evaluate` (tf.data
input, metric logging, finiteness checks, checkpoints at the end only, no progress bar or
TensorBoard), timed from its own `steps_per_sec` records after the first logging window
(which includes compilation). Prints the median of `--repeats` runs of each and their ratio;
the goal of the redesign is loop >= 90 % of bare. Not a test: it prints numbers.
"""
import json
import os
import statistics
import tempfile
import time

from absl import app, flags, logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "fashion_mnist_mlp.py") + ":ce"
_STEPS = flags.DEFINE_integer("steps", 1500, "training steps per run")
_REPEATS = flags.DEFINE_integer("repeats", 3, "runs of each (bare, loop), interleaved")


def _config(steps: int):
  from calib_jax import config as config_lib
  config = config_lib.load_config_file(CONFIG)
  config.num_train_steps = steps
  config.log_every_steps = 250
  config.checkpoint_every_steps = 10 * steps
  config.eval_every_steps = 0
  config.progress_bar = False
  config.tensorboard = False
  return config


def bare_rate(steps: int) -> float:
  import jax
  import numpy as np
  from calib_jax import experiment
  from calib_jax.training import parallel, step as step_lib
  config = _config(steps)
  exp = experiment.build(config)  # the loop's own model, loss, optimiser and initial state
  meta, mesh, example = exp.meta, exp.mesh, exp.data.example_input()
  schedule, tx = exp.optimizer()
  state = exp.initial_state()
  train_step = step_lib.jit_train_step(
      step_lib.make_train_step(exp.model, exp.loss_fn, tx, schedule), mesh)
  rng = np.random.default_rng(0)
  batch = parallel.to_global({
      "image": rng.normal(size=(config.data.batch_size, *example.shape[1:])).astype(np.float32),
      "label": rng.integers(0, meta.num_classes, config.data.batch_size).astype(np.int32),
      "mask": np.ones(config.data.batch_size, bool)}, mesh)
  state, metrics = train_step(state, batch)  # compile
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = train_step(state, batch)
  jax.block_until_ready((state, metrics))
  return steps / (time.perf_counter() - start)


def loop_rate(steps: int) -> float:
  from calib_jax.training import loop, reporting
  with tempfile.TemporaryDirectory() as workdir:
    loop.train_and_evaluate(_config(steps), workdir)
    records = [r for r in reporting.read_metrics(workdir) if r["split"] == "train"]
  rates = [r["steps_per_sec"] for r in records[1:]]  # the first window includes compilation
  return statistics.median(rates)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  results = {"bare": [], "loop": []}
  for _ in range(_REPEATS.value):  # interleaved, so drifting machine load hits both alike
    results["bare"].append(bare_rate(_STEPS.value))
    results["loop"].append(loop_rate(_STEPS.value))
  bare, whole = (statistics.median(results[k]) for k in ("bare", "loop"))
  print(json.dumps({k: [round(v, 1) for v in vs] for k, vs in results.items()}))
  print(f"bare step {bare:.1f} steps/s, whole loop {whole:.1f} steps/s: "
        f"loop = {100 * whole / bare:.0f} % of bare (median of {_REPEATS.value})")
  return 0


if __name__ == "__main__":
  app.run(main)
