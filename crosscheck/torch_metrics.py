"""Cross-check of ECE and AECE (norms l1, l2, max) against torchmetrics and torch-uncertainty (the
`bench` extra).

    .venv/bin/python crosscheck/torch_metrics.py      # or: make crosscheck

Conventions agree away from bin edges (torchmetrics' bins are [lo, hi), calib_jax's (lo, hi]), so
the random probabilities avoid exact edges. Prints both values and exits non-zero on a mismatch.
It lives here rather than in the test suite because torch is not a dependency of `make test`.
"""
from absl import app, logging
import numpy as np
import torch
import torch_uncertainty.metrics as tu
from torchmetrics.functional.classification import multiclass_calibration_error

from calib_jax import metrics

TOLERANCE = 1e-6


def random_predictions(n=2000, c=10, seed=0):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, c)) * 2.5
  probs = (np.exp(z) / np.exp(z).sum(1, keepdims=True)).astype(np.float32)
  labels = np.where(rng.random(n) < 0.6, probs.argmax(1), rng.integers(0, c, n))
  conf_bins = probs.max(1) * 15
  assert np.all(np.abs(conf_bins - np.round(conf_bins)) > 1e-6)  # no sample on a bin edge
  return probs, labels


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  probs, labels = random_predictions()
  ours_ece = float(metrics.ece(probs, labels))
  theirs_ece = float(multiclass_calibration_error(
      torch.from_numpy(probs), torch.from_numpy(labels), num_classes=10, n_bins=15, norm="l1"))

  probs, labels = random_predictions(seed=1)
  rows = [("ECE", ours_ece, theirs_ece, "torchmetrics")]
  for norm in ("l1", "l2", "max"):
    aece = tu.AdaptiveCalibrationError(task="multiclass", num_classes=10, num_bins=15, norm=norm)
    aece.update(torch.from_numpy(probs), torch.from_numpy(labels))
    rows.append((f"AECE {norm}", float(metrics.aece(probs, labels, norm=norm)),
                 float(aece.compute()), "torch-uncertainty"))

  ok = True
  for name, ours, theirs, lib in rows:
    agree = abs(ours - theirs) <= TOLERANCE
    ok &= agree
    print(f"{name:<8} calib_jax {ours:.7f}  {lib} {theirs:.7f}  {'agree' if agree else 'DIFFER'}")
  return 0 if ok else 1


if __name__ == "__main__":
  app.run(main)
