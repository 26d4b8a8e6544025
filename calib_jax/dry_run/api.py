"""`dry_run(config, topology)`: the whole dry run as one call (the CLI and the zoo use it)."""
from typing import Any

import ml_collections

from calib_jax.dry_run import compile as compile_lib, report, topologies
from calib_jax.dry_run.topologies import MissingCompilerError

__all__ = ["MissingCompilerError", "dry_run", "largest_batch", "report"]

# Probes of `find_max_batch` go no further than this many examples per device.
MAX_PER_DEVICE_BATCH = 4096


def largest_batch(config: ml_collections.ConfigDict, topology: topologies.Topology,
                   num_train_examples: int | None = None) -> int:
  """The largest global batch (a multiple of the devices) whose train step fits, by doubling
  then bisection over the per-device batch; 0 when even one example per device does not fit."""
  devices = topology.num_devices

  def fits(per_device: int) -> bool:
    trial = config.copy_and_resolve_references()
    trial.data.batch_size = per_device * devices
    trial.data.eval_batch_size = devices
    program = compile_lib.compile_config(trial, topology, eval_step=False,
                                         num_train_examples=num_train_examples)
    return program.train.fits

  low, high = 0, max(config.data.batch_size // devices, 1)
  while fits(high):  # grow until a batch does not fit
    low, high = high, high * 2
    if high > MAX_PER_DEVICE_BATCH:
      return low * devices
  while high - low > 1:
    middle = (low + high) // 2
    low, high = (middle, high) if fits(middle) else (low, middle)
  return low * devices


def dry_run(config: ml_collections.ConfigDict, topology: str, *, config_name: str = "config",
            num_train_examples: int | None = None, eval_step: bool = True,
            find_max_batch: bool = False) -> dict[str, Any]:
  """Compiles the config's train (and eval) step for `topology`; returns `report.summary`.

  Raises:
    ValueError: an unknown topology, a batch that does not divide over the devices, an invalid
      config or a step that does not compile (`compile.CompileError`), each in one line.
    MissingCompilerError: libtpu or the CUDA plugin is not installed (names the extra).
  """
  target = topologies.get(topology)
  program = compile_lib.compile_config(config, target, num_train_examples=num_train_examples,
                                       eval_step=eval_step)
  result = report.summary(config_name, config, target, program)
  if find_max_batch:
    result["max_global_batch"] = largest_batch(config, target,
                                               num_train_examples=program.num_train_examples)
  return result
