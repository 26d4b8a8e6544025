"""The evaluation programs of `eval.py --shift` and `eval.py --ensemble`, compiled for a target.

* The shifted eval step (with `config.eval.shift`): `step.make_shifted_predict_fn` as
  `evaluation.shift.ShiftReport` builds it, on a global batch of uint8 images: the corruption
  on the device, the normalisation and the forward pass. One program per corruption, each
  compiled at severity 5 (the largest kernels and draws); the reported step is the one that
  needs the most memory. `jpeg_compression` runs on the host (a callback the target's
  compiler does not see) and is left out, as is a corruption that cannot be built here (frost
  without the reference package's textures): `ShiftCompile.left_out` says why.
* The ensemble eval step (with `config.sweep`): `step.make_ensemble_predict_fn`, the sweep's M
  members' forward passes as one program over their stacked variables.
"""
import dataclasses
from typing import Any

import jax
import numpy as np

from calib_jax import shift
from calib_jax.shift import core as shift_core
from calib_jax.dry_run import shapes
from calib_jax.dry_run.topologies import Topology
from calib_jax.evaluation import shift as shift_eval
from calib_jax.experiment import Experiment
from calib_jax.training import parallel
from calib_jax.training import step as step_lib


@dataclasses.dataclass
class ShiftCompile:
  """The shifted eval step that needs the most memory, which cell it is, and what was left out.

  Attributes:
    step: the compiler's figures (`compile.StepCompile`).
    cell: its corruption and severity ('rotate', 'clean' for stored sets).
    compiled: the cells compiled.
    left_out: `{corruption: why}` of those not compiled.
  """
  step: Any
  cell: str
  compiled: list[str]
  left_out: dict[str, str]


def _variables(state: Any, members: int = 0) -> dict[str, Any]:
  """One member's abstract eval variables, or `members` of them stacked on a leading axis."""
  variables = {k: v for k, v in {"params": state.params,
                                 "batch_stats": state.batch_stats}.items() if v}
  if not members:
    return variables
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((members, *x.shape), x.dtype,
                                                     sharding=x.sharding), variables)


def _cells(experiment: Experiment) -> tuple[list[tuple[str, int]], dict[str, str], str]:
  """The distinct programs of `eval.shift` (corruption at severity 5), those left out, table."""
  spec = shift.parse_spec(experiment.config.eval.shift)
  table = shift_eval.table_for(experiment)
  if spec.kind != "corruptions":
    return [("rotate", 180) if spec.kind == "rotate" else (shift_eval.CLEAN, 0)], {}, table
  host = {name: "runs on the host (a callback)" for name in spec.corruptions
          if name in shift_core.HOST_CORRUPTIONS}
  cells = [(name, max(spec.severities)) for name in spec.corruptions if name not in host]
  return cells, host, table


def shift_eval_steps(experiment: Experiment, state: Any, topology: Topology, compile_step
                     ) -> ShiftCompile | None:
  """Compiles the shifted eval step of each corruption of `eval.shift` (None without one) with
  `compile_step(jitted, args, topology, name)`; returns the one that needs the most memory."""
  if not experiment.config.eval.shift:
    return None
  config, mesh = experiment.config, experiment.mesh
  cells, left_out, table = _cells(experiment)
  mean, std = experiment.data.input_statistics()
  batch = shapes.abstract_batch(config, config.data.eval_batch_size,
                                parallel.batch_sharded(mesh), train=False)
  batch["image"] = jax.ShapeDtypeStruct(batch["image"].shape, np.uint8,
                                        sharding=batch["image"].sharding)
  replicated = parallel.replicated(mesh)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
  param = jax.ShapeDtypeStruct((), np.float32, sharding=replicated)
  best, compiled = None, []
  for name, severity in cells:
    label = f"{name}/{severity}"
    jitted = step_lib.make_shifted_predict_fn(
        experiment.model, mesh, shift_eval.shift_images_fn(name, severity, table), mean, std)
    try:
      result = compile_step(jitted, (_variables(state), batch, key, param), topology,
                            f"shifted eval ({label})")
    except ValueError as e:  # e.g. frost without its textures: one line, the others go on
      if "does not compile" in str(e):
        raise
      left_out[name] = str(e).splitlines()[0]
      continue
    compiled.append(label)
    if best is None or result.per_chip_bytes > best[0].per_chip_bytes:
      best = (result, label)
  if best is None:
    return ShiftCompile(step=None, cell="", compiled=[], left_out=left_out)
  return ShiftCompile(step=best[0], cell=best[1], compiled=compiled, left_out=left_out)


def ensemble_eval_step(experiment: Experiment, state: Any, members: int, topology: Topology,
                       compile_step) -> Any:
  """Compiles the ensemble eval step of a sweep's `members` (None for a single run)."""
  if members <= 1:
    return None
  config, mesh = experiment.config, experiment.mesh
  batch = shapes.abstract_batch(config, config.data.eval_batch_size,
                                parallel.batch_sharded(mesh), train=False)
  jitted = step_lib.make_ensemble_predict_fn(experiment.model, mesh)
  return compile_step(jitted, (_variables(state, members), batch), topology, "ensemble eval")
