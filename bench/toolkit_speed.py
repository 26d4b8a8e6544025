"""Speed of the calibration toolkit metrics: smooth ECE and 1000-resample bootstrap ECE (not a test).

For each N and C: one read of the probabilities (the memory-bound floor, as in
bench/metrics_speed.py), `metrics.smooth_ece` (automatic bandwidth), the bootstrap of
`metrics.ece` resampling the `[N, C]` probabilities, and the same bootstrap on the top-label
statistics (`[conf, 0]` rows, labels 0/1: the same ECE from 2 columns); with relplot installed
(a `bench` extra, not a test dependency) its `smECE` on the same confidences, and numpy's
bootstrap of the ECE. Median seconds of --repeats runs after a warm-up (compilation
excluded); the loop baselines are timed on 20 (numpy) or 2 (relplot) resamples and scaled.

  .venv/bin/python bench/toolkit_speed.py --sizes 1e5,1e6 --classes 10,1000
  .venv/bin/python bench/toolkit_speed.py --quick
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import metrics
from metrics_speed import _machine, _probs, _time, np_ece  # bench/ is the script's folder


def _top_label(p, y):
  conf, correct = metrics.confidence_and_correct(p, y)
  return jnp.stack([conf, jnp.zeros_like(conf)], axis=1), jnp.where(correct, 0, 1)


def _np_bootstrap_ece(conf, correct, resamples, rng):
  n = conf.shape[0]
  values = []
  for _ in range(resamples):
    i = rng.integers(0, n, n)
    values.append(np_ece(np.stack([conf[i], np.zeros(n, np.float32)], 1),
                         np.where(correct[i], 0, 1)))
  return np.percentile(values, [2.5, 97.5])


def _scaled(fn, resamples, full):
  """Seconds of `fn(resamples)`, scaled to `full` resamples."""
  start = time.perf_counter()
  fn(resamples)
  return (time.perf_counter() - start) * full / resamples


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes", default="1e5,1e6")
  parser.add_argument("--classes", default="10,1000")
  parser.add_argument("--resamples", type=int, default=1000)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--full-bootstrap-max-gb", type=float, default=0.5,
                      help="skip the [N, C] bootstrap when the probabilities exceed this")
  parser.add_argument("--quick", action="store_true", help="N=1e4, C=10, 100 resamples")
  args = parser.parse_args()
  if args.quick:
    args.sizes, args.classes, args.resamples, args.repeats = "1e4", "10", 100, 1
  try:
    import relplot  # pylint: disable=import-outside-toplevel
  except ImportError:
    relplot = None
  print(f"machine: {_machine()}; relplot {'installed' if relplot else 'not installed'}")
  print("| C | N | method | seconds | note |")
  print("|---|---|---|---|---|")
  key = jax.random.key(0)
  for c in (int(x) for x in args.classes.split(",")):
    for n in (int(float(x)) for x in args.sizes.split(",")):
      p_np, y_np = _probs(n, c)
      p, y = jnp.asarray(p_np), jnp.asarray(y_np.astype(np.int32))
      gb = n * c * 4 / 1e9
      rows = []
      read = _time(lambda f=jax.jit(jnp.sum): f(p), args.repeats)
      rows.append(("read (XLA sum of probs)", read, "memory-bound floor"))
      t_smooth = _time(lambda: metrics.smooth_ece(p, y), args.repeats)
      rows.append(("calib_jax smooth_ece", t_smooth, f"{t_smooth / read:.1f}x read"))
      if gb <= args.full_bootstrap_max_gb:
        t = _time(lambda: metrics.bootstrap(metrics.ece, p, y, num_samples=args.resamples,
                                            key=key)["upper"], 1)
        rows.append((f"calib_jax bootstrap ece [N, C], {args.resamples} resamples", t, ""))
      else:
        rows.append(("calib_jax bootstrap ece [N, C]", float("nan"),
                     f"skipped: {gb:.1f} GB per resample > --full-bootstrap-max-gb"))
      top = jax.jit(_top_label)

      def top_label_bootstrap():
        two, labels = top(p, y)
        return metrics.bootstrap(metrics.ece, two, labels, num_samples=args.resamples,
                                 key=key)["upper"]

      t_boot = _time(top_label_bootstrap, 1)
      rows.append((f"calib_jax bootstrap ece top-label, {args.resamples} resamples", t_boot,
                   "incl. max/argmax of [N, C]"))
      conf, correct = p_np.max(1), p_np.argmax(1) == y_np
      rng = np.random.default_rng(0)
      t = _scaled(lambda r: _np_bootstrap_ece(conf, correct, r, rng), 20, args.resamples)
      rows.append((f"numpy bootstrap ece top-label, {args.resamples} resamples", t,
                   f"from 20 resamples; calib_jax {t / t_boot:.1f}x faster"))
      if relplot is not None:
        f64, y64 = conf.astype(np.float64), correct.astype(np.float64)
        t = _time(lambda: relplot.smECE(f64, y64), args.repeats, compiled=False)
        got, want = float(metrics.smooth_ece(p, y)), float(relplot.smECE(f64, y64))
        rows.append(("relplot smECE (from conf, correct)", t,
                     f"calib_jax {t / t_smooth:.1f}x faster; |Δ| = {abs(got - want):.1e}"))
        t = _scaled(lambda r: [relplot.smECE(*(a[i] for a in (f64, y64)))
                               for i in np.random.default_rng(1).integers(0, n, (r, n))],
                    2, args.resamples)
        rows.append((f"relplot smECE bootstrap, {args.resamples} resamples", t,
                     "from 2 resamples"))
      for name, t, note in rows:
        print(f"| {c} | {n:.0e} | {name} | {t:.4f} | {note} |", flush=True)
      del p, y, p_np, y_np


if __name__ == "__main__":
  main()
