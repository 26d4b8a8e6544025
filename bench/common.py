"""What the speed scripts of bench/ share: the synthetic probabilities, the timer, the machine
line (CPU, versions and load average) and the CPU's model and L3, numpy's binned ECE and the logits of the post-hoc fits
(not a program)."""
import os
import platform
import statistics
import time

import jax
import numpy as np

NUM_BINS = 15


def _chunked(n: int, c: int, label_dtype, elements: int, seed: int, make_rows):
  """An `[n, c]` float32 array and `[n]` labels built `elements` entries at a time (bounds peak
  memory): `make_rows(rng, rows) -> (values [rows, c], labels [rows])`."""
  rng = np.random.default_rng(seed)
  values = np.empty((n, c), np.float32)
  labels = np.empty(n, label_dtype)
  step = max(1, elements // c)
  for lo in range(0, n, step):
    hi = min(n, lo + step)
    values[lo:hi], labels[lo:hi] = make_rows(rng, hi - lo)
  return values, labels


def probabilities(n: int, c: int, seed: int = 0):
  """Softmax of random logits `3·N(0, 1)`; labels agree with the argmax 70 % of the time."""
  def rows(rng, m):
    z = rng.standard_normal((m, c), dtype=np.float32) * 3.0
    z -= z.max(1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(1, keepdims=True)
    agree = rng.random(m) < 0.7
    return z, np.where(agree, z.argmax(1), rng.integers(0, c, m))

  return _chunked(n, c, np.int64, 1 << 24, seed, rows)


def median_seconds(fn, repeats: int, compiled: bool = True) -> float:
  """Median seconds of `repeats` runs after a warm-up (compilation for jitted functions).

  Uncompiled baselines whose first run already takes > 5 s are timed by that run alone.
  """
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  if not compiled and first > 5.0:
    return first
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def cpu_models() -> list[str]:
  """The model name of each logical core, from /proc/cpuinfo (empty where not readable)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
  except OSError:
    return []


def l3_size() -> str:
  """The L3 cache's size as sysfs reports it (`307200K`), '?' where not readable."""
  try:
    with open("/sys/devices/system/cpu/cpu0/cache/index3/size", encoding="utf-8") as f:
      return f.read().strip()
  except OSError:
    return "?"


def machine() -> str:
  names = cpu_models()
  cpu = (f"{names[0]} x{len(names)} logical cores" if names
         else platform.processor() or "unknown CPU")
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return (f"{cpu}; jax {jax.__version__} ({jax.default_backend()}), numpy {np.__version__}; "
          f"1-min load average at start {load:.1f}")


def np_ece(p, y):
  conf, correct = p.max(1), p.argmax(1) == y
  b = np.clip(np.ceil(conf * NUM_BINS).astype(np.int64) - 1, 0, NUM_BINS - 1)
  gap = np.bincount(b, correct, NUM_BINS) - np.bincount(b, conf, NUM_BINS)
  return np.abs(gap).sum() / len(y)


def overconfident_logits(n: int, c: int, seed: int = 0):
  """Overconfident logits `4·N(0, 1)` (labels drawn from softmax(z / 2))."""
  def rows(rng, m):
    z = rng.standard_normal((m, c), dtype=np.float32) * 4.0
    p = np.exp(z / 2 - (z / 2).max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return z, (p.cumsum(1) > rng.random((m, 1))).argmax(1)

  return _chunked(n, c, np.int32, 1 << 22, seed, rows)
