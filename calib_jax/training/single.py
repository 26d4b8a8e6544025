"""What the training loop trains: one run (`SingleRun`) or a sweep's population
(`calib_jax.sweep.Population`), behind the same small interface.

The loop (`loop.train_and_evaluate`) owns the schedule of a run: dispatching, reading
metrics, logging, validation, checkpoints, preemption. What it trains decides the rest:

* `initial_state()` / `abstract_state()`: the state to start from or to restore into;
* `multi_step()`: the compiled call running k steps on a `[k, ...]` stack of batches;
* `train_stream(start_step)` and `put(stack)`: host batches from a data position, and a
  stack of them placed on the devices (with `config.data.on_device`, batches of example
  positions, `{'index': [batch]}`, gathered on the devices from the resident split);
* `records(metrics)`: the rows to log of per-step or mean metrics (one per member);
* `non_finite(metrics)`: None, or `(index, name, metrics)` of the member (None, "" for a single
  run) with a non-finite loss or gradient;
* `validate(state)`: the validation rows;
* `finish(state, workdir, only_if_missing)`: what a run writes at its end (a sweep's
  `sweep.json`; with `only_if_missing`, only if it is not there yet); returns lines for the
  console (a sweep's table of results).
"""
from collections.abc import Iterator
from typing import Any, Mapping

import jax
import numpy as np

from calib_jax.evaluation import validation
from calib_jax.training import parallel
from calib_jax.training import step as step_lib
from calib_jax.training import state as state_lib

# A row to log: (tags naming the member, or {} for a single run; scalar metrics).
Record = tuple[dict[str, Any], dict[str, float]]


def resident_split(experiment: Any) -> dict[str, jax.Array]:
  """The experiment's processed training split on every device of its mesh
  (`config.data.on_device`), read once from the host (`DataRecipe.resident_train_split`)."""
  mesh = experiment.mesh
  host = experiment.data.resident_train_split(parallel.device_memory_bytes(mesh))
  return parallel.replicate(host, mesh)


def bind_resident(jitted, resident: Mapping[str, jax.Array]):
  """`multi_step(state, indices)` calling `jitted(state, resident, indices)`: the loop's
  interface, with the resident split passed as an argument of every call (not closed over
  inside the jitted function, which would bake it into the program as a constant)."""

  def multi_step(state, indices):
    return jitted(state, resident, indices)

  multi_step.jitted, multi_step.resident = jitted, resident  # what is bound, for inspection
  return multi_step


def unstack(stacked: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
  """The k batches of a host stack `[k, ...]` (the input of `step.each_step_calls`)."""
  steps = len(next(iter(stacked.values())))
  return [{key: value[i] for key, value in stacked.items()} for i in range(steps)]


class SingleRun:
  """One training run of an `experiment.Experiment`."""

  def __init__(self, experiment: Any):
    self.experiment = experiment
    self.calls_each_step = step_lib.calls_each_step(experiment.mesh,
                                                    experiment.abstract_state().params)
    self.config = experiment.config
    self._validator = validation.ValidationEvaluator(experiment)

  def initial_state(self) -> state_lib.TrainState:
    return self.experiment.initial_state()

  def abstract_state(self) -> state_lib.TrainState:
    return self.experiment.abstract_state()

  def multi_step(self):
    experiment, config = self.experiment, self.config
    schedule, tx = experiment.optimizer()
    train_step = step_lib.make_train_step(
        experiment.model, experiment.loss_fn, tx, schedule, sam_rho=config.optimizer.sam_rho,
        crl_weight=config.crl_weight, steps_per_epoch=experiment.length.steps_per_epoch,
        loss_at_step=experiment.loss_at_step())
    mesh, on_device, keep_index = experiment.mesh, config.data.on_device, config.crl_weight > 0
    if self.calls_each_step:  # k calls of a program without a loop (CPU, convolutions)
      one_step = (step_lib.resident_step(train_step, keep_index=keep_index) if on_device else
                  train_step)
      call = step_lib.jit_train_step(one_step, mesh, resident=on_device)
    else:
      steps = (step_lib.resident_steps(train_step, keep_index=keep_index) if on_device else
               step_lib.scan_steps(train_step))
      call = step_lib.jit_multi_step(steps, mesh, resident=on_device)
    if on_device:
      call = bind_resident(call, resident_split(experiment))
    return step_lib.each_step_calls(call) if self.calls_each_step else call

  def train_stream(self, start_step: int) -> Iterator[Mapping[str, np.ndarray]]:
    if self.config.data.on_device:  # positions only; the devices hold the examples
      return self.experiment.data.train_order(start_step, self.config.seed)
    return self.experiment.data.train_stream(start_step, self.config.seed,
                                             return_index=self.config.crl_weight > 0)

  def put(self, stacked: Mapping[str, np.ndarray]) -> Any:
    mesh = self.experiment.mesh
    if self.calls_each_step:
      return [parallel.to_global(batch, mesh) for batch in unstack(stacked)]
    return parallel.to_global(stacked, mesh, stacked=True)

  def records(self, metrics: Mapping[str, np.ndarray]) -> list[Record]:
    return [({}, {k: float(v) for k, v in metrics.items()})]

  def non_finite(self, metrics: Mapping[str, np.ndarray]
                 ) -> tuple[None, str, Mapping[str, np.ndarray]] | None:
    return None if metrics["finite"] else (None, "", metrics)

  def validate(self, state: state_lib.TrainState) -> list[Record]:
    return [({}, self._validator.run(state.variables()))]

  def finish(self, state: state_lib.TrainState, workdir: str, *, only_if_missing: bool
             ) -> list[str]:
    del state, workdir, only_if_missing
    return []
