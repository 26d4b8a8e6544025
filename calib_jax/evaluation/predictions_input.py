"""The inputs of `evaluation.predictions`: a predictions `.npz` file read (`load_npz`) and its
arrays checked (`check_predictions`), each bad input a one-line `PredictionsError` naming the
array and the problem. `predictions` re-exports all of it.
"""
from collections.abc import Mapping
from typing import Any

import numpy as np

from calib_jax.evaluation import ensembles

REQUIRED = ("val_logits", "val_labels", "test_logits", "test_labels")
OPTIONAL = ("ood_logits",)


class PredictionsError(ValueError):
  """Arrays that cannot be evaluated; the message is one line naming the array."""


def check_predictions(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The arrays of `REQUIRED` (and `ood_logits` if given) as numpy, checked: logits `[N, C]`
  finite floats with the same C, labels `[N]` integers in [0, C) matching their logits."""
  missing = [k for k in REQUIRED if arrays.get(k) is None]
  if missing:
    raise PredictionsError(f"predictions: missing array {missing[0]!r} (needed: "
                           f"{', '.join(REQUIRED)}; optional: {', '.join(OPTIONAL)})")
  out = ensembles.member_arrays(arrays, REQUIRED + OPTIONAL, PredictionsError)  # [M, N, C] too
  num_classes = None
  for name in ("val_logits", "test_logits", "ood_logits"):
    if name not in out:
      continue
    logits = out[name]
    if logits.ndim not in (2, 3) or not np.issubdtype(logits.dtype, np.floating):
      raise PredictionsError(f"predictions: {name} must be a float array [N, C] or [M, N, C], got "
                             f"{logits.dtype} {list(logits.shape)}")
    if num_classes is None:
      num_classes = logits.shape[-1]
    if logits.shape[-1] != num_classes or num_classes < 2:
      raise PredictionsError(f"predictions: {name} has {logits.shape[-1]} classes, val_logits "
                             f"{num_classes} (all logits need the same C >= 2)")
    if logits.shape[-2] < 1:
      raise PredictionsError(f"predictions: {name} has no samples")
    bad = int(np.sum(~np.isfinite(logits)))
    if bad:
      raise PredictionsError(f"predictions: {name} has {bad} NaN or infinite value(s)")
  for split in ("val", "test"):
    logits, labels = out[f"{split}_logits"], out[f"{split}_labels"]
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
      raise PredictionsError(f"predictions: {split}_labels must be integers [N], got "
                             f"{labels.dtype} {list(labels.shape)}")
    if labels.shape[0] != logits.shape[-2]:
      raise PredictionsError(f"predictions: {split}_labels has {labels.shape[0]} samples, "
                             f"{split}_logits {logits.shape[-2]}")
    outside = labels[(labels < 0) | (labels >= num_classes)]
    if outside.size:
      raise PredictionsError(f"predictions: {split}_labels holds {outside[0]}, outside [0, "
                             f"{num_classes}) ({outside.size} such label(s))")
  return out


def load_npz(path: str) -> dict[str, np.ndarray]:
  """The arrays of an `.npz` file of predictions (`PredictionsError`, one line, if unreadable)."""
  try:
    with np.load(path, allow_pickle=False) as archive:
      return {name: archive[name] for name in archive.files}
  except FileNotFoundError:
    raise PredictionsError(f"predictions: no such file {path}") from None
  except (OSError, ValueError) as e:
    raise PredictionsError(f"predictions: {path} is not a readable .npz file ({e})") from None
