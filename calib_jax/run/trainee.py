"""What the training loop trains: the `Trainee` interface.

The loop (`loop.train_and_evaluate`) owns the schedule of a run: dispatching, reading metrics,
logging, validation, checkpoints, preemption. What it trains decides the rest. Two classes
implement the interface: `single.SingleRun` (one run) and `population.Population` (a sweep's
members trained as one program). Both make their compiled step with the one step builder,
`training.programs`, and place their inputs with its `put`.
"""
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from calib_jax.training import programs
from calib_jax.training.state import TrainState

# A row to log: (tags naming the member, or {} for a single run; scalar metrics).
Record = tuple[dict[str, Any], dict[str, float]]
# A member whose loss or gradient is not finite: (its index, its name, its metrics); (None, "",
# metrics) for a single run.
Failure = tuple[int | None, str, Mapping[str, np.ndarray]]


class Trainee(Protocol):
  """One run, or several trained as one program.

  Attributes:
    per_step: the loop calls a one-step program once per step (`programs.calls_each_step`)
      instead of a k-step program once per call.
  """
  per_step: bool

  def initial_state(self) -> TrainState:
    """The state to start from (stacked on a leading member axis for a population)."""

  def abstract_state(self) -> TrainState:
    """The state's shapes and shardings, to restore a checkpoint into."""

  def program(self, *, per_step: bool) -> Any:
    """The jitted training program (`programs.train_program`): what the dry run compiles."""

  def multi_step(self) -> programs.MultiStep:
    """The loop's call: k steps on what `put` placed (reads the resident split, if any)."""

  def train_stream(self, start_step: int) -> Iterator[Mapping[str, np.ndarray]]:
    """Host inputs from a data position: batches, or positions into the resident split."""

  def put(self, stacked: Mapping[str, np.ndarray]) -> Any:
    """A host stack `[k, ...]` of inputs placed on the mesh for `multi_step`."""

  def records(self, metrics: Mapping[str, np.ndarray]) -> list[Record]:
    """The rows to log of per-step or mean metrics (one per member)."""

  def non_finite(self, metrics: Mapping[str, np.ndarray]) -> Failure | None:
    """None, or the first member whose loss or gradient is not finite."""

  def validate(self, state: TrainState) -> list[Record]:
    """The validation rows (one per member)."""

  def finish(self, state: TrainState, workdir: str, *, only_if_missing: bool) -> list[str]:
    """What a run writes at its end (a sweep's `sweep.json`; with `only_if_missing`, only if it
    is not there yet); returns lines for the console."""


def loop_call(trainee: Trainee, resident_split: Any) -> programs.MultiStep:
  """`trainee.multi_step()` of both trainees: its program (one step, or k steps, as
  `trainee.per_step` says) as the loop calls it, with `resident_split` (None: host batches)
  bound as an argument."""
  return programs.loop_call(trainee.program(per_step=trainee.per_step),
                            per_step=trainee.per_step, resident_split=resident_split)
