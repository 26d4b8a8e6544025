"""Speed of the calibration toolkit against relplot and torch-uncertainty, side by side in one
process (not a test): smooth ECE and a 1000-resample bootstrap ECE, fitting vector / matrix
scaling and isotonic regression.

Metrics, for each N and C (float32 probabilities, `bench/common.py`):
* one read of the probabilities (a jitted XLA sum: the memory-bound floor);
* smooth ECE: `metrics.smooth_ece` on `[N, C]`, and `metrics.top_label_smooth_ece` on the
  confidences and correctness `[N]`; relplot's `smECE` on the float64 confidences and
  correctness (its input; the max/argmax is not timed for it), its ratio against
  `top_label_smooth_ece` (the same inputs) and, in the note, against `smooth_ece`;
  torch-uncertainty's `SmoothCalibrationError(kernel_type="reflected")` (relplot's kernel) on
  `[N, C]`;
* bootstrap ECE, `--resamples` resamples: `metrics.bootstrap(metrics.ece, probs, labels)`;
  torch-uncertainty's `CalibrationError` on resampled `[N, C]` tensors in a loop; numpy's
  binned ECE on resampled confidences in a loop; relplot's `smECE` on resampled confidences
  (a smooth-ECE bootstrap, relplot has none built in). The loops are timed on
  `--loop-resamples` resamples and scaled to `--resamples`.

Fits (`--fit-sizes`, `--fit-classes`; logits from `bench/posthoc_speed.py`'s generator):
`posthoc.fit_calibrator("vector" | "matrix" | "isotonic")` against torch-uncertainty's
`VectorScaler` / `MatrixScaler` (L-BFGS, 100 iterations, as shipped) / `IsotonicRegressionScaler`
and scikit-learn's `IsotonicRegression` on the top-label confidences.

Median seconds of `--repeats` runs after a warm-up (compilation excluded). The reference
libraries are a `bench` extra (never imported by the tests); a missing one is reported and
skipped. The machine's load average is printed with every table row.

  .venv/bin/python bench/toolkit_speed.py --sizes=1e5,1e6 --classes=10,1000
  .venv/bin/python bench/toolkit_speed.py --quick
"""
import importlib
import os
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import metrics
from calib_jax import posthoc
from common import (machine, median_seconds, np_ece, overconfident_logits,  # bench/: the script's folder
                    probabilities)

_SIZES = flags.DEFINE_string("sizes", "1e5,1e6", "comma-separated sample counts N")
_CLASSES = flags.DEFINE_string("classes", "10,1000", "comma-separated class counts C")
_RESAMPLES = flags.DEFINE_integer("resamples", 1000, "bootstrap resamples")
_LOOP_RESAMPLES = flags.DEFINE_integer("loop-resamples", 5, "resamples timed for the loop "
                                       "baselines (scaled to --resamples)")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed runs after the warm-up (median)")
_FIT_SIZES = flags.DEFINE_string("fit-sizes", "1e5,1e6", "comma-separated N of the fits")
_FIT_CLASSES = flags.DEFINE_string("fit-classes", "10,100", "comma-separated C of the fits")
_TORCH_MAX_GB = flags.DEFINE_float("torch-max-gb", 1.2, "skip torch-uncertainty's metrics above "
                                   "this many GB of probabilities (it copies them per resample)")
_PARTS = flags.DEFINE_string("parts", "smooth,bootstrap,fit", "comma-separated parts to run")
_QUICK = flags.DEFINE_boolean("quick", False, "N=1e4, C=10, 20 resamples, 1 repeat")


def _optional(name: str):
  try:
    return importlib.import_module(name)
  except ImportError as e:  # reported in the table
    print(f"{name} unavailable: {e}")
    return None


def _load() -> str:
  return f"{os.getloadavg()[0]:.1f}"


def _row(c, n, method, seconds, ours=None, note=""):
  ratio = "" if ours is None else f"{seconds / ours:.1f}x"
  print(f"| {c} | {n:.0e} | {method} | {seconds:.4f} | {ratio} | {_load()} | {note} |",
        flush=True)


def _scaled(fn, resamples: int, full: int) -> float:
  """Seconds of `fn(resamples)`, scaled to `full` resamples."""
  fn(1)  # warm-up (torch's first call allocates)
  start = time.perf_counter()
  fn(resamples)
  return (time.perf_counter() - start) * full / resamples


def _metrics_part(c, n, parts, resamples, loop_resamples, repeats, relplot, tu, torch):
  if n * c * 4 / 1e9 > _TORCH_MAX_GB.value:
    tu = None
    _row(c, n, "torch-uncertainty metrics", float("nan"), note="skipped: over --torch-max-gb")
  p_np, y_np = probabilities(n, c)
  p, y = jnp.asarray(p_np), jnp.asarray(y_np.astype(np.int32))
  read = median_seconds(lambda f=jax.jit(jnp.sum): f(p), repeats)
  _row(c, n, "read (XLA sum of probs)", read, note="memory-bound floor")
  conf, correct = p_np.max(1), p_np.argmax(1) == y_np
  f64, y64 = conf.astype(np.float64), correct.astype(np.float64)
  if "smooth" in parts:
    ours = median_seconds(lambda: metrics.smooth_ece(p, y), repeats)
    _row(c, n, "calib_jax smooth_ece", ours, note=f"{ours / read:.1f}x read")
    # The same inputs relplot is handed: the top-label confidences and correctness, `[N]`.
    conf_j, correct_j = jnp.asarray(conf), jnp.asarray(correct)
    from_conf = median_seconds(lambda: metrics.top_label_smooth_ece(conf_j, correct_j), repeats)
    _row(c, n, "calib_jax top_label_smooth_ece", from_conf, note="from conf, correct [N]")
    if relplot is not None:
      t = median_seconds(lambda: relplot.smECE(f64, y64), repeats, compiled=False)
      _row(c, n, "relplot smECE", t, from_conf,
           f"from conf, correct (float64); vs smooth_ece on [N, C]: {t / ours:.1f}x")
    if tu is not None:
      pt, yt = torch.from_numpy(p_np), torch.from_numpy(y_np)

      def tu_smooth():
        metric = tu.SmoothCalibrationError(kernel_type="reflected")
        metric.update(pt, yt)
        return metric.compute()

      t = median_seconds(tu_smooth, repeats, compiled=False)
      _row(c, n, "torch-uncertainty SmoothCalibrationError (reflected)", t, ours)
  if "bootstrap" in parts:
    key = jax.random.key(0)
    ours = median_seconds(lambda: metrics.bootstrap(metrics.ece, p, y, num_samples=resamples,
                                                    key=key)["upper"], 1)
    _row(c, n, f"calib_jax bootstrap(ece, probs, labels), {resamples} resamples", ours)
    rng = np.random.default_rng(0)

    def numpy_loop(r):
      for _ in range(r):
        i = rng.integers(0, n, n)
        np_ece(np.stack([conf[i], np.zeros(n, np.float32)], 1), np.where(correct[i], 0, 1))

    t = _scaled(numpy_loop, loop_resamples, resamples)
    _row(c, n, "numpy binned ECE loop (top-label)", t, ours, f"from {loop_resamples}")
    if tu is not None:
      pt, yt = torch.from_numpy(p_np), torch.from_numpy(y_np)

      def tu_loop(r):
        for _ in range(r):
          i = torch.randint(0, n, (n,))
          metric = tu.CalibrationError(task="multiclass", num_classes=c, num_bins=15)
          metric.update(pt[i], yt[i])
          metric.compute()

      t = _scaled(tu_loop, loop_resamples, resamples)
      _row(c, n, "torch-uncertainty CalibrationError loop", t, ours, f"from {loop_resamples}")
    if relplot is not None:
      def relplot_loop(r):
        for _ in range(r):
          i = rng.integers(0, n, n)
          relplot.smECE(f64[i], y64[i])

      t = _scaled(relplot_loop, max(1, loop_resamples // 2), resamples)
      _row(c, n, "relplot smECE loop (a smooth-ECE bootstrap)", t, ours,
           f"from {max(1, loop_resamples // 2)}")
      smooth_boot = median_seconds(lambda: metrics.bootstrap(
          metrics.smooth_ece, p, y, num_samples=resamples, key=key)["upper"], 1)
      _row(c, n, f"calib_jax bootstrap(smooth_ece), {resamples} resamples", smooth_boot,
           note=f"relplot loop {t / smooth_boot:.1f}x")


def _fit_part(n, c, repeats, tu, torch, sklearn_isotonic):
  logits, labels = overconfident_logits(n, c)
  fits = {}
  for name in ("vector", "matrix", "isotonic"):
    fits[name] = median_seconds(lambda name=name: posthoc.fit_calibrator(name, logits, labels),
                                repeats)
    _row(c, n, f"calib_jax fit_calibrator({name!r})", fits[name])
  if tu is not None:
    lt, yt = torch.from_numpy(logits), torch.from_numpy(labels.astype(np.int64))
    loader = [(lt, yt)]
    for name, make in (("vector", lambda: tu.VectorScaler(num_classes=c)),
                       ("matrix", lambda: tu.MatrixScaler(num_classes=c)),
                       ("isotonic", tu.IsotonicRegressionScaler)):
      t = median_seconds(lambda make=make: make().fit(loader, progress=False), repeats,
                         compiled=False)
      _row(c, n, f"torch-uncertainty {make().__class__.__name__}.fit", t, fits[name])
  if sklearn_isotonic is not None:
    z = logits.astype(np.float64)
    q = np.exp(z - z.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    conf, right = q.max(1), (q.argmax(1) == labels).astype(np.float64)
    t = median_seconds(lambda: sklearn_isotonic(out_of_bounds="clip").fit(conf, right), repeats,
                       compiled=False)
    _row(c, n, "scikit-learn IsotonicRegression.fit (top-label, float64)", t, fits["isotonic"],
         "confidences precomputed")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  sizes, classes, fit_sizes, fit_classes = (_SIZES.value, _CLASSES.value, _FIT_SIZES.value,
                                            _FIT_CLASSES.value)
  resamples, loop_resamples, repeats = _RESAMPLES.value, _LOOP_RESAMPLES.value, _REPEATS.value
  if _QUICK.value:
    sizes, classes, fit_sizes, fit_classes = "1e4", "10", "1e4", "10"
    resamples, loop_resamples, repeats = 20, 2, 1
  parts = set(_PARTS.value.split(","))
  relplot = _optional("relplot")
  torch = _optional("torch")
  tu_metrics = _optional("torch_uncertainty.metrics") if torch else None
  tu_post = _optional("torch_uncertainty.post_processing") if torch else None
  sklearn_isotonic = getattr(_optional("sklearn.isotonic"), "IsotonicRegression", None)
  if torch is not None:
    torch.set_num_threads(os.cpu_count() or 1)
  print(f"machine: {machine()}; torch {getattr(torch, '__version__', '-')}")
  print("| C | N | method | seconds | vs calib_jax | load | note |")
  print("|---|---|---|---|---|---|---|")
  if parts & {"smooth", "bootstrap"}:
    for c in (int(x) for x in classes.split(",")):
      for n in (int(float(x)) for x in sizes.split(",")):
        _metrics_part(c, n, parts, resamples, loop_resamples, repeats, relplot, tu_metrics,
                      torch)
  if "fit" in parts:
    for c in (int(x) for x in fit_classes.split(",")):
      for n in (int(float(x)) for x in fit_sizes.split(",")):
        _fit_part(n, c, repeats, tu_post, torch, sklearn_isotonic)


if __name__ == "__main__":
  app.run(main)
