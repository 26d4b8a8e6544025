"""Orbax checkpoints of the full training state, for exact resume.

A checkpoint holds two items: `state` (the `TrainState` pytree: params, batch statistics,
optimiser state, step, base RNG key, CRL history) and `meta` (JSON written by the caller; the
training loop stores the step and epoch; the data position is the step). The orbax
`CheckpointManager` decides which steps are saved (a fixed interval) and how many are kept. Saves are asynchronous; `wait()`
before reading them or exiting. Only finite states are ever passed to `save` (the loop checks
first), so the newest checkpoint on disk is always a good one.

A checkpoint can still be damaged after it was written (a disk fault, a copy cut short, files
overwritten). `restore` without a step therefore takes the newest *readable* checkpoint: the
newer ones it could not read are listed in `skipped` (step and a short reason) for the caller to
report, and `set_aside` moves them (never deletes them) to `<workdir>/unreadable_checkpoints/`
so training can save those steps again. When none can be read, or an explicitly requested step
cannot, `UnreadableCheckpointError` (a ValueError) says which and why.
"""
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import orbax.checkpoint as ocp
from absl import logging

CHECKPOINT_SUBDIR = "checkpoints"
UNREADABLE_SUBDIR = "unreadable_checkpoints"
_T = TypeVar("_T")


class UnreadableCheckpointError(ValueError):
  """No checkpoint of a directory can be read, or the requested step cannot."""


def short_reason(error: BaseException, limit: int = 160) -> str:
  """One short line saying why a read failed: the error type and its message's first line."""
  text = (str(error).strip().splitlines() or [""])[0].split(" [tensorstore_spec=")[0]
  if len(text) > limit:
    text = text[:limit - 3] + "..."
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def checkpoint_dir(workdir: str) -> str:
  """Absolute checkpoint directory of a work directory (orbax requires absolute paths)."""
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_SUBDIR)


def _quiet_closed_loop_errors() -> None:
  """Sends tensorstore's late 'Event loop is closed' errors to the log instead of stderr, from
  the first failed checkpoint read on (for the rest of the process: they arrive late): after a
  failed read, orbax closes its event loop while tensorstore still completes the other reads of
  that checkpoint, and each completion would print a traceback through `sys.unraisablehook`."""
  previous = sys.unraisablehook
  if getattr(previous, "calib_jax_quiet", False):
    return

  def hook(unraisable) -> None:
    if (isinstance(unraisable.exc_value, RuntimeError)
        and "Event loop is closed" in str(unraisable.exc_value)):
      logging.debug("After a failed checkpoint read: %s", unraisable.exc_value)
    else:
      previous(unraisable)

  hook.calib_jax_quiet = True
  sys.unraisablehook = hook


class Checkpointer:
  """Periodic + final saves, keeping the newest `max_to_keep`, and restores."""

  def __init__(self, workdir: str, *, save_every_steps: int = 1, max_to_keep: int = 3,
               read_only: bool = False):
    """Opens (and unless `read_only`, creates) `<workdir>/checkpoints`.

    Args:
      workdir: the run's work directory.
      save_every_steps: `maybe_save` saves when the step is a multiple of this.
      max_to_keep: number of newest checkpoints kept on disk (0 or None: all).
      read_only: open an existing directory for restoring only (eval).
    """
    self.directory = checkpoint_dir(workdir)
    self.skipped: list[tuple[int, str]] = []  # (step, reason) the last restore could not read
    if read_only:  # Neither saves nor deletes; orbax warns about any interval or retention.
      options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
    else:
      # orbax's interval policy alone: `save_interval_steps` would add its InitialSavePolicy,
      # which also saves the first step of a fresh run.
      interval = ocp.checkpoint_managers.FixedIntervalPolicy(max(int(save_every_steps), 1))
      options = ocp.CheckpointManagerOptions(
          save_decision_policy=interval, max_to_keep=max_to_keep or None, create=True)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """Step of the newest complete checkpoint, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of all checkpoints on disk, ascending."""
    return sorted(self._manager.all_steps())

  @staticmethod
  def _save_args(state: Any, meta: dict[str, Any]) -> ocp.args.Composite:
    return ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts an asynchronous save of `state` (and JSON `meta`) as checkpoint `step`, whatever
    the interval (the final save); a step already on disk is left as it is."""
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=self._save_args(state, meta), force=True)

  def should_save(self, step: int) -> bool:
    """Whether the manager's policy saves `step` (the loop checks the state first)."""
    return bool(self._manager.should_save(step))

  def maybe_save(self, step: int, state: Any, meta: dict[str, Any]) -> bool:
    """Saves when the manager's policy says so (`step` a multiple of `save_every_steps` and
    newer than the latest checkpoint); returns whether it did."""
    return bool(self._manager.save(step, args=self._save_args(state, meta)))

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores `(state, meta)` of checkpoint `step` (default: the newest readable one; the newer
    unreadable ones are in `self.skipped` afterwards).

    Args:
      abstract_state: pytree of `jax.ShapeDtypeStruct` (with shardings) giving the structure,
        dtypes and placement of the state to restore into.
      step: which checkpoint; None for the newest readable one.

    Raises:
      FileNotFoundError: no checkpoint (or none of `step`).
      UnreadableCheckpointError: `step` cannot be read, or (`step` None) none can.
    """
    def read(at: int) -> tuple[Any, dict[str, Any]]:
      restored = self._manager.restore(
          at, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      meta=ocp.args.JsonRestore()))
      return restored["state"], dict(restored["meta"])

    result, step = self._read_newest(read, step)
    logging.info("Restored checkpoint %d from %s", step, self.directory)
    return result

  def restore_variables(self, abstract_variables: Any,
                        step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restores only the model variables (`params`, `batch_stats`) of checkpoint `step`
    (default: newest) and its meta: orbax's partial restore reads those arrays alone, so the
    optimiser state's structure need not be known (eval, fine-tuning from a run).

    Args:
      abstract_variables: `{'params': ..., 'batch_stats'?: ...}` of `jax.ShapeDtypeStruct`
        (with shardings), e.g. from `jax.eval_shape` of the model's init.
      step: which checkpoint; None for the newest readable one (see `restore`).
    """
    wanted = {k: v for k, v in abstract_variables.items() if v}  # no empty batch_stats

    def read(at: int) -> tuple[dict[str, Any], dict[str, Any]]:
      restored = self._manager.restore(at, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
              partial_restore=True),
          meta=ocp.args.JsonRestore()))
      return dict(restored["state"]), dict(restored["meta"])

    result, step = self._read_newest(read, step)
    logging.info("Restored the variables of checkpoint %d from %s", step, self.directory)
    return result

  def _read_newest(self, read: Callable[[int], _T], step: int | None) -> tuple[_T, int]:
    """`read(step)`, or with `step` None `read` of the newest step it succeeds on; the newer
    steps it failed on go to `self.skipped` as (step, reason), each logged as a warning."""
    self.skipped = []
    steps = sorted(self._manager.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"No checkpoint in {self.directory}")
    if step is not None:
      if step not in steps:
        raise FileNotFoundError(f"No checkpoint of step {step} in {self.directory} (steps on "
                                f"disk: {', '.join(map(str, sorted(steps)))})")
      try:
        return read(step), step
      except Exception as e:  # pylint: disable=broad-except  # Any failure: unreadable.
        _quiet_closed_loop_errors()
        raise UnreadableCheckpointError(
            f"checkpoint {step} in {self.directory} is unreadable ({short_reason(e)})") from e
    for at in steps:
      try:
        return read(at), at
      except Exception as e:  # pylint: disable=broad-except  # Any failure: try an older one.
        _quiet_closed_loop_errors()
        self.skipped.append((at, short_reason(e)))
        logging.warning("Checkpoint %d in %s is unreadable: %s", at, self.directory, e)
    reasons = "; ".join(f"{at}: {why}" for at, why in self.skipped)
    raise UnreadableCheckpointError(
        f"no checkpoint in {self.directory} is readable ({reasons}); move that directory "
        "away to start afresh")

  def set_aside(self, steps: list[int]) -> list[str]:
    """Moves the checkpoints of `steps` (unreadable ones) to `<workdir>/unreadable_checkpoints/`
    so those steps can be saved again; nothing is deleted. Returns the new paths. Process 0
    moves, every process waits for it."""
    workdir = os.path.dirname(self.directory)
    moved = []
    for step in steps:
      target = os.path.join(workdir, UNREADABLE_SUBDIR, str(step))
      n = 1
      while os.path.exists(target):
        n += 1
        target = os.path.join(workdir, UNREADABLE_SUBDIR, f"{step}-{n}")
      if jax.process_index() == 0:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(os.path.join(self.directory, str(step)), target)
      moved.append(target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("calib_jax_set_aside_checkpoints")
    self._manager.reload()
    return moved

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()


def abstract_like(tree: Any) -> Any:
  """`jax.ShapeDtypeStruct` skeleton of a pytree of arrays, keeping their shardings."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)
