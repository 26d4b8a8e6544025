"""Speed of fitting the post-hoc calibrators (not a test): vector and matrix scaling, isotonic
regression (top-label, and one-vs-rest where N·C ≤ --ovr-max), vs scikit-learn's
IsotonicRegression.

Each fit runs once to compile (the "first" column, compilation included) and then
`--repeats` times (median, the "fit" column). The L-BFGS fits report their steps, so seconds per
step compare across sizes. scikit-learn gets the top-label confidences and correctness
precomputed in float64 (calib_jax's time includes its softmax from the logits), i.e. the
comparison favours scikit-learn slightly.

  .venv/bin/python bench/posthoc_speed.py --sizes 1e5,1e6 --classes 10,100
  .venv/bin/python bench/posthoc_speed.py --quick            # seconds, for a smoke run
"""
import os
import platform
import statistics
import time

from absl import app, flags
import jax
import numpy as np

from calib_jax import posthoc
from common import overconfident_logits  # bench/ is the script's folder

_SIZES = flags.DEFINE_string("sizes", "1e5,1e6", "comma-separated N")
_CLASSES = flags.DEFINE_string("classes", "10,100", "comma-separated C")
_REPEATS = flags.DEFINE_integer("repeats", 1,
                                "timed fits after the first; 0: the first only (fit = nan)")
_MAX_ITER = flags.DEFINE_integer("max-iter", 200, "L-BFGS steps at most")
_OVR_MAX = flags.DEFINE_float("ovr-max", 1e7, "largest N*C for isotonic_ovr")
_METHODS = flags.DEFINE_string("methods", "vector,matrix,dirichlet,isotonic,isotonic_ovr",
                               "comma-separated calibrator names to time")
_NO_SKLEARN = flags.DEFINE_boolean("no-sklearn", False, "leave out scikit-learn")
_QUICK = flags.DEFINE_boolean("quick", False, "N = 1e4, C = 10")


def _time(fn, repeats: int):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, statistics.median(times) if times else float("nan"), out


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  repeats_run = _REPEATS.value > 0
  sizes = [10_000] if _QUICK.value else [int(float(s)) for s in _SIZES.value.split(",")]
  classes = [10] if _QUICK.value else [int(c) for c in _CLASSES.value.split(",")]
  print(f"# jax {jax.__version__} on {jax.devices()[0].platform} ({platform.processor() or '?'},"
        f" {os.cpu_count()} cores); seconds; first = compile + one fit")
  print(f"{'N':>9} {'C':>5} {'method':<14} {'first':>8} {'fit':>8}  detail")
  for n in sizes:
    for c in classes:
      logits, labels = overconfident_logits(n, c)
      runs = [("vector", {"max_iter": _MAX_ITER.value}),
              ("matrix", {"max_iter": _MAX_ITER.value}),
              ("dirichlet", {"max_iter": _MAX_ITER.value}),
              ("isotonic", {})]
      if n * c <= _OVR_MAX.value:
        runs.append(("isotonic_ovr", {}))
      runs = [(name, kw) for name, kw in runs if name in _METHODS.value.split(",")]
      iso_time = float("nan")
      for name, kw in runs:
        first, fit, cal = _time(lambda: posthoc.fit_calibrator(name, logits, labels, **kw),
                                _REPEATS.value)
        if name == "isotonic":
          iso_time = fit if repeats_run else first
        detail = ""
        if "steps" in cal.params:
          steps = int(cal.steps)
          per_step = (fit if repeats_run else first) / max(steps, 1)
          detail = f"{steps} L-BFGS steps, {per_step * 1e3:.1f} ms/step"
        elif "rounds" in cal.params:
          detail = f"PAV rounds {np.max(np.asarray(cal.rounds))}"
        print(f"{n:>9} {c:>5} {name:<14} {first:>8.3f} {fit:>8.3f}  {detail}", flush=True)
      if not _NO_SKLEARN.value:
        from sklearn.isotonic import IsotonicRegression  # pylint: disable=import-outside-toplevel
        z = logits.astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        conf, correct = p.max(1), (p.argmax(1) == labels).astype(np.float64)
        first, fit, _ = _time(
            lambda: IsotonicRegression(out_of_bounds="clip").fit(conf, correct), _REPEATS.value)
        sk_time = fit if repeats_run else first
        print(f"{n:>9} {c:>5} {'sklearn iso':<14} {first:>8.3f} {fit:>8.3f}  calib_jax isotonic "
              f"/ sklearn = {iso_time / sk_time:.2f}", flush=True)


if __name__ == "__main__":
  app.run(main)
