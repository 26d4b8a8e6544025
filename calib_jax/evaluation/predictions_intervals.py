"""The bootstrap intervals of `evaluation.predictions`' report: 95 % percentile intervals of each
calibrator's test `ece`, `smooth_ece` and `aurc` (`metrics.bootstrap` on its top-label
`(confidence, correct)`), dispatched on the device and left there for the report's one fetch.

Where they run. XLA:CPU runs one device's programs one at a time, in the order they were
dispatched, and a host wait for any value waits for everything dispatched before it on that
device. The intervals are most of a small report's device time (on one CPU core, 540 x 10:
~5 s, of which smooth ECE's ~4.5 s), so:

* with a second CPU device (`spare_device`: `eval.py --predictions` asks JAX for two), each
  calibrator's intervals go there as soon as its confidences exist, and compute while the host
  fits and traces the rest of the report on the first device (its waits do not wait for them);
* otherwise they are dispatched last (`add_intervals`), after everything the host waits for,
  the longest metric first, so the device starts on them while the host traces the others.

The same programs on the same keys and inputs wherever they run: the same numbers, to the bit
(XLA:CPU compiles one program the same for either device; checked on the bench's digits and
50,000 x 1,000 reports, and tested).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax

from calib_jax import metrics, program_store

INTERVAL_KEYS = ("ece", "smooth_ece", "aurc")
# Longest first (see the module docstring); a permutation of `INTERVAL_KEYS`.
_DISPATCH_ORDER = ("smooth_ece", "aurc", "ece")

# The intervals whose `value` is the test split's own number, to the bit, so the bootstrap
# takes it from there instead of compiling and running the metric again on the data (smooth
# ECE: ~1 s of compiling). Not ECE: its number is taken on the [N, C] probabilities, the
# interval's on `top_label_rows` (the last bit differs). Checked on the bench's digits and
# 50,000 x 1,000 reports; tested.
VALUES_FROM_TEST = ("smooth_ece", "aurc")


@functools.lru_cache(maxsize=None)
def interval_metric(name: str, num_bins: int) -> Callable:
  """The metric `name` of `INTERVAL_KEYS` of one calibrator's `(confidence [N], correct [N])`.
  One object per (name, bins): the bootstrap's compiled program, keyed by the function, is
  built once per report and reused by every calibrator. (A version vmapped over the
  calibrators ran slower on XLA:CPU: smooth ECE's bandwidth search batched.)"""
  if name == "ece":
    return functools.partial(_top_label_ece, num_bins=num_bins)
  if name == "smooth_ece":  # `bootstrap` batches this one's bandwidth searches
    return metrics.top_label_smooth_ece
  return metrics.aurc


@functools.partial(program_store.jit, static_argnames="num_bins")
def _top_label_ece(confidence: jax.Array, correct: jax.Array, num_bins: int) -> jax.Array:
  """`metrics.ece` of the top-label rows of `(confidence, correct)` (a named function, not a
  lambda: the program store keys a bootstrap's program by its metric's name)."""
  return metrics.ece(*metrics.top_label_rows(confidence, correct), num_bins)


@functools.partial(program_store.jit, static_argnames=("seed", "count"))
def interval_keys(seed: int, count: int = len(INTERVAL_KEYS)) -> list[jax.Array]:
  """`list(jax.random.split(jax.random.key(seed), count))`, one key per interval (the same
  for every calibrator, so every calibrator gets the same resamples), as one program (called
  op by op they were four dispatches); threefry is integer arithmetic, so the same bits. The
  seed is static, as `jax.random.key` takes a Python int of any size, not a traced int32."""
  return list(jax.random.split(jax.random.key(seed), count))


def spare_device() -> jax.Device | None:
  """A CPU device of its own for the intervals: this process's last, when the default backend
  is the CPU and JAX was given more than one (`jax_num_cpu_devices`); else None (on a GPU the
  intervals take little of the device's time, and a CPU device beside it would be slower)."""
  if jax.default_backend() != "cpu":
    return None
  devices = jax.local_devices()  # this process's own (a multi-process run lists all)
  return devices[-1] if len(devices) > 1 else None


def _bootstrap(metric: str, confidence: jax.Array, correct: jax.Array,
               test: Mapping[str, jax.Array], num_bins: int, bootstrap_samples: int,
               key: jax.Array) -> dict[str, jax.Array]:
  """The interval of `metric` of one calibrator's test `(confidence, correct)` (`test`: its
  test numbers), dispatched where the inputs are."""
  return metrics.bootstrap(interval_metric(metric, num_bins), confidence, correct,
                           num_samples=bootstrap_samples, key=key,
                           value=test[metric] if metric in VALUES_FROM_TEST else None)


def dispatch(confidence: jax.Array, correct: jax.Array, test: Mapping[str, jax.Array],
             num_bins: int, bootstrap_samples: int, keys: Mapping[str, jax.Array],
             device: jax.Device | None = None) -> dict[str, dict[str, jax.Array]]:
  """One calibrator's intervals of `INTERVAL_KEYS` from its test `(confidence, correct)` `[N]`
  (`test`: its test numbers, whose `VALUES_FROM_TEST` are the intervals' values; `keys`: one
  per interval), dispatched on `device` (None: where the inputs are), not awaited."""
  if device is not None:  # only the [N] inputs and the keys move; the values follow them
    confidence, correct, keys = jax.device_put((confidence, correct, dict(keys)), device)
  out = {metric: _bootstrap(metric, confidence, correct, test, num_bins, bootstrap_samples,
                            keys[metric])
         for metric in _DISPATCH_ORDER}
  return {metric: out[metric] for metric in INTERVAL_KEYS}  # the report's order


def add_intervals(results: dict[str, Any],
                  resampled: Mapping[str, tuple[jax.Array, jax.Array]], num_bins: int,
                  bootstrap_samples: int, seed: int) -> None:
  """Dispatches the intervals of every calibrator in `resampled` that has none yet into
  `results` (`calibrators.<name>.test.intervals`), on the default device, last (see the module
  docstring): metric by metric, the longest first, so the device starts on it while the host
  traces the next metric's program instead of idling through each trace."""
  pending = {name: pair for name, pair in resampled.items()
             if "intervals" not in results["calibrators"][name]["test"]}
  if not bootstrap_samples or not pending:
    return
  keys = dict(zip(INTERVAL_KEYS, interval_keys(seed)))
  tests = {name: results["calibrators"][name]["test"] for name in pending}
  intervals = {name: {} for name in pending}
  for metric in _DISPATCH_ORDER:
    for name, (confidence, correct) in pending.items():
      intervals[name][metric] = _bootstrap(metric, confidence, correct, tests[name], num_bins,
                                           bootstrap_samples, keys[metric])
  for name in pending:
    tests[name]["intervals"] = {metric: intervals[name][metric] for metric in INTERVAL_KEYS}
