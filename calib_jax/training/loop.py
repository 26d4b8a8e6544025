"""The training loop: one program for classification, segmentation and text.

`train_and_evaluate(config, workdir)` builds the config's experiment (`calib_jax.experiment.build`:
model, loss, optimiser and data streams, every config problem in one message), restores
the newest checkpoint of `workdir` if there is one (exact resume: parameters, optimiser state,
BatchNorm statistics, step, RNG and data position), trains to the configured length with
periodic checkpoints and validation, and saves the final state. Each compiled call runs
`config.steps_per_dispatch` steps on batches prefetched to the devices (`dispatch`). A non-finite loss or gradient
stops the run with `NonFiniteLossError` before the bad state can be checkpointed. SIGTERM (a
preemption notice) saves the step in flight and raises `preemption.Preempted`; a damaged newest
checkpoint is reported in one warning line, moved aside, and training resumes from the newest
readable one.
"""
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from calib_jax import experiment as experiment_lib
from calib_jax.training import checkpoint as checkpoint_lib
from calib_jax import sweep as sweep_lib
from calib_jax.training import dispatch, parallel, preemption, single
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

  steps_per_epoch, total_steps = experiment.length.steps_per_epoch, experiment.length.total_steps
  trainee = (single.SingleRun(experiment) if not config.sweep
             else sweep_lib.Population(experiment))

  checkpointer = checkpoint_lib.Checkpointer(
      workdir, save_every_steps=config.checkpoint_every_steps,
      max_to_keep=config.keep_checkpoints)
  if checkpointer.latest_step() is not None:
    try:
      state, _ = checkpointer.restore(trainee.abstract_state())
    except Exception:
      checkpointer.close()
      raise
    step = int(np.max(jax.device_get(state.step)))  # a population's members agree
    logging.info("Resuming at step %d (the training stream restarts at batch %d).", step, step)
    if checkpointer.skipped:
      _report_skipped(checkpointer, step)
  else:
    state = trainee.initial_state()
  # After the restore: a config whose model does not fit the checkpoint leaves the run's own.
  log_lib.save_config(config, workdir)
  start_step = int(np.max(jax.device_get(state.step)))  # a population's members agree
  if start_step >= total_steps:
    logging.info("Already trained for %d steps; nothing to do.", start_step)
    if config.progress_bar and jax.process_index() == 0:
      print(f"Already trained for {start_step} steps; nothing to do.", flush=True)
    checkpointer.close()
    lines = trainee.finish(state, workdir, only_if_missing=True)  # e.g. a sweep stopped writing
    if config.progress_bar and jax.process_index() == 0 and lines:
      print("\n".join(lines), flush=True)
    return state

  try:
    multi_step = trainee.multi_step()  # may read the training split (data.on_device)
  except Exception:
    checkpointer.close()
    raise
  writer = log_lib.MetricWriter(workdir, tensorboard=config.tensorboard)
  progress = log_lib.ProgressBar(total_steps, start_step) if config.progress_bar else None

  def say(line: str) -> None:  # to the log, and above the progress bar
    logging.info("%s", line)
    if progress is not None:
      progress.write(line)

  eval_every = _eval_interval(config, steps_per_epoch)
  stop_at = total_steps
  if config.stop_after_steps > 0:
    stop_at = min(total_steps, start_step + config.stop_after_steps)
  # Calls end where the loop logs, evaluates or saves (a multiple of these) or stops.
  intervals = (config.log_every_steps, eval_every, config.checkpoint_every_steps)
  steps_per_dispatch = dispatch.resolve_steps_per_dispatch(config.steps_per_dispatch, intervals)
  logging.info("%d step(s) per dispatch.", steps_per_dispatch)
  batches = dispatch.Prefetcher(
      trainee.train_stream(start_step),
      dispatch.dispatch_sizes(start_step, stop_at, steps_per_dispatch, intervals), trainee.put)
  history: list[dict[str, np.ndarray]] = []   # host metrics of the current logging window
  # (last step, steps, stacked device metrics) of the calls whose metrics were not yet read.
  pending: list[tuple[int, int, dict[str, jax.Array]]] = []
  last_log_time, last_log_step = time.monotonic(), start_step
  status = ""

  def read_pending() -> None:
    """Reads the queued steps' metrics (one transfer) and stops at the first non-finite one,
    before anything is saved: the newest checkpoint stays the last good state."""
    nonlocal status
    host = jax.device_get([m for _, _, m in pending])
    for (last, num_steps, _), stacked in zip(pending, host):
      for offset, metrics in enumerate(_per_step(stacked, num_steps)):
        failed = trainee.non_finite(metrics)
        if failed is not None:
          index, member, member_metrics = failed
          raise _non_finite_error(member_metrics, last - num_steps + offset + 1, checkpointer,
                                  index, member)
        history.append(metrics)
    pending.clear()
    status = (f"loss {float(np.mean(history[-1]['loss'])):.4f} "
              f"lr {float(np.mean(history[-1]['learning_rate'])):.3g}")

  watch = preemption.Watch()
  preempted = False
  try:
    watch.__enter__()
    done = start_step
    for num_steps, stacked in batches:
      state, metrics = multi_step(state, stacked)
      done += num_steps
      pending.append((done, num_steps, metrics))
      # Metrics stay on device between reads, so Python keeps dispatching calls ahead of the
      # accelerator; they are read where a decision needs them (log, validation, checkpoint,
      # end) and at least every _MAX_PENDING_STEPS steps to bound the work queued ahead.
      log_now = done % config.log_every_steps == 0 or done == stop_at
      eval_now = eval_every > 0 and (done % eval_every == 0 or done == total_steps)
      preempted = watch.reached(done)  # SIGTERM: save this step and stop.
      save_now = checkpointer.should_save(done) or preempted
      if (log_now or eval_now or save_now
          or sum(n for _, n, _ in pending) >= _MAX_PENDING_STEPS):
        read_pending()
      if log_now:
        now = time.monotonic()
        summary = _mean_metrics(history)
        summary.pop("finite")
        for tags, row in trainee.records(summary):
          row["steps_per_sec"] = (done - last_log_step) / max(now - last_log_time, 1e-9)
          row["epoch"] = done / steps_per_epoch
          writer.write(done, "train", row, tags=tags)
        history.clear()
        last_log_time, last_log_step = now, done
      if progress is not None:
        progress.update(done, status, force=done == stop_at)
      if eval_now:
        for tags, val in trainee.validate(state):
          writer.write(done, "val", val, tags=tags)
          say(f"step {done}{_member_label(tags)} val "
              + " ".join(f"{k}={v:.4f}" for k, v in val.items()))
      if save_now:
        checkpointer.save(done, state, _checkpoint_meta(done, steps_per_epoch))
      if preempted:
        break
    final = int(np.max(jax.device_get(state.step)))
    checkpointer.save(final, state, _checkpoint_meta(final, steps_per_epoch))
    if final >= total_steps:
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
