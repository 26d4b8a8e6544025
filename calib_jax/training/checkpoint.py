"""Orbax checkpoints of the full training state, for exact resume.

A checkpoint holds two items: `state` (the `TrainState` pytree: params, batch statistics,
optimiser state, step, base RNG key, CRL history) and `meta` (JSON written by the caller; the
training loop stores the step and epoch; the data position is the step). The orbax
`CheckpointManager` decides which steps are saved (a fixed interval) and how many are kept. Saves are asynchronous; `wait()`
before reading them or exiting. Only finite states are ever passed to `save` (the loop checks
first), so the newest checkpoint on disk is always a good one.
"""
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

CHECKPOINT_SUBDIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
  """Absolute checkpoint directory of a work directory (orbax requires absolute paths)."""
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_SUBDIR)


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
    """Restores `(state, meta)` of checkpoint `step` (default: newest).

    Args:
      abstract_state: pytree of `jax.ShapeDtypeStruct` (with shardings) giving the structure,
        dtypes and placement of the state to restore into.
      step: which checkpoint; None for the newest.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint in {self.directory}")
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      meta=ocp.args.JsonRestore()))
    logging.info("Restored checkpoint %d from %s", step, self.directory)
    return restored["state"], dict(restored["meta"])

  def restore_variables(self, abstract_variables: Any,
                        step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restores only the model variables (`params`, `batch_stats`) of checkpoint `step`
    (default: newest) and its meta: orbax's partial restore reads those arrays alone, so the
    optimiser state's structure need not be known (eval, fine-tuning from a run).

    Args:
      abstract_variables: `{'params': ..., 'batch_stats'?: ...}` of `jax.ShapeDtypeStruct`
        (with shardings), e.g. from `jax.eval_shape` of the model's init.
      step: which checkpoint; None for the newest.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint in {self.directory}")
    wanted = {k: v for k, v in abstract_variables.items() if v}  # no empty batch_stats
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
            partial_restore=True),
        meta=ocp.args.JsonRestore()))
    logging.info("Restored the variables of checkpoint %d from %s", step, self.directory)
    return dict(restored["state"]), dict(restored["meta"])

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
