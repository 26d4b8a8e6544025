"""Preemption: on SIGTERM, training finishes the step in flight, saves it and stops.

Cluster schedulers (Cloud TPU maintenance events and spot VMs, SLURM's `--signal=TERM@...` or
preemption, Kubernetes pod eviction) send SIGTERM some time before they kill a job. `Watch`
turns that notice into a step at which every process saves a checkpoint; the training loop then
raises `Preempted` and `train.py` exits with `PREEMPTED_EXIT_CODE` after one console line.
Running the same command again resumes from that checkpoint, exactly as if never interrupted.

* One process: `Watch` installs a SIGTERM handler (on the main thread, for the duration of the
  `with` block) that only sets a flag; the loop asks `reached(step)` after every step. A second
  SIGTERM, once the first was noticed, kills the process the default way.
* Several processes (`jax.distributed.initialize`): the hosts must agree on the step, or each
  would save a different one. JAX's preemption sync manager (started by
  `jax.distributed.initialize`, on by default through `jax_enable_preemption_service`) catches
  SIGTERM on whichever host receives it and tells the coordination service;
  `jax.experimental.multihost_utils.reached_preemption_sync_point(step)`, called by every host
  after every step, then returns True on all hosts at the same step (the largest step any host
  has reached, plus one). `Watch` leaves SIGTERM to that manager and asks it instead.
"""
import signal
import threading
import types

import jax
from absl import logging
from jax.experimental import multihost_utils

# EX_TEMPFAIL of sysexits.h: "a temporary failure; the user is invited to retry".
PREEMPTED_EXIT_CODE = 75


class Preempted(Exception):
  """Training stopped at a preemption notice after saving checkpoint `step` in `directory`."""

  def __init__(self, step: int, directory: str):
    super().__init__(f"preempted (SIGTERM): saved checkpoint {step} in {directory}; run the same "
                     "command again to resume")
    self.step, self.directory = step, directory


class Watch:
  """Context manager telling the training loop whether to save and stop after a step."""

  def __init__(self):
    self._noticed = False
    self._previous = None
    self._multiprocess = False

  def __enter__(self) -> "Watch":
    self._multiprocess = jax.process_count() > 1
    if not self._multiprocess and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    return self

  def _on_sigterm(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    self._noticed = True
    signal.signal(signum, signal.SIG_DFL)  # A second SIGTERM ends the process at once.

  def reached(self, step: int) -> bool:
    """Whether to save `step` (just completed) and stop; call it after every step."""
    if self._multiprocess:
      if multihost_utils.reached_preemption_sync_point(step):
        self._noticed = True
    if self._noticed:
      logging.warning("Preemption notice: saving step %d and stopping.", step)
    return self._noticed

  def __exit__(self, *exc_info) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
