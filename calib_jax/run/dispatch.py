"""Several optimiser steps per compiled call, and their batches on the devices ahead of time.

A call of the training program (`programs.train_program`) runs k steps on a `[k, batch, ...]` stack
of batches. The host's work per call (the Python loop, the dispatch, stacking and
transferring the input) is then paid once per k steps, and `Prefetcher` does the stacking and
the transfer in a background thread while the devices compute, `depth` calls ahead (as flax's
`prefetch_to_device` and big_vision's prefetch do).

The loop must stop at the steps where it logs, evaluates, saves a checkpoint or ends, so a call
never runs past the next multiple of those intervals (`dispatch_sizes`): such a call is shorter
and its length compiles once more. `resolve_steps_per_dispatch(0, ...)` (auto) picks the
largest k up to `MAX_AUTO_STEPS` that divides every interval, so that every call but perhaps a
run's last is full-length.
"""
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

# Auto's upper bound: 16 steps amortise the ~1 ms of host work per call (measured on the
# Fashion-MNIST MLP, bench/loop_throughput.py) to under 0.1 ms per step, while a stack of 16
# batches stays a small share of device memory for the recipes' per-device batches.
MAX_AUTO_STEPS = 16

_END = object()


def resolve_steps_per_dispatch(requested: int, intervals: Sequence[int]) -> int:
  """`requested` if > 0, else the largest k <= MAX_AUTO_STEPS dividing every positive
  interval (the steps between logs, evaluations, checkpoints)."""
  if requested > 0:
    return int(requested)
  common = 0
  for interval in intervals:
    if interval > 0:
      common = math.gcd(common, int(interval))
  if common == 0:
    return MAX_AUTO_STEPS
  return max(d for d in range(1, MAX_AUTO_STEPS + 1) if common % d == 0)


def dispatch_sizes(start: int, stop: int, steps_per_dispatch: int,
                   intervals: Sequence[int]) -> Iterator[int]:
  """The number of steps of each call that takes a run from step `start` to `stop`: at most
  `steps_per_dispatch`, and never past a multiple of a positive interval, so that the loop sees
  every step where it logs, evaluates or saves."""
  step = start
  while step < stop:
    end = min(stop, step + steps_per_dispatch)
    for interval in intervals:
      if interval > 0:
        end = min(end, (step // interval + 1) * interval)
    yield end - step
    step = end


def stack(batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """`[k, ...]` arrays from k batches with the same keys."""
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


class _Failure:

  def __init__(self, error: BaseException):
    self.error = error


class Prefetcher:
  """Stacks the host batches of each call and puts them on the devices in a background thread.

  Iterating yields `(num_steps, device_batches)` for each size of `sizes`, in order; at most
  `depth` stacks wait on the devices. An error of the input pipeline is raised by the
  iteration that would have returned its stack. `close()` stops the thread (a run that stops
  early discards what was prefetched; a resume reopens the stream at its step).

  Args:
    batches: host batches (one step each), e.g. `DataRecipe.train_stream`.
    sizes: steps per call (`dispatch_sizes`).
    put: host stack -> device arrays (e.g. `parallel.to_global(..., stacked=True)`).
    depth: stacks prepared ahead of the devices (2: one computing, one ready).
  """

  def __init__(self, batches: Iterator[Mapping[str, np.ndarray]], sizes: Iterable[int],
               put: Callable[[dict[str, np.ndarray]], Any], depth: int = 2):
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stopped = threading.Event()
    self._thread = threading.Thread(target=self._fill, args=(batches, sizes, put),
                                    name="calib_jax-prefetch", daemon=True)
    self._thread.start()

  def _offer(self, item: Any) -> bool:
    while not self._stopped.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _fill(self, batches, sizes, put) -> None:
    try:
      for size in sizes:
        host = [next(batches) for _ in range(size)]
        if not self._offer((size, put(stack(host)))):
          return
      self._offer(_END)
    except StopIteration:
      self._offer(_Failure(RuntimeError("the training stream ended before the run did")))
    except BaseException as error:  # pylint: disable=broad-except
      self._offer(_Failure(error))

  def __iter__(self) -> "Prefetcher":
    return self

  def __next__(self) -> tuple[int, Any]:
    item = self._queue.get()
    if item is _END:
      raise StopIteration
    if isinstance(item, _Failure):
      raise item.error
    return item

  def close(self) -> None:
    self._stopped.set()
    while True:
      try:
        self._queue.get_nowait()
      except queue.Empty:
        break
    self._thread.join(timeout=10)
