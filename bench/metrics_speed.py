"""Speed of calib_jax metrics vs torchmetrics / torch-uncertainty / numpy (not a test).

ECE, AECE, classwise ECE and AURC (of the MSP) on N samples with C classes, all libraries in
one process on the same float32 probability array, median wall time of `--repeats` runs after
a warm-up (compilation excluded). "read" is one jitted XLA `sum` over the probability array:
the memory-bound floor for any metric that must look at every probability.

  .venv/bin/python bench/metrics_speed.py --sizes 1e5,1e6 --classes 10,1000
  .venv/bin/python bench/metrics_speed.py --quick            # seconds, for a smoke run

Sizes whose probability array exceeds --max-gb are skipped (1e7 x 1000 floats is 40 GB), and
the torch libraries are skipped above --torch-max-gb (they make several copies of the array).
"""
from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import metrics
from common import NUM_BINS, machine, median_seconds, np_ece, probabilities  # bench/ is the script's folder
_SIZES = flags.DEFINE_string("sizes", "1e5,1e6,1e7", "comma-separated sample counts N")
_CLASSES = flags.DEFINE_string("classes", "10,1000", "comma-separated class counts C")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed runs after the warm-up (median)")
_MAX_GB = flags.DEFINE_float("max-gb", 4.5,
                             "skip (N, C) whose float32 probabilities exceed this")
_TORCH_MAX_GB = flags.DEFINE_float("torch-max-gb", 1.2, "skip the torch libraries above this")
_TORCH_DEVICE = flags.DEFINE_string("torch-device", "cpu", "where the torch libraries run: cpu, "
                                    "or cuda on a GPU (each timed call ends with a synchronize)")
_NUMPY_MAX_GB = flags.DEFINE_float("numpy-max-gb", 1.2, "numpy's classwise ECE makes int32 "
                                   "copies of the whole array")
_BASELINE_CAP_S = flags.DEFINE_float("baseline-cap-s", 60.0, "skip a baseline at larger N "
                                     "once it took longer than this")
_SKIP = flags.DEFINE_string("skip", "", "comma-separated baselines to leave out, e.g. "
                            "'torch-uncertainty classwise'")
_NO_TORCH = flags.DEFINE_boolean("no-torch", False, "leave out torchmetrics and "
                                 "torch-uncertainty")
_NO_NUMPY = flags.DEFINE_boolean("no-numpy", False, "leave out the numpy baselines")
_QUICK = flags.DEFINE_boolean("quick", False, "N=1e4,1e5; C=10,100; 1 repeat")


# ------------------------------------------------------------------ numpy baselines
def np_aece(p, y):
  conf, correct = p.max(1), p.argmax(1) == y
  order = np.argsort(conf)
  conf, correct = conf[order], correct[order]
  q, r = divmod(len(y), NUM_BINS)
  starts = [g * (q + 1) if g <= r else r * (q + 1) + (g - r) * q for g in range(NUM_BINS)]
  gap = (np.add.reduceat(correct.astype(np.float64), starts)
         - np.add.reduceat(conf.astype(np.float64), starts))
  return np.abs(gap).sum() / len(y)


def np_classwise(p, y):
  n, c = p.shape
  b = np.clip(np.ceil(p * NUM_BINS).astype(np.int32) - 1, 0, NUM_BINS - 1)
  b += np.arange(c, dtype=np.int32) * NUM_BINS
  conf = np.bincount(b.ravel(), p.ravel(), c * NUM_BINS)
  hits = np.bincount(b[np.arange(n), y], minlength=c * NUM_BINS)
  return np.abs(hits - conf).sum() / (n * c)


def np_aurc(p, y):
  scores, err = p.max(1), p.argmax(1) != y
  order = np.argsort(-scores, kind="stable")
  s, e = scores[order], err[order]
  n = len(s)
  cum = np.cumsum(e)
  last = np.r_[s[1:] != s[:-1], True]
  first = np.r_[True, s[1:] != s[:-1]]
  idx = np.arange(n)
  start = np.maximum.accumulate(np.where(first, idx, 0))
  end = np.minimum.accumulate(np.where(last, idx, n - 1)[::-1])[::-1]
  before = cum[start] - e[start]
  tie = before + (idx - start + 1) * (cum[end] - before) / (end - start + 1)
  return np.mean(tie / (idx + 1))


# ------------------------------------------------------------------ torch baselines
def _torch_fns(p_np, y_np, c):
  import torch  # pylint: disable=import-outside-toplevel
  from torchmetrics.functional.classification import multiclass_calibration_error  # pylint: disable=import-outside-toplevel
  out = {}
  device = _TORCH_DEVICE.value
  p, y = torch.from_numpy(p_np).to(device), torch.from_numpy(y_np).to(device)

  def synchronised(fn):
    if device == "cpu":
      return fn
    return lambda: (fn(), torch.cuda.synchronize())[0]

  out["torchmetrics ece"] = synchronised(lambda: multiclass_calibration_error(
      p, y, num_classes=c, n_bins=NUM_BINS, norm="l1", validate_args=False))
  try:
    from torch_uncertainty import metrics as tu  # pylint: disable=import-outside-toplevel
  except ImportError as e:  # reported in the table
    print(f"torch-uncertainty unavailable: {e}")
    return out

  def run(metric_cls, **kw):
    def fn():
      metric = metric_cls(**kw).to(device)
      metric.update(p, y)
      return metric.compute()
    return synchronised(fn)

  out["torch-uncertainty aece"] = run(tu.AdaptiveCalibrationError, task="multiclass",
                                      num_classes=c, num_bins=NUM_BINS)
  out["torch-uncertainty classwise"] = run(tu.ClasswiseCalibrationError, num_classes=c,
                                           num_bins=NUM_BINS)
  out["torch-uncertainty aurc"] = run(tu.AURC)
  return out


# ------------------------------------------------------------------ calib_jax
def _jax_fns(p, y):
  def aurc_of_msp(p, y):
    return metrics.aurc(*metrics.confidence_and_correct(p, y))

  def all_four(p, y):
    return (metrics.ece(p, y), metrics.aece(p, y), metrics.classwise_ece(p, y),
            aurc_of_msp(p, y))

  c = p.shape[1]
  stream = jax.jit(lambda p, y: metrics.StreamingMetrics.init(c).update(probs=p, labels=y))
  aurc_fn, all_fn = jax.jit(aurc_of_msp), jax.jit(all_four)
  return {
      "calib_jax ece": lambda: metrics.ece(p, y),
      "calib_jax aece": lambda: metrics.aece(p, y),
      "calib_jax classwise": lambda: metrics.classwise_ece(p, y),
      "calib_jax aurc": lambda: aurc_fn(p, y),
      "calib_jax all-4 (one jit)": lambda: all_fn(p, y),
      "calib_jax streaming update (all metrics)": lambda: stream(p, y),
  }


def _skip_note(seconds: float, n: float) -> str:
  if np.isnan(seconds):
    return "skipped: --skip"
  return f"skipped: took {seconds:.0f} s at N={n:.0e}"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  sizes_text, classes_text, repeats = _SIZES.value, _CLASSES.value, _REPEATS.value
  if _QUICK.value:
    sizes_text, classes_text, repeats = "1e4,1e5", "10,100", 1
  sizes = [int(float(s)) for s in sizes_text.split(",")]
  classes = [int(c) for c in classes_text.split(",")]
  max_gb, baseline_cap_s = _MAX_GB.value, _BASELINE_CAP_S.value
  print(f"machine: {machine()}")
  too_slow = {}  # baseline name -> (seconds, N) of the run that exceeded --baseline-cap-s
  for name in filter(None, (x.strip() for x in _SKIP.value.split(","))):
    too_slow[name] = (float("nan"), float("nan"))
  print("| C | N | GB | " + "method | seconds | note |")
  print("|---|---|---|---|---|---|")
  for c in classes:
    for n in sizes:
      gb = n * c * 4 / 1e9
      if gb > max_gb:
        print(f"| {c} | {n:.0e} | {gb:.1f} | all | – | skipped: over --max-gb {max_gb} |")
        continue
      p_np, y_np = probabilities(n, c)
      p, y = jnp.asarray(p_np), jnp.asarray(y_np.astype(np.int32))
      rows = []
      read = median_seconds(lambda f=jax.jit(jnp.sum): f(p), repeats)
      rows.append(("read (XLA sum of probs)", read, "memory-bound floor"))
      for name, fn in _jax_fns(p, y).items():
        t = median_seconds(fn, repeats)
        rows.append((name, t, f"{t / read:.1f}x read"))
      jax_times = {name.split(" ", 1)[1]: t for name, t, _ in rows if name.startswith("calib_jax")}
      if not _NO_NUMPY.value and gb <= _NUMPY_MAX_GB.value:
        for name, fn in (("ece", np_ece), ("aece", np_aece), ("classwise", np_classwise),
                         ("aurc", np_aurc)):
          label = f"numpy {name}"
          if label in too_slow:
            rows.append((label, float("nan"), _skip_note(*too_slow[label])))
            continue
          t = median_seconds(lambda fn=fn: fn(p_np, y_np), repeats, compiled=False)
          if t > baseline_cap_s:
            too_slow[label] = (t, n)
          rows.append((label, t, f"calib_jax {t / jax_times[name]:.1f}x faster"))
      if not _NO_TORCH.value and gb <= _TORCH_MAX_GB.value:
        for name, fn in _torch_fns(p_np, y_np, c).items():
          if name in too_slow:
            rows.append((name, float("nan"), _skip_note(*too_slow[name])))
            continue
          t = median_seconds(fn, repeats, compiled=False)
          if t > baseline_cap_s:
            too_slow[name] = (t, n)
          metric = name.rsplit(" ", 1)[1]
          rows.append((name, t, f"calib_jax {t / jax_times[metric]:.1f}x faster"))
      elif not _NO_TORCH.value:
        rows.append(("torch libraries", float("nan"), "skipped: over --torch-max-gb"))
      for name, t, note in rows:
        print(f"| {c} | {n:.0e} | {gb:.2f} | {name} | {t:.4f} | {note} |", flush=True)
      del p, y, p_np, y_np


if __name__ == "__main__":
  app.run(main)
