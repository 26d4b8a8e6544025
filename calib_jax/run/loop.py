"""The training loop: one program for classification, segmentation and text.

`train_and_evaluate(config, workdir)` builds the config's experiment (`calib_jax.experiment.build`:
model, loss, optimiser and data streams, every config problem in one message), restores
the newest checkpoint of `workdir` if there is one (exact resume: parameters, optimiser state,
BatchNorm statistics, step, RNG and data position), trains to the configured length with
periodic checkpoints and validation, and saves the final state. What it trains is a `trainee.Trainee`: one run
(`single.SingleRun`) or a sweep's population (`population.Population`). Each compiled call runs
`config.steps_per_dispatch` steps on batches prefetched to the devices (`dispatch`). A non-finite loss or gradient
stops the run with `NonFiniteLossError` before the bad state can be checkpointed. SIGTERM (a
preemption notice) saves the step in flight and raises `preemption.Preempted`; a damaged newest
checkpoint is reported in one warning line, moved aside, and training resumes from the newest
readable one.
"""
import dataclasses
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from calib_jax import experiment as experiment_lib
from calib_jax import sweep as sweep_lib
from calib_jax.run import dispatch, preemption
from calib_jax.run.population import Population
from calib_jax.run.single import SingleRun
from calib_jax.run.trainee import Trainee
from calib_jax.training import checkpoint as checkpoint_lib
from calib_jax.training import parallel
from calib_jax.training import reporting as log_lib
from calib_jax.training import state as state_lib


# Steps whose metrics may wait on device before the loop reads them (bounds queued work).
_MAX_PENDING_STEPS = 100


def _per_step(metrics: dict[str, np.ndarray], num_steps: int) -> list[dict[str, np.ndarray]]:
  """One call's stacked host metrics (`[num_steps]` each) as one dict per step."""
  return [{k: v[i] for k, v in metrics.items()} for i in range(num_steps)]


class NonFiniteLossError(FloatingPointError):
  """The loss or gradient became NaN/inf; the message names the last good checkpoint.

  Attributes:
    member: the index of the sweep member that diverged (None for a single run).
  """

  def __init__(self, message: str, member: int | None = None):
    super().__init__(message)
    self.member = member


def _checkpoint_meta(step: int, steps_per_epoch: int) -> dict[str, Any]:
  # No separate data position: the training stream is a function of (seed, step), so a resume
  # opens it at `start_batch = step`.
  return {"step": step, "epoch": step / steps_per_epoch}


def _mean_metrics(history: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """The window's mean of each metric (per member for a population: `[P]`)."""
  return {k: np.mean([h[k] for h in history], axis=0) for k in history[0]}


def _non_finite_error(metrics: dict[str, np.ndarray], step: int,
                      checkpointer: checkpoint_lib.Checkpointer, index: int | None,
                      member: str) -> "NonFiniteLossError":
  """`metrics` are the failing run's or member's; `index` and `member` name the member (None
  and "" for a single run)."""
  checkpointer.wait()
  last = checkpointer.latest_step()
  where = (f"the last good checkpoint is step {last} in {checkpointer.directory}"
           if last is not None else "no checkpoint was saved before it")
  loss, grad_norm = metrics["loss"], metrics["grad_norm"]
  return NonFiniteLossError(
      f"Non-finite training loss ({float(loss)}) or gradient norm ({float(grad_norm)}) at "
      f"step {step}{' of ' + member if member else ''}; training stopped and {where}. "
      "Lower learning_rate or set grad_clip_norm, then rerun the same command to resume.",
      member=index)


def _report_skipped(checkpointer: checkpoint_lib.Checkpointer, step: int) -> None:
  """One warning line for the unreadable checkpoints newer than `step`, which are moved aside
  (kept, not deleted) so that training can save those steps again."""
  skipped = checkpointer.skipped
  moved = checkpointer.set_aside([s for s, _ in skipped])
  what = "; ".join(f"checkpoint {s} is unreadable ({why})" for s, why in skipped)
  log_lib.warn(f"{what}; resuming from step {step}; the unreadable files were moved to "
               f"{os.path.dirname(moved[0])}")


def _member_label(tags: dict[str, Any]) -> str:
  """' member 3 (loss_kwargs.margin=10.0 seed=0)' for a sweep's member; '' for a single run."""
  if "member" not in tags:
    return ""
  return f" member {tags['member']} ({sweep_lib.overrides_label(tags.get('overrides', {}))})"


def _eval_interval(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  if config.eval_every_steps == -1:
    return steps_per_epoch
  return int(config.eval_every_steps)


def make_trainee(experiment: experiment_lib.Experiment) -> Trainee:
  """What the config trains: its sweep's population, or one run."""
  return Population(experiment) if experiment.config.sweep else SingleRun(experiment)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: list[jax.Device] | None = None) -> state_lib.TrainState:
  """Trains the config's model in `workdir` (resuming from its newest checkpoint).

  Args:
    config: a config following `calib_jax.config.base_config`.
    workdir: directory for checkpoints, metrics and the saved config.
    devices: devices of the data-parallel mesh (default: all).

  Returns:
    The final training state (replicated on the mesh).

  Raises:
    ConfigError: (a ValueError) the config is invalid (raised before anything is compiled).
    reporting.WorkdirError: `workdir` cannot be written (raised before anything is built).
    NonFiniteLossError: the loss or gradient became NaN/inf.
    preemption.Preempted: SIGTERM arrived; the step in flight was finished and saved.
  """
  parallel.maybe_initialize_distributed(config.multihost)
  experiment = experiment_lib.build(config, devices=devices)
  log_lib.check_workdir(workdir)
  trainee = make_trainee(experiment)
  checkpointer = checkpoint_lib.Checkpointer(
      workdir, save_every_steps=config.checkpoint_every_steps,
      max_to_keep=config.keep_checkpoints)
  try:
    state = _restore_or_initialise(trainee, checkpointer)
  except BaseException:
    checkpointer.close()
    raise
  # After the restore: a config whose model does not fit the checkpoint leaves the run's own.
  log_lib.save_config(config, workdir)
  start_step = int(np.max(jax.device_get(state.step)))  # a population's members agree
  if start_step >= experiment.length.total_steps:
    return _already_trained(trainee, state, checkpointer, workdir)
  return _train(trainee, state, start_step, checkpointer, workdir)


def _restore_or_initialise(trainee: Trainee,
                           checkpointer: checkpoint_lib.Checkpointer) -> state_lib.TrainState:
  """The newest readable checkpoint's state (unreadable newer ones reported and moved aside),
  or the initial state when there is none."""
  if checkpointer.latest_step() is None:
    return trainee.initial_state()
  state, _ = checkpointer.restore(trainee.abstract_state())
  step = int(np.max(jax.device_get(state.step)))
  logging.info("Resuming at step %d (the training stream restarts at batch %d).", step, step)
  if checkpointer.skipped:
    _report_skipped(checkpointer, step)
  return state


def _already_trained(trainee: Trainee, state: state_lib.TrainState,
                     checkpointer: checkpoint_lib.Checkpointer,
                     workdir: str) -> state_lib.TrainState:
  """A finished run: nothing to train; what its end writes, if missing (e.g. a sweep that
  stopped while writing `sweep.json`)."""
  config = trainee.experiment.config
  step = int(np.max(jax.device_get(state.step)))
  logging.info("Already trained for %d steps; nothing to do.", step)
  console = config.progress_bar and jax.process_index() == 0
  if console:
    print(f"Already trained for {step} steps; nothing to do.", flush=True)
  checkpointer.close()
  lines = trainee.finish(state, workdir, only_if_missing=True)
  if console and lines:
    print("\n".join(lines), flush=True)
  return state


@dataclasses.dataclass
class _Schedule:
  """Where the loop logs, validates, saves and stops, in steps."""
  log_every: int
  eval_every: int
  total_steps: int
  stop_at: int

  @classmethod
  def of(cls, config: ml_collections.ConfigDict, length: Any, start_step: int) -> "_Schedule":
    stop_at = length.total_steps
    if config.stop_after_steps > 0:
      stop_at = min(stop_at, start_step + config.stop_after_steps)
    return cls(log_every=config.log_every_steps,
               eval_every=_eval_interval(config, length.steps_per_epoch),
               total_steps=length.total_steps, stop_at=stop_at)

  def logs(self, step: int) -> bool:
    return step % self.log_every == 0 or step == self.stop_at

  def validates(self, step: int) -> bool:
    return self.eval_every > 0 and (step % self.eval_every == 0 or step == self.total_steps)


class _MetricsQueue:
  """The calls' metrics, left on device until a decision needs them.

  Python keeps dispatching calls ahead of the accelerator while metrics wait; they are read
  (one transfer) where the loop logs, validates, saves or ends, and at least every
  `_MAX_PENDING_STEPS` steps to bound the work queued ahead. Reading stops at the first
  non-finite step, before anything is saved: the newest checkpoint stays the last good state.
  """

  def __init__(self, trainee: Trainee, checkpointer: checkpoint_lib.Checkpointer):
    self.trainee, self.checkpointer = trainee, checkpointer
    # (last step, steps, stacked device metrics) of the calls not yet read.
    self.pending: list[tuple[int, int, dict[str, jax.Array]]] = []
    self.history: list[dict[str, np.ndarray]] = []   # host metrics of the logging window
    self.status = ""

  def add(self, last_step: int, num_steps: int, metrics: dict[str, jax.Array]) -> None:
    self.pending.append((last_step, num_steps, metrics))

  def must_read(self) -> bool:
    return sum(n for _, n, _ in self.pending) >= _MAX_PENDING_STEPS

  def read(self) -> None:
    host = jax.device_get([m for _, _, m in self.pending])
    for (last, num_steps, _), stacked in zip(self.pending, host):
      for offset, metrics in enumerate(_per_step(stacked, num_steps)):
        failed = self.trainee.non_finite(metrics)
        if failed is not None:
          index, member, member_metrics = failed
          raise _non_finite_error(member_metrics, last - num_steps + offset + 1,
                                  self.checkpointer, index, member)
        self.history.append(metrics)
    self.pending.clear()
    latest = self.history[-1]
    self.status = (f"loss {float(np.mean(latest['loss'])):.4f} "
                   f"lr {float(np.mean(latest['learning_rate'])):.3g}")

  def window_mean(self) -> dict[str, np.ndarray]:
    """The logging window's mean of each metric, and a new window."""
    summary = _mean_metrics(self.history)
    summary.pop("finite")
    self.history.clear()
    return summary


def _train(trainee: Trainee, state: state_lib.TrainState, start_step: int,
           checkpointer: checkpoint_lib.Checkpointer, workdir: str) -> state_lib.TrainState:
  """Trains from `start_step` to the schedule's end (or SIGTERM), logging, validating and
  saving on the way; closes the checkpointer."""
  experiment = trainee.experiment
  config, length = experiment.config, experiment.length
  try:
    multi_step = trainee.multi_step()  # may read the training split (data.on_device)
  except BaseException:
    checkpointer.close()
    raise
  schedule = _Schedule.of(config, length, start_step)
  writer = log_lib.MetricWriter(workdir, tensorboard=config.tensorboard)
  progress = (log_lib.ProgressBar(length.total_steps, start_step) if config.progress_bar
              else None)

  def say(line: str) -> None:  # to the log, and above the progress bar
    logging.info("%s", line)
    if progress is not None:
      progress.write(line)

  # Calls end where the loop logs, evaluates or saves (a multiple of these) or stops.
  intervals = (config.log_every_steps, schedule.eval_every, config.checkpoint_every_steps)
  steps_per_dispatch = dispatch.resolve_steps_per_dispatch(config.steps_per_dispatch, intervals)
  logging.info("%d step(s) per dispatch.", steps_per_dispatch)
  batches = dispatch.Prefetcher(
      trainee.train_stream(start_step),
      dispatch.dispatch_sizes(start_step, schedule.stop_at, steps_per_dispatch, intervals),
      trainee.put)
  queue = _MetricsQueue(trainee, checkpointer)
  last_log_time, last_log_step = time.monotonic(), start_step
  watch = preemption.Watch()
  preempted = False
  try:
    watch.__enter__()
    done = start_step
    for num_steps, stacked in batches:
      state, metrics = multi_step(state, stacked)
      done += num_steps
      queue.add(done, num_steps, metrics)
      log_now, eval_now = schedule.logs(done), schedule.validates(done)
      preempted = watch.reached(done)  # SIGTERM: save this step and stop.
      save_now = checkpointer.should_save(done) or preempted
      if log_now or eval_now or save_now or queue.must_read():
        queue.read()
      if log_now:
        now = time.monotonic()
        for tags, row in trainee.records(queue.window_mean()):
          row["steps_per_sec"] = (done - last_log_step) / max(now - last_log_time, 1e-9)
          row["epoch"] = done / length.steps_per_epoch
          writer.write(done, "train", row, tags=tags)
        last_log_time, last_log_step = now, done
      if progress is not None:
        progress.update(done, queue.status, force=done == schedule.stop_at)
      if eval_now:
        for tags, val in trainee.validate(state):
          writer.write(done, "val", val, tags=tags)
          say(f"step {done}{_member_label(tags)} val "
              + " ".join(f"{k}={v:.4f}" for k, v in val.items()))
      if save_now:
        checkpointer.save(done, state, _checkpoint_meta(done, length.steps_per_epoch))
      if preempted:
        break
    final = int(np.max(jax.device_get(state.step)))
    checkpointer.save(final, state, _checkpoint_meta(final, length.steps_per_epoch))
    if final >= length.total_steps:
      for line in trainee.finish(state, workdir, only_if_missing=False):
        say(line)
  finally:
    batches.close()
    watch.__exit__()
    checkpointer.close()
    writer.close()
    if progress is not None:
      progress.close()
  if preempted:
    raise preemption.Preempted(final, checkpointer.directory)
  return state
