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

Rank metrics (`--parts=rank`), each against one read of `[N, C]` (issue 46's goal: within 10×):
`metrics.aece` and `metrics.classwise_ece` on `(probs, labels)`; `metrics.aurc` as the report
calls it, on the top-label confidences and correctness `[N]` (computed beforehand, untimed),
and from `[N, C]` (the max/argmax and the sort in one jitted call); `metrics.selective_summary`
on `[N]`; AECE and the selective summary as two calls and as `metrics.rank_summary` (one
sort); `metrics.ece` beside them for scale.

Bootstrap CPU time (`--parts=bootcpu`, `--bootcpu-sizes`): CPU seconds of this process (every
thread's; `time.process_time`, median of `--repeats` after a warm-up) of
`metrics.bootstrap(metrics.top_label_smooth_ece, confidence, correct)` and of
`metrics.bootstrap(metrics.aurc, confidence, correct)` at `--resamples` resamples, on
confidences `U(0.3, 1)` with `correct ~ Bernoulli(confidence)` (calibrated: smooth ECE's
search reaches the fine grid) and on the same confidences rounded to 2 decimals (ties). CPU
seconds, not wall: on a shared machine they move less with the load. Before/after: run it in
each checkout.

Fits (`--fit-sizes`, `--fit-classes`; logits from `bench/posthoc_speed.py`'s generator):
`posthoc.fit_calibrator("vector" | "matrix" | "isotonic")` against torch-uncertainty's
`VectorScaler` / `MatrixScaler` (L-BFGS, 100 iterations, as shipped) / `IsotonicRegressionScaler`
and scikit-learn's `IsotonicRegression` on the top-label confidences. One-vs-rest isotonic
(`--parts=ovr`, `--ovr-sizes` at `--ovr-classes`): `posthoc.isotonic.fit_isotonic_ovr` (what
`fit_calibrator("isotonic_ovr")` fits before compressing the tables) from the logits
against one scikit-learn `IsotonicRegression(out_of_bounds="clip")` per class on precomputed
float64 probabilities (what `CalibratedClassifierCV(method="isotonic")` fits).

Median seconds of `--repeats` runs after a warm-up (compilation excluded). The reference
libraries are a `bench` extra (never imported by the tests); a missing one is reported and
skipped. The machine's load average is printed with every table row.

  .venv/bin/python bench/toolkit_speed.py --sizes=1e5,1e6 --classes=10,1000
  .venv/bin/python bench/toolkit_speed.py --parts=rank --sizes=1e5,1e6 --classes=10 --repeats=5
  .venv/bin/python bench/toolkit_speed.py --parts=ovr --ovr-sizes=1e4,2.5e4
  .venv/bin/python bench/toolkit_speed.py --parts=bootcpu --bootcpu-sizes=540,25000
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
from calib_jax.posthoc import isotonic
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
_OVR_SIZES = flags.DEFINE_string("ovr-sizes", "1e4,2.5e4", "comma-separated N of the "
                                  "one-vs-rest isotonic fits")
_OVR_CLASSES = flags.DEFINE_integer("ovr-classes", 1000, "C of the one-vs-rest isotonic fits")
_PARTS = flags.DEFINE_string("parts", "smooth,bootstrap,fit", "comma-separated parts to run: "
                             "smooth, bootstrap, fit, rank, ovr, bootcpu")
_BOOTCPU_SIZES = flags.DEFINE_string("bootcpu-sizes", "540,25000", "comma-separated N of the "
                                     "bootstrap CPU-time part")
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
  size = f"{n:.0e}" if float(f"{n:.0e}") == n else f"{n:,}"
  print(f"| {c} | {size} | {method} | {seconds:.4f} | {ratio} | {_load()} | {note} |",
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


def _rank_part(c, n, repeats):
  p_np, y_np = probabilities(n, c)
  p, y = jnp.asarray(p_np), jnp.asarray(y_np.astype(np.int32))
  read = median_seconds(lambda f=jax.jit(jnp.sum): f(p), repeats)
  _row(c, n, "read (XLA sum of probs)", read, note="memory-bound floor")
  conf, correct = jax.block_until_ready(jax.jit(metrics.confidence_and_correct)(p, y))
  aurc_of_probs = jax.jit(lambda p, y: metrics.aurc(*metrics.confidence_and_correct(p, y)))
  for name, fn in (("ece(probs, labels)", lambda: metrics.ece(p, y)),
                   ("aece(probs, labels)", lambda: metrics.aece(p, y)),
                   ("aurc(confidence, correct)", lambda: metrics.aurc(conf, correct)),
                   ("aurc of [N, C] (max/argmax + sort, one jit)", lambda: aurc_of_probs(p, y)),
                   ("classwise_ece(probs, labels)", lambda: metrics.classwise_ece(p, y)),
                   ("selective_summary(confidence, correct)",
                    lambda: metrics.selective_summary(conf, correct)),
                   ("aece + selective_summary, two calls",
                    lambda: (metrics.aece(p, y), metrics.selective_summary(conf, correct))),
                   ("rank_summary(confidence, correct): both, one sort",
                    lambda: metrics.rank_summary(conf, correct))):
    t = median_seconds(fn, repeats)
    _row(c, n, f"calib_jax {name}", t, note=f"{t / read:.1f}x read")


def _cpu_seconds(fn, repeats: int) -> float:
  """Median CPU seconds of this process (all threads) over `repeats` runs after a warm-up."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.process_time()
    jax.block_until_ready(fn())
    times.append(time.process_time() - start)
  return float(np.median(times))


def _bootcpu_part(n, resamples, repeats):
  rng = np.random.default_rng(0)
  uniform = rng.uniform(0.3, 1.0, n).astype(np.float32)
  correct = jnp.asarray(rng.uniform(size=n) < uniform)
  for data, conf in (("U(0.3, 1)", uniform), ("rounded to 0.01", np.round(uniform, 2))):
    conf = jnp.asarray(conf.astype(np.float32))
    for name, metric in (("top_label_smooth_ece", metrics.top_label_smooth_ece),
                         ("aurc", metrics.aurc)):
      t = _cpu_seconds(lambda m=metric, x=conf: metrics.bootstrap(
          m, x, correct, num_samples=resamples, key=jax.random.key(0), value=0.0), repeats)
      _row("-", n, f"bootstrap({name}), {resamples} resamples, CPU s", t, note=data)


def _ovr_part(n, c, repeats, sklearn_isotonic):
  logits, labels = overconfident_logits(n, c)
  ours = median_seconds(lambda: isotonic.fit_isotonic_ovr(logits, labels)["fitted"], repeats)
  _row(c, n, "calib_jax posthoc.isotonic.fit_isotonic_ovr", ours, note="from the logits")
  if sklearn_isotonic is not None:
    z = logits.astype(np.float64)
    q = np.exp(z - z.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    targets = labels[:, None] == np.arange(c)

    def sklearn_ovr():
      return [sklearn_isotonic(out_of_bounds="clip").fit(q[:, k], targets[:, k])
              for k in range(c)]

    t = median_seconds(sklearn_ovr, repeats, compiled=False)
    _row(c, n, f"scikit-learn IsotonicRegression.fit x {c} classes (float64)", t, ours,
         "probabilities precomputed")


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
  if "rank" in parts:
    for c in (int(x) for x in classes.split(",")):
      for n in (int(float(x)) for x in sizes.split(",")):
        _rank_part(c, n, repeats)
  if "bootcpu" in parts:
    for n in (int(float(x)) for x in _BOOTCPU_SIZES.value.split(",")):
      _bootcpu_part(n, resamples, repeats)
  if "ovr" in parts:
    ovr_sizes = "1e3" if _QUICK.value else _OVR_SIZES.value
    ovr_classes = 10 if _QUICK.value else _OVR_CLASSES.value
    for n in (int(float(x)) for x in ovr_sizes.split(",")):
      _ovr_part(n, ovr_classes, repeats, sklearn_isotonic)
  if "fit" in parts:
    for c in (int(x) for x in fit_classes.split(",")):
      for n in (int(float(x)) for x in fit_sizes.split(",")):
        _fit_part(n, c, repeats, tu_post, torch, sklearn_isotonic)


if __name__ == "__main__":
  app.run(main)
