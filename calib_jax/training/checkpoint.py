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

A checkpoint written by a run of another config (another width, number of classes, optimiser,
sweep population...) is not damaged: its metadata is compared with the arrays asked for before
anything is read, and a difference is a `CheckpointMismatchError` (a ValueError) naming the
arrays, never "unreadable". A read that fails ends with its one exception: orbax's event loops
let tensorstore's other reads of that checkpoint finish before they close, so no late
traceback is printed.
"""
import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
import orbax.checkpoint as ocp
from etils import epath
from absl import logging
from jax.experimental import multihost_utils

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


class CheckpointMismatchError(ValueError):
  """A checkpoint whose files are fine but whose arrays (shapes or tree) are not those asked for:
  it was written by a run of another config. `differences` lists them, e.g.
  `'params.head.kernel: stored (8, 10), wanted (8, 4)'`."""

  def __init__(self, message: str, differences: list[str]):
    super().__init__(message)
    self.differences = differences


def _path_name(path: tuple[Any, ...]) -> str:
  """'opt_state.1.trace.conv0.kernel' for a pytree key path (dict keys, attributes and sequence
  indices alike, so a `TrainState` and the nested dicts and lists of orbax's metadata match)."""
  parts = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
  return ".".join(str(p) for p in parts)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {_path_name(path): tuple(getattr(leaf, "shape", None) or ()) for path, leaf in leaves}


def tree_differences(stored: Any, wanted: Any, *, partial: bool = False) -> list[str]:
  """How the arrays of `wanted` (a pytree of `jax.ShapeDtypeStruct`) differ from `stored` (a
  checkpoint's metadata tree): shapes first, then arrays only one side has (with `partial`, arrays
  only the checkpoint has are fine). Dtypes are not compared: orbax casts on restore."""
  have, need = _shapes(stored), _shapes(wanted)
  shapes = [f"{name}: stored {have[name]}, wanted {shape}" for name, shape in need.items()
            if name in have and have[name] != shape]
  missing = [f"{name}: not in the checkpoint" for name in need if name not in have]
  extra = [] if partial else [f"{name}: only in the checkpoint" for name in have
                              if name not in need]
  return shapes + missing + extra


class _DrainingEventLoop(asyncio.SelectorEventLoop):
  """An event loop that, when closed, first lets its unfinished tasks end and takes their
  exceptions. When one array read of a checkpoint fails, orbax's `asyncio.gather` raises at once
  and its runner closes the loop while tensorstore still completes the checkpoint's other reads:
  each would print a traceback ("Event loop is closed", "Task exception was never retrieved").
  Every task the loop made is kept: one that failed *before* the close is no longer among
  `asyncio.all_tasks` (unfinished tasks only), and its exception, never taken, would be printed
  when it is collected."""

  def __init__(self) -> None:
    super().__init__()
    self._tasks: list[asyncio.Task] = []

  def create_task(self, coro, **kwargs) -> asyncio.Task:
    task = super().create_task(coro, **kwargs)
    self._tasks.append(task)
    return task

  def close(self) -> None:
    if not self.is_running() and not self.is_closed():
      pending = [task for task in self._tasks if not task.done()]
      if pending:
        self.run_until_complete(asyncio.wait(pending, timeout=_DRAIN_SECONDS))
      for task in self._tasks:
        if task.done() and not task.cancelled():
          task.exception()  # retrieved: a failed read was already reported by the first one
      self._tasks.clear()
    super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
  def new_event_loop(self) -> asyncio.AbstractEventLoop:
    return _DrainingEventLoop()


_DRAIN_SECONDS = 60.0


@contextlib.contextmanager
def _reads_awaited() -> Iterator[None]:
  """While a checkpoint is read, orbax's event loops (`asyncio.new_event_loop`) are
  `_DrainingEventLoop`s, so a failed read ends with its one exception and nothing printed."""
  previous = asyncio.get_event_loop_policy()
  asyncio.set_event_loop_policy(_DrainingPolicy())
  try:
    yield
  finally:
    asyncio.set_event_loop_policy(previous)


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
      CheckpointMismatchError: the checkpoint holds other shapes or another tree than
        `abstract_state` (a run of another config); nothing is read.
      UnreadableCheckpointError: `step` cannot be read, or (`step` None) none can.
    """
    def read(at: int) -> tuple[Any, dict[str, Any]]:
      self._check_tree(at, abstract_state, partial=False)
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
      step: which checkpoint; None for the newest readable one (see `restore`, which also
        says what is raised).
    """
    wanted = {k: v for k, v in abstract_variables.items() if v}  # no empty batch_stats

    def read(at: int) -> tuple[dict[str, Any], dict[str, Any]]:
      self._check_tree(at, wanted, partial=True)
      restored = self._manager.restore(at, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
              partial_restore=True),
          meta=ocp.args.JsonRestore()))
      return dict(restored["state"]), dict(restored["meta"])

    result, step = self._read_newest(read, step)
    logging.info("Restored the variables of checkpoint %d from %s", step, self.directory)
    return result

  def _check_tree(self, step: int, wanted: Any, *, partial: bool) -> None:
    """Raises `CheckpointMismatchError` when checkpoint `step`'s arrays (from its metadata; no
    array is read) are not `wanted`'s shapes and tree (None: whatever is stored)."""
    if wanted is None:
      return
    item = os.path.join(self.directory, str(step), "state")
    stored = ocp.PyTreeCheckpointHandler().metadata(epath.Path(item))
    differences = tree_differences(getattr(stored, "tree", stored), wanted, partial=partial)
    if differences:
      shown = "; ".join(differences[:3]) + (f"; {len(differences) - 3} more"
                                           if len(differences) > 3 else "")
      raise CheckpointMismatchError(
          f"checkpoint {step} in {self.directory} holds other arrays than this config's model "
          f"and state ({shown})", differences)

  def _read_newest(self, read: Callable[[int], _T], step: int | None) -> tuple[_T, int]:
    """`read(step)`, or with `step` None `read` of the newest step it succeeds on; the newer
    steps it failed on go to `self.skipped` as (step, reason), each logged as a warning. A
    `CheckpointMismatchError` is raised at once: the files are fine, the config is not theirs."""
    self.skipped = []
    steps = sorted(self._manager.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"No checkpoint in {self.directory}")
    if step is not None:
      if step not in steps:
        raise FileNotFoundError(f"No checkpoint of step {step} in {self.directory} (steps on "
                                f"disk: {', '.join(map(str, sorted(steps)))})")
      try:
        with _reads_awaited():
          return read(step), step
      except CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except  # Any other failure: unreadable.
        raise UnreadableCheckpointError(
            f"checkpoint {step} in {self.directory} is unreadable ({short_reason(e)})") from e
    for at in steps:
      try:
        with _reads_awaited():
          return read(at), at
      except CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except  # Any other failure: try an older one.
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
