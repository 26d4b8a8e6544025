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
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import metrics
from common import machine, median_seconds, np_ece, probabilities  # bench/ is the script's folder

_SIZES = flags.DEFINE_string("sizes", "1e5,1e6", "comma-separated sample counts N")
_CLASSES = flags.DEFINE_string("classes", "10,1000", "comma-separated class counts C")
_RESAMPLES = flags.DEFINE_integer("resamples", 1000, "bootstrap resamples")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed runs after the warm-up (median)")
_FULL_MAX_GB = flags.DEFINE_float("full-bootstrap-max-gb", 0.5, "skip the [N, C] bootstrap "
                                  "when the probabilities exceed this")
_QUICK = flags.DEFINE_boolean("quick", False, "N=1e4, C=10, 100 resamples")


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


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  sizes, classes, resamples, repeats = (_SIZES.value, _CLASSES.value, _RESAMPLES.value,
                                        _REPEATS.value)
  if _QUICK.value:
    sizes, classes, resamples, repeats = "1e4", "10", 100, 1
  try:
    import relplot  # pylint: disable=import-outside-toplevel
  except ImportError:
    relplot = None
  print(f"machine: {machine()}; relplot {'installed' if relplot else 'not installed'}")
  print("| C | N | method | seconds | note |")
  print("|---|---|---|---|---|")
  key = jax.random.key(0)
  for c in (int(x) for x in classes.split(",")):
    for n in (int(float(x)) for x in sizes.split(",")):
      p_np, y_np = probabilities(n, c)
      p, y = jnp.asarray(p_np), jnp.asarray(y_np.astype(np.int32))
      gb = n * c * 4 / 1e9
      rows = []
      read = median_seconds(lambda f=jax.jit(jnp.sum): f(p), repeats)
      rows.append(("read (XLA sum of probs)", read, "memory-bound floor"))
      t_smooth = median_seconds(lambda: metrics.smooth_ece(p, y), repeats)
      rows.append(("calib_jax smooth_ece", t_smooth, f"{t_smooth / read:.1f}x read"))
      if gb <= _FULL_MAX_GB.value:
        t = median_seconds(lambda: metrics.bootstrap(metrics.ece, p, y, num_samples=resamples,
                                            key=key)["upper"], 1)
        rows.append((f"calib_jax bootstrap ece [N, C], {resamples} resamples", t, ""))
      else:
        rows.append(("calib_jax bootstrap ece [N, C]", float("nan"),
                     f"skipped: {gb:.1f} GB per resample > --full-bootstrap-max-gb"))
      top = jax.jit(_top_label)

      def top_label_bootstrap():
        two, labels = top(p, y)
        return metrics.bootstrap(metrics.ece, two, labels, num_samples=resamples,
                                 key=key)["upper"]

      t_boot = median_seconds(top_label_bootstrap, 1)
      rows.append((f"calib_jax bootstrap ece top-label, {resamples} resamples", t_boot,
                   "incl. max/argmax of [N, C]"))
      conf, correct = p_np.max(1), p_np.argmax(1) == y_np
      rng = np.random.default_rng(0)
      t = _scaled(lambda r: _np_bootstrap_ece(conf, correct, r, rng), 20, resamples)
      rows.append((f"numpy bootstrap ece top-label, {resamples} resamples", t,
                   f"from 20 resamples; calib_jax {t / t_boot:.1f}x faster"))
      if relplot is not None:
        f64, y64 = conf.astype(np.float64), correct.astype(np.float64)
        t = median_seconds(lambda: relplot.smECE(f64, y64), repeats, compiled=False)
        got, want = float(metrics.smooth_ece(p, y)), float(relplot.smECE(f64, y64))
        rows.append(("relplot smECE (from conf, correct)", t,
                     f"calib_jax {t / t_smooth:.1f}x faster; |Δ| = {abs(got - want):.1e}"))
        t = _scaled(lambda r: [relplot.smECE(*(a[i] for a in (f64, y64)))
                               for i in np.random.default_rng(1).integers(0, n, (r, n))],
                    2, resamples)
        rows.append((f"relplot smECE bootstrap, {resamples} resamples", t,
                     "from 2 resamples"))
      for name, t, note in rows:
        print(f"| {c} | {n:.0e} | {name} | {t:.4f} | {note} |", flush=True)
      del p, y, p_np, y_np


if __name__ == "__main__":
  app.run(main)
