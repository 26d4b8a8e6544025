"""The validation evaluator and what every evaluator shares: the `eval` settings' checks, the
streaming accumulators, and gathering a global array on the host.

Evaluators follow big_vision's pattern: small objects built once from an
`experiment.Experiment`, each with `run(variables) -> metrics`. `ValidationEvaluator` is what the
training loop runs every `eval_every_steps`; `report.CalibrationReport` (eval.py) and
`maps.MapReport` read the same `Experiment.data.eval_stream`.
"""
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from calib_jax import metrics
from calib_jax.experiment import Experiment
from calib_jax.training import step as step_lib

VALIDATION_KEYS = ("accuracy", "nll", "ece", "aece", "brier", "aurc")


def to_host(x: jax.Array) -> np.ndarray:
  """The full value of a global array on this host (gathered across processes if needed)."""
  if jax.process_count() > 1:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def accumulators(meta: Any, num_bins: int, *, classwise: bool,
                 histogram: bool) -> metrics.StreamingMetrics:
  """The streaming accumulators of an evaluation, on device: `ScalarSums` (accuracy, NLL,
  Brier, confidence) and `BinnedCalibration` (ECE, MCE, reliability) always; with `classwise`
  the `ClasswiseCalibration` bins (classwise ECE, C·B sums: the costly part at large C); with
  `histogram` the `ConfidenceHistogram` (AECE, AURC and the other selective metrics); and the
  `ConfusionMatrix` (mIoU) for segmentation."""
  parts = {"scalars": metrics.ScalarSums.init(),
           "calibration": metrics.BinnedCalibration.init(num_bins)}
  if classwise:
    parts["classwise"] = metrics.ClasswiseCalibration.init(meta.num_classes, num_bins)
  if histogram:
    parts["histogram"] = metrics.ConfidenceHistogram.init(num_bins)
  if meta.task == "segmentation":
    parts["confusion"] = metrics.ConfusionMatrix.init(meta.num_classes)
  return metrics.StreamingMetrics.of(meta.num_classes, **parts)


def split_logits(experiment: Experiment, predict: Callable[[Any, Any], jax.Array],
                 variables: Any, role: str) -> tuple[np.ndarray, np.ndarray]:
  """A split's logits `[N, C]` and labels `[N]` on the host (padding removed), from the jitted
  `predict(variables, batch)` (`step.make_predict_fn`), gathered from every process (`to_host`:
  each process reads its share of a batch, every process gets the whole split): the one-member
  case of `stacked_split_logits`."""
  logits, labels = stacked_split_logits(
      experiment, lambda v, batch: predict(v, batch)[None], variables, role)
  return logits[0], labels


def stacked_logits(predict: Callable[[Any, Any], jax.Array], stacked_variables: Any,
                   batches: Iterable[dict[str, Any]], num_classes: int
                   ) -> tuple[np.ndarray, np.ndarray | None]:
  """Member-stacked logits `[M, N, C]` of a stream of batches and their labels `[N]` (None when
  the batches have none) on the host, padding removed, from the jitted stacked
  `predict(stacked_variables, batch) -> [M, B, ..., C]` (`step.make_ensemble_predict_fn`)."""
  logits, labels = [], []
  for batch in batches:
    valid = to_host(batch["mask"]).astype(bool)
    logits.append(to_host(predict(stacked_variables, batch))[:, valid])
    if "label" in batch:
      labels.append(to_host(batch["label"])[valid])
  stacked = np.concatenate(logits, axis=1)
  return (stacked.reshape(stacked.shape[0], -1, num_classes),
          np.concatenate(labels).reshape(-1) if labels else None)


def stacked_split_logits(experiment: Experiment, predict: Callable[[Any, Any], jax.Array],
                         stacked_variables: Any, role: str) -> tuple[np.ndarray, np.ndarray]:
  """A split's member-stacked logits `[M, N, C]` and labels `[N]` (`stacked_logits`)."""
  return stacked_logits(predict, stacked_variables, experiment.data.eval_stream(
      role, experiment.mesh, max_examples=experiment.config.eval.max_examples),
                        experiment.meta.num_classes)


class ValidationEvaluator:
  """Accuracy, NLL, ECE, AECE, Brier and AURC (and mIoU for segmentation) on one split.

  Built once per run (its predict function compiles once); `run(variables)` streams the split
  through the `accumulators` these metrics need (no classwise bins), on device.
  """

  def __init__(self, experiment: Experiment, split: str = "val"):
    """Args: experiment: an `experiment.Experiment`; split: the role or tfds split to read."""
    self.experiment, self.split = experiment, split
    self.num_bins = experiment.config.eval.num_bins
    self.max_examples = experiment.config.eval.max_examples
    self.predict = step_lib.make_predict_fn(experiment.model, experiment.mesh)

  def run(self, variables: dict[str, Any]) -> dict[str, float]:
    """Metrics of `variables` on the split, as Python floats."""
    meta = self.experiment.meta
    acc = accumulators(meta, self.num_bins, classwise=False, histogram=True)
    for batch in self.experiment.data.eval_stream(self.split, self.experiment.mesh,
                                                  max_examples=self.max_examples):
      acc = acc.update(logits=self.predict(variables, batch), labels=batch["label"],
                       mask=batch["mask"])
    result = acc.result(risks=(), coverages=())
    keys = VALIDATION_KEYS + (("miou",) if meta.task == "segmentation" else ())
    return {k: float(result[k]) for k in keys}
