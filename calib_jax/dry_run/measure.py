"""The dry run's step on real chips: the same compiled program, timed, against its roofline.

On a machine with the accelerator (a GPU host, a TPU VM), `measure_config` builds the config's
train step exactly as the dry run compiles it (`compile.train_program`: the loop's jit, state
replicated and donated, the batch sharded, k steps per call as the loop runs them), compiles
it for the local devices, reads the same memory and cost figures as the dry run, then runs it
on random inputs of the step's shapes and times it:

    measured seconds per step  vs  roofline = max(FLOPs / peak, HBM bytes / bandwidth)

The roofline is a lower bound; `measured / roofline` is how far the real step is from it (the
dry run's estimate of a run's length is too short by that factor). The inputs are random (a
step's speed does not depend on the values): parameters and optimiser state N(0, 0.02²),
labels uniform over the classes, example positions uniform over the training set, masks all
true. No data is read, so the measurement needs no dataset.
"""
import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from calib_jax.dry_run import chips, report
from calib_jax.dry_run import compile as compile_lib
from calib_jax.dry_run.topologies import Topology


def chip_of(device: jax.Device) -> chips.Chip:
  """The `chips.Chip` of a real device, from its `device_kind` ('NVIDIA H100 80GB HBM3',
  'NVIDIA H200', 'TPU v5 lite', ...); a one-line ValueError naming the known chips."""
  kind = device.device_kind.lower()
  aliases = {"tpu v5 lite": "v5e", "tpu v5e": "v5e", "tpu v5p": "v5p", "tpu v5": "v5p",
             "tpu v6 lite": "v6e", "tpu v6e": "v6e", "tpu v4": "v4", "tpu v3": "v3"}
  for alias, name in aliases.items():
    if kind.startswith(alias):
      return chips.get(name)
  for name in sorted(chips.CHIPS, key=len, reverse=True):
    if chips.CHIPS[name].kind == "gpu" and name in kind:
      return chips.get(name)
  raise ValueError(f"unknown accelerator {device.device_kind!r}; known: {', '.join(chips.CHIPS)}")


def local_topology(chip: chips.Chip | None = None) -> Topology:
  """This machine's devices as a `Topology` (its chip from `chip_of` unless given)."""
  devices = tuple(jax.devices())
  chip = chip_of(devices[0]) if chip is None else chip
  return Topology(name=f"{chip.name}:{len(devices)} (local)", chip=chip, devices=devices)


def _random_leaf(path: tuple, leaf: jax.ShapeDtypeStruct, rng: np.random.Generator, *,
                 num_classes: int, num_train_examples: int) -> jax.Array:
  name = str(getattr(path[-1], "key", getattr(path[-1], "name", ""))) if path else ""
  shape, dtype = leaf.shape, leaf.dtype
  if jnp.issubdtype(dtype, jax.dtypes.prng_key):
    keys = jax.random.split(jax.random.key(int(rng.integers(2**31))), max(math.prod(shape), 1))
    return jax.device_put(keys.reshape(shape), leaf.sharding)
  if name == "label" and jnp.issubdtype(dtype, jnp.integer):
    value = rng.integers(0, num_classes, shape)
  elif name == "index" and jnp.issubdtype(dtype, jnp.integer):
    value = rng.integers(0, num_train_examples, shape)
  elif jnp.issubdtype(dtype, jnp.floating) and name != "mask":
    value = rng.normal(0.0, 0.02, shape)
  else:  # masks, step counters, other integers
    value = np.ones(shape) if name == "mask" else np.zeros(shape)
  return jax.device_put(np.asarray(value).astype(dtype), leaf.sharding)


def random_arguments(abstract: Any, *, num_classes: int, num_train_examples: int,
                     seed: int = 0) -> Any:
  """Concrete arrays for a tree of `ShapeDtypeStruct`s, placed with their shardings."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: None if leaf is None else _random_leaf(
          path, leaf, rng, num_classes=num_classes, num_train_examples=num_train_examples),
      abstract)


@dataclasses.dataclass
class Measurement:
  """One config's train step on this machine's chips.

  Attributes:
    members: a sweep's population (1 for a single run); every step trains them all.
    steps_per_call: k, the optimiser steps of one compiled call.
    step_seconds: measured wall time per optimiser step (median over `repeats` timings).
    step_seconds_runs: each timing's seconds per step, of which `step_seconds` is the median.
    roofline_seconds: the dry run's estimate for one step, on this chip's figures.
    per_chip_bytes, compile_seconds: as `compile.StepCompile`, of the k-step program.
    flops, bytes_accessed: one step's, from the program of one step (the dry run's).
    first_call_seconds: the untimed first call (it also loads the program onto the chips).
  """
  members: int
  steps_per_call: int
  step_seconds: float
  step_seconds_runs: list[float]
  roofline_seconds: float | None
  per_chip_bytes: int
  flops: float | None
  bytes_accessed: float | None
  compile_seconds: float
  first_call_seconds: float

  @property
  def over_roofline(self) -> float | None:
    return self.step_seconds / self.roofline_seconds if self.roofline_seconds else None


def measure_config(config: ml_collections.ConfigDict, topology: Topology | None = None, *,
                   steps_per_call: int = 1, calls: int = 10, repeats: int = 3,
                   num_train_examples: int | None = None) -> Measurement:
  """Compiles the config's train step for the local chips and times it (module docstring).

  Each timing runs `calls` calls of k steps after one untimed call (the first, which also
  loads the program); the step time is the median timing / (calls × k).

  Raises:
    ValueError: as `compile.compile_config`, or a step that does not fit in the chip's memory.
  """
  if calls < 1 or repeats < 1:
    raise ValueError(f"calls={calls} and repeats={repeats} must be >= 1")
  topology = local_topology() if topology is None else topology
  program = compile_lib.train_program(config, topology, num_train_examples=num_train_examples,
                                      steps_per_call=steps_per_call)
  compiled, run = compile_lib.compile_executable(program.jitted, program.args, topology,
                                                 "train")
  if not compiled.fits:
    raise ValueError(f"the train step needs {compiled.per_chip_bytes / 2**30:.1f} GiB per "
                     f"chip, more than {topology.device.hbm_bytes / 2**30:.1f} GiB")
  # XLA's cost analysis counts a loop's body once, whatever its trip count, so the figures of
  # one step are those of the program of one step (what the dry run compiles).
  if steps_per_call == 1:
    figures = compiled
  else:
    one_step = compile_lib.train_program(config, topology, experiment=program.experiment)
    figures = compile_lib.compile_step(one_step.jitted, one_step.args, topology, "train")
  meta = program.experiment.meta
  args = random_arguments(program.args, num_classes=meta.num_classes,
                          num_train_examples=program.num_train_examples)

  def call(arguments):
    state, metrics = run(*arguments)
    return (state, *arguments[1:]), metrics

  start = time.perf_counter()
  args, metrics = call(args)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  runs = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      args, metrics = call(args)
    jax.block_until_ready((args[0], metrics))
    runs.append((time.perf_counter() - start) / (calls * steps_per_call))
  roofline = (report.roofline_seconds(figures.flops, figures.bytes_accessed,
                                      topology.device, config.dtype)
              if figures.flops is not None and figures.bytes_accessed is not None else None)
  return Measurement(members=program.members, steps_per_call=steps_per_call,
                     step_seconds=float(np.median(runs)), step_seconds_runs=runs,
                     roofline_seconds=roofline, per_chip_bytes=compiled.per_chip_bytes,
                     flops=figures.flops, bytes_accessed=figures.bytes_accessed,
                     compile_seconds=compiled.compile_seconds, first_call_seconds=first)

