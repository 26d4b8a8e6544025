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
import argparse
import os
import platform
import statistics
import time

import jax
import numpy as np

from calib_jax import posthoc


def _data(n: int, c: int, seed: int = 0):
  """Overconfident logits (labels drawn from softmax(z / 2)), built in chunks."""
  rng = np.random.default_rng(seed)
  logits = np.empty((n, c), np.float32)
  labels = np.empty(n, np.int32)
  step = max(1, (1 << 22) // c)
  for lo in range(0, n, step):
    hi = min(n, lo + step)
    z = rng.standard_normal((hi - lo, c), dtype=np.float32) * 4.0
    p = np.exp(z / 2 - (z / 2).max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    logits[lo:hi] = z
    labels[lo:hi] = (p.cumsum(1) > rng.random((hi - lo, 1))).argmax(1)
  return logits, labels


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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1e5,1e6", help="comma-separated N")
  parser.add_argument("--classes", default="10,100", help="comma-separated C")
  parser.add_argument("--repeats", type=int, default=1,
                      help="timed fits after the first; 0: the first only (fit = nan)")
  parser.add_argument("--max-iter", type=int, default=200, help="L-BFGS steps at most")
  parser.add_argument("--ovr-max", type=float, default=1e7, help="largest N*C for isotonic_ovr")
  parser.add_argument("--methods", default="vector,matrix,dirichlet,isotonic,isotonic_ovr",
                      help="comma-separated calibrator names to time")
  parser.add_argument("--no-sklearn", action="store_true")
  parser.add_argument("--quick", action="store_true", help="N = 1e4, C = 10")
  args = parser.parse_args()
  repeats_run = args.repeats > 0
  sizes = [10_000] if args.quick else [int(float(s)) for s in args.sizes.split(",")]
  classes = [10] if args.quick else [int(c) for c in args.classes.split(",")]
  print(f"# jax {jax.__version__} on {jax.devices()[0].platform} ({platform.processor() or '?'},"
        f" {os.cpu_count()} cores); seconds; first = compile + one fit")
  print(f"{'N':>9} {'C':>5} {'method':<14} {'first':>8} {'fit':>8}  detail")
  for n in sizes:
    for c in classes:
      logits, labels = _data(n, c)
      runs = [("vector", {"max_iter": args.max_iter}),
              ("matrix", {"max_iter": args.max_iter}),
              ("dirichlet", {"max_iter": args.max_iter}),
              ("isotonic", {})]
      if n * c <= args.ovr_max:
        runs.append(("isotonic_ovr", {}))
      runs = [(name, kw) for name, kw in runs if name in args.methods.split(",")]
      iso_time = float("nan")
      for name, kw in runs:
        first, fit, cal = _time(lambda: posthoc.fit_calibrator(name, logits, labels, **kw),
                                args.repeats)
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
      if not args.no_sklearn:
        from sklearn.isotonic import IsotonicRegression  # pylint: disable=import-outside-toplevel
        z = logits.astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        conf, correct = p.max(1), (p.argmax(1) == labels).astype(np.float64)
        first, fit, _ = _time(
            lambda: IsotonicRegression(out_of_bounds="clip").fit(conf, correct), args.repeats)
        sk_time = fit if repeats_run else first
        print(f"{n:>9} {c:>5} {'sklearn iso':<14} {first:>8.3f} {fit:>8.3f}  calib_jax isotonic "
              f"/ sklearn = {iso_time / sk_time:.2f}", flush=True)


if __name__ == "__main__":
  main()
