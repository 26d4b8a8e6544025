"""A sweep's throughput per member-step against sequential single runs.

    .venv/bin/python bench/sweep_throughput.py [--steps 200] [--repeats 2] \
        [--recipe=mlp|cnn] [--members=7,21] [--members_as=auto|vmap|map|unroll] [--on_device]

Recipes: `mlp` is the label-relaxation Table 1 recipe (`configs/fashion_mnist_mlp.py:lr`,
2x1024 MLP, batch 64) on Fashion-MNIST; `cnn` the same with the small CNN (`small_cnn`, widths
32/64). A P-member sweep is `loss_kwargs.alpha` over 7 values (P = 7) and those times seeds
0, 1, 2 (P = 21: three training streams). Both are timed through the whole training loop
(`loop.train_and_evaluate`: input, prefetch, logging; no checkpoints but the last, no
validation) from its own `steps_per_sec` records after the first logging window, which holds
the compilation. A single run's steps/s is what P sequential runs give per member-step; the
sweep gives P × its steps/s. Prints one row per P with the ratio and the machine's load; the
goal is a ratio >= 1 (never slower per member-step). Also prints each program's compile-and-
first-window time, which P sequential runs pay P times and a sweep once. Not a test.
"""
import json
import os
import statistics
import tempfile
import time

from absl import app, flags, logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHAS = "0.01,0.025,0.05,0.1,0.2,0.3,0.4"
_STEPS = flags.DEFINE_integer("steps", 200, "training steps per run")
_LOG_EVERY = flags.DEFINE_integer("log_every", 50, "logging window (steps/s records)")
_REPEATS = flags.DEFINE_integer("repeats", 2, "runs of each, interleaved")
_RECIPE = flags.DEFINE_enum("recipe", "mlp", ["mlp", "cnn"], "the model (see the docstring)")
_MEMBERS = flags.DEFINE_list("members", ["7", "21"], "population sizes: 7 and/or 21")
_ON_DEVICE = flags.DEFINE_bool("on_device", False, "config.data.on_device of every run (the "
                                "recipe's default is True; False streams through tf.data)")
_MEMBERS_AS = flags.DEFINE_enum("members_as", "auto", ["auto", "vmap", "map", "unroll"],
                                "config.sweep_members_as of the sweeps")


def _config(sweep: str):
  from calib_jax import config as config_lib
  config = config_lib.load_config_file(os.path.join(ROOT, "configs", "fashion_mnist_mlp.py:lr"))
  if _RECIPE.value == "cnn":
    config.model, config.model_kwargs = "small_cnn", {"widths": (32, 64)}
  config.num_train_steps = _STEPS.value
  config.log_every_steps = _LOG_EVERY.value
  config.checkpoint_every_steps = 10 * _STEPS.value
  config.eval_every_steps = 0
  config.progress_bar = False
  config.tensorboard = False
  config.sweep = sweep
  config.sweep_members_as = _MEMBERS_AS.value
  config.data.on_device = _ON_DEVICE.value
  return config


def _rate(sweep: str) -> tuple[float, float]:
  """(steps/s after the first window, seconds to the end of the first window)."""
  from calib_jax.training import reporting
  from calib_jax.run import loop
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    loop.train_and_evaluate(_config(sweep), workdir)
    records = [r for r in reporting.read_metrics(workdir) if r["split"] == "train"]
  steps = {r["step"]: r["steps_per_sec"] for r in records}  # one rate per window
  first = sorted(steps)[0]
  later = [rate for step, rate in steps.items() if step != first]
  total = time.perf_counter() - start
  first_window = total - (_STEPS.value - first) / statistics.median(later)
  return statistics.median(later), first_window


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  sweeps = {7: f"loss_kwargs.alpha={ALPHAS}", 21: f"loss_kwargs.alpha={ALPHAS};seed=0,1,2"}
  members = [int(m) for m in _MEMBERS.value]
  results = {"single": [], **{p: [] for p in members}}
  for _ in range(_REPEATS.value):  # interleaved: a drifting load hits all alike
    results["single"].append(_rate(""))
    for p in members:
      results[p].append(_rate(sweeps[p]))
  single = statistics.median(r for r, _ in results["single"])
  single_first = statistics.median(f for _, f in results["single"])
  print(json.dumps({str(k): [[round(r, 2), round(f, 1)] for r, f in v]
                    for k, v in results.items()}))
  print(f"{_RECIPE.value}, members as {_MEMBERS_AS.value}: single run {single:.2f} steps/s (first window with compile "
        f"{single_first:.1f} s), load {os.getloadavg()[0]:.2f}")
  for p in members:
    rate = statistics.median(r for r, _ in results[p])
    first = statistics.median(f for _, f in results[p])
    print(f"P={p}: sweep {rate:.2f} steps/s = {p * rate:.2f} member-steps/s vs {single:.2f} "
          f"sequential: ratio {p * rate / single:.2f}; compile + first window {first:.1f} s "
          f"once vs {p * single_first:.1f} s for {p} runs")
  return 0


if __name__ == "__main__":
  app.run(main)
