"""Training-loop overhead: steps/s of the whole loop vs the bare jit train step.

    .venv/bin/python bench/loop_throughput.py [--steps 1500] [--repeats 3] \
        [--recipe=mlp|resnet20] [--steps_per_dispatch=K] [--log_every=250] [--on_device]

Recipes: `mlp` is `configs/fashion_mnist_mlp.py:ce` (2x1024 MLP, batch 64, SGD Nesterov) on
Fashion-MNIST through tf.data; `resnet20` is a CIFAR ResNet-20 at batch 128 on synthetic 32x32
images (the CIFAR-10 recipe's optimiser; a stream of 8 pre-made host batches stands in for
tf.data, so the loop's own overhead is measured). "bare" runs the trainer's own compiled step
(`step.make_train_step` compiled by `programs.train_program`) on one device-resident batch, blocking once at
the end. "loop" is `loop.train_and_evaluate` (input, prefetch to the devices, metric logging,
finiteness checks, checkpoints at the end only, no progress bar or TensorBoard) with
`--steps_per_dispatch` steps per call (0: the loop's auto choice), timed from its own
`steps_per_sec` records after the first logging window (which includes compilation).
`--on_device` (mlp only) runs the loop with `config.data.on_device`: the processed training
split on the device, each batch gathered inside the compiled call from the host's indices (the
bare step is unchanged: its batch is already on the device). Prints
the median of `--repeats` runs of each, their ratio and the host time per step the loop adds
(1/loop - 1/bare); the goal is loop >= 95 % of bare. Not a test: it prints numbers.
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
_RECIPE = flags.DEFINE_enum("recipe", "mlp", ["mlp", "resnet20"],
                            "mlp: Fashion-MNIST MLP (tf.data); resnet20: CIFAR ResNet-20 on "
                            "synthetic 32x32 batches")
_LOG_EVERY = flags.DEFINE_integer("log_every", 250, "the loop's logging window (its steps/s "
                                  "records; the first, with compilation, is left out)")
_STEPS_PER_DISPATCH = flags.DEFINE_integer("steps_per_dispatch", 0,
                                           "the loop's steps per call (0 = its auto choice)")
_ON_DEVICE = flags.DEFINE_bool("on_device", False, "mlp: the loop keeps the training split on "
                               "the device (config.data.on_device)")


def _config(steps: int):
  from calib_jax import config as config_lib
  if _RECIPE.value == "resnet20":
    config = config_lib.load_config_file(os.path.join(ROOT, "configs", "cifar10_resnet50.py"))
    config.model, config.model_kwargs = "cifar_resnet20", {}
  else:
    config = config_lib.load_config_file(CONFIG)
  config.steps_per_dispatch = _STEPS_PER_DISPATCH.value
  config.data.on_device = _ON_DEVICE.value
  config.num_train_steps = steps
  config.log_every_steps = _LOG_EVERY.value
  config.checkpoint_every_steps = 10 * steps
  config.eval_every_steps = 0
  config.progress_bar = False
  config.tensorboard = False
  return config


def _synthetic_data(config):
  """For `resnet20`: the experiment's data recipe reads no data; its training stream cycles
  through 8 host batches of random 32x32 images."""
  import itertools

  import numpy as np
  from calib_jax.experiment import data
  rng = np.random.default_rng(0)
  size = config.data.batch_size
  batches = [{"image": rng.normal(size=(size, 32, 32, 3)).astype(np.float32),
              "label": rng.integers(0, 10, size).astype(np.int32),
              "mask": np.ones(size, bool)} for _ in range(8)]
  data.DataRecipe.num_train_examples = lambda self: 50_000
  data.DataRecipe.example_input = lambda self: batches[0]["image"][:1]
  data.DataRecipe.train_stream = lambda self, *a, **k: itertools.cycle(batches)


def bare_rate(steps: int) -> float:
  import jax
  import numpy as np
  from calib_jax import experiment
  from calib_jax.training import parallel, programs, step as step_lib
  config = _config(steps)
  exp = experiment.build(config)  # the loop's own model, loss, optimiser and initial state
  meta, mesh, example = exp.meta, exp.mesh, exp.data.example_input()
  assert config.data.batch_size % mesh.devices.size == 0
  schedule, tx = exp.optimizer()
  state = exp.initial_state()
  train_step = programs.train_program(
      programs.of_train_step(step_lib.make_train_step(exp.model, exp.loss_fn, tx, schedule)),
      programs.single_run_layout(mesh), per_step=True, resident=False)
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
  from calib_jax.training import reporting
  from calib_jax.run import loop
  with tempfile.TemporaryDirectory() as workdir:
    loop.train_and_evaluate(_config(steps), workdir)
    records = [r for r in reporting.read_metrics(workdir) if r["split"] == "train"]
  rates = [r["steps_per_sec"] for r in records[1:]]  # the first window includes compilation
  return statistics.median(rates)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  if _ON_DEVICE.value and _RECIPE.value != "mlp":
    raise app.UsageError("--on_device applies to --recipe=mlp (resnet20 reads synthetic "
                         "batches, not a dataset)")
  if _RECIPE.value == "resnet20":
    _synthetic_data(_config(_STEPS.value))
  results = {"bare": [], "loop": []}
  for _ in range(_REPEATS.value):  # interleaved, so drifting machine load hits both alike
    results["bare"].append(bare_rate(_STEPS.value))
    results["loop"].append(loop_rate(_STEPS.value))
  bare, whole = (statistics.median(results[k]) for k in ("bare", "loop"))
  print(json.dumps({k: [round(v, 3) for v in vs] for k, vs in results.items()}))
  print(f"{_RECIPE.value}, steps_per_dispatch={_STEPS_PER_DISPATCH.value or 'auto'}, "
        f"on_device={_ON_DEVICE.value}, load "
        f"{os.getloadavg()[0]:.2f}: the loop adds {1e3 * (1 / whole - 1 / bare):.3f} ms of host "
        "time per step")
  print(f"bare step {bare:.3g} steps/s, whole loop {whole:.3g} steps/s: "
        f"loop = {100 * whole / bare:.0f} % of bare (median of {_REPEATS.value})")
  return 0


if __name__ == "__main__":
  app.run(main)
