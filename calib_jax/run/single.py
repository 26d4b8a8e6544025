"""One training run of an `Experiment`, as a `trainee.Trainee` of the loop."""
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from calib_jax.evaluation import validation
from calib_jax.experiment import Experiment
from calib_jax.run import inputs
from calib_jax.run import trainee
from calib_jax.run.trainee import Failure, Record
from calib_jax.training import programs
from calib_jax.training import step as step_lib
from calib_jax.training.state import TrainState


class SingleRun:
  """One training run of `experiment` (see `trainee.Trainee` for the interface)."""

  def __init__(self, experiment: Experiment):
    self.experiment = experiment
    self.config = experiment.config
    self.layout = programs.single_run_layout(experiment.mesh)
    self.per_step = programs.calls_each_step(experiment.mesh,
                                             experiment.abstract_state().params)
    self._validator = validation.ValidationEvaluator(experiment)

  def initial_state(self) -> TrainState:
    return self.experiment.initial_state()

  def abstract_state(self) -> TrainState:
    return self.experiment.abstract_state()

  def program(self, *, per_step: bool) -> Any:
    experiment, config = self.experiment, self.config
    schedule, tx = experiment.optimizer()
    train_step = step_lib.make_train_step(
        experiment.model, experiment.loss_fn, tx, schedule, sam_rho=config.optimizer.sam_rho,
        crl_weight=config.crl_weight, steps_per_epoch=experiment.length.steps_per_epoch,
        loss_at_step=experiment.loss_at_step())
    return programs.train_program(programs.of_train_step(train_step), self.layout,
                                  per_step=per_step, resident=config.data.on_device,
                                  keep_index=config.crl_weight > 0)

  def multi_step(self) -> programs.MultiStep:
    resident = (inputs.resident_split(self.experiment) if self.config.data.on_device
                else None)
    return trainee.loop_call(self, resident)

  def train_stream(self, start_step: int) -> Iterator[Mapping[str, np.ndarray]]:
    return inputs.seed_stream(self.experiment, start_step, self.config.seed)

  def put(self, stacked: Mapping[str, np.ndarray]) -> Any:
    return programs.put(stacked, self.layout, per_step=self.per_step)

  def records(self, metrics: Mapping[str, np.ndarray]) -> list[Record]:
    return [({}, {k: float(v) for k, v in metrics.items()})]

  def non_finite(self, metrics: Mapping[str, np.ndarray]) -> Failure | None:
    return None if metrics["finite"] else (None, "", metrics)

  def validate(self, state: TrainState) -> list[Record]:
    return [({}, self._validator.run(state.variables()))]

  def finish(self, state: TrainState, workdir: str, *, only_if_missing: bool) -> list[str]:
    del state, workdir, only_if_missing
    return []
