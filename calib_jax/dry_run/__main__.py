"""`python -m calib_jax.dry_run`: compile a config for a TPU slice or GPUs before paying for it.

    python -m calib_jax.dry_run --config=configs/imagenet_resnet50_acls.py:acls \
        --topology=v5e:4x4 [--config.dtype=bfloat16 ...] [--json=out.json] [--find_max_batch]

Prints chips and hosts, the per-chip memory of the train and eval steps against the chip's HBM,
FLOPs and bytes per step and a roofline estimate of the step, epoch and run time; `--json`
writes the same as JSON (also when the step does not fit). Needs the target's compiler: the
`.[tpu]` extra (libtpu) for TPU slices, the `.[gpu]` extra for GPUs. See docs/accelerators.md.

On a machine with the chips, `--measure` compiles the same train step for the local devices,
runs it on random inputs and prints the measured step time beside its roofline
(`dry_run.measure`); `--topology` is then optional and only names the chip's figures.
"""
import os
import sys


def measure_requested(argv: list[str]) -> bool:
  """Whether `argv` turns `--measure` on (as absl reads a boolean flag: the last one wins),
  read before absl parses the flags because JAX's platform must be chosen before it loads."""
  on = False
  for arg in argv:
    if arg in ("--measure", "--nomeasure"):
      on = arg == "--measure"
    elif arg.startswith("--measure="):
      on = arg.split("=", 1)[1].lower() in ("true", "t", "1")
  return on


# A dry run compiles for the target only; JAX itself runs on the CPU (and must, for GPU
# targets on a machine without a GPU). `--measure` runs on the local accelerator.
if not measure_requested(sys.argv[1:]):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from calib_jax.dry_run import topologies  # pylint: disable=wrong-import-position
from calib_jax.cli import flags as cli_flags  # pylint: disable=wrong-import-position

TOPOLOGY = flags.DEFINE_string(
    "topology", None, "Target: a TPU slice (v5e:2x2, v4:2x2x2, v5p:2x2x1, v6e:2x4) or GPUs "
    "(h100:1, h100:8, h100:2x8, a100:8). See docs/accelerators.md.")
JSON = flags.DEFINE_string("json", None, "Write the result as JSON here.")
FIND_MAX_BATCH = flags.DEFINE_bool(
    "find_max_batch", False, "Also find the largest global batch whose train step fits, by "
    "bisection over multiples of the device count (one compile per probe).")
NUM_TRAIN_EXAMPLES = flags.DEFINE_integer(
    "num_train_examples", None, "Training-set size, for datasets or splits without a known "
    "size (default: from the dataset registry's split sizes).")
EVAL_STEP = flags.DEFINE_bool("eval_step", True, "Also compile the eval step.")
MEASURE = flags.DEFINE_bool(
    "measure", False, "Time the train step on this machine's chips against its roofline "
    "(on a GPU host or TPU VM; --topology then only names the chip's figures).")
STEPS_PER_CALL = flags.DEFINE_integer(
    "steps_per_call", 1, "With --measure: optimiser steps per compiled call (the loop's k).")


def _config_name(argv: list[str]) -> str:
  specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  return specs[-1] if specs else cli_flags.DEFAULT_CONFIG


def main(argv: list[str]) -> None:
  """Entry point: one line on stderr and status 1 for a mistake, else the summary."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if MEASURE.value:
    try:
      print(_measured(_config_name(sys.argv)), flush=True)
    except ValueError as e:
      sys.exit(f"dry_run: {e}")
    return
  if not TOPOLOGY.value:
    raise app.UsageError("--topology is required (e.g. --topology=v5e:2x2)")
  # Deferred, as `measure` in `_measured`: these import the experiment and TensorFlow (~7 s), which
  # a `--measure` refused on a machine without an accelerator never needs.
  from calib_jax.dry_run import api  # pylint: disable=import-outside-toplevel
  try:
    result = api.dry_run(cli_flags.config(), TOPOLOGY.value, config_name=_config_name(sys.argv),
                         num_train_examples=NUM_TRAIN_EXAMPLES.value,
                         eval_step=EVAL_STEP.value, find_max_batch=FIND_MAX_BATCH.value)
  except (ValueError, topologies.MissingCompilerError) as e:
    sys.exit(f"dry_run: {e}")
  print(api.report.text(result), flush=True)
  if JSON.value:
    api.report.write_json(result, JSON.value)


def _measured(config_name: str) -> str:
  """`--measure`: the train step timed on the local devices, as one line. Without a chip to
  name and without an accelerator it is refused first, in about a second (JAX's import)."""
  import jax  # pylint: disable=import-outside-toplevel
  chip = topologies.parse(TOPOLOGY.value)[0] if TOPOLOGY.value else None
  if chip is None and jax.devices()[0].platform == "cpu":
    raise ValueError("--measure times the train step on this machine's accelerator, and JAX "
                     "sees only the CPU here: run it on the GPU host or TPU VM (or give "
                     "--topology to time the CPU against that chip's figures)")
  from calib_jax.dry_run import measure  # pylint: disable=import-outside-toplevel
  topology = measure.local_topology(chip)
  m = measure.measure_config(cli_flags.config(), topology, steps_per_call=STEPS_PER_CALL.value,
                             num_train_examples=NUM_TRAIN_EXAMPLES.value)
  roofline = (f"roofline {m.roofline_seconds * 1e3:.3f} ms, measured {m.over_roofline:.2f}x "
              f"that" if m.roofline_seconds else "no roofline (no cost analysis)")
  return (f"{config_name} on {topology.name}: {m.members} member(s), {m.steps_per_call} "
          f"step(s) per call: {m.step_seconds * 1e3:.3f} ms per step measured; {roofline}; "
          f"{m.per_chip_bytes / 2**30:.2f} GiB per chip; compiled in {m.compile_seconds:.1f} s")


def run() -> None:
  """The program: the shared --config flag, then `main` under absl."""
  cli_flags.define(sys.argv)
  app.run(main, flags_parser=cli_flags.parse_flags)


if __name__ == "__main__":
  run()
