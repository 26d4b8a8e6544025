"""The validation evaluator and what every evaluator shares: the `eval` settings' checks, the
streaming accumulators, and gathering a global array on the host.

Evaluators follow big_vision's pattern: small objects built once from an
`experiment.Experiment`, each with `run(variables) -> metrics`. `ValidationEvaluator` is what the
training loop runs every `eval_every_steps`; `report.CalibrationReport` (eval.py) and
`maps.MapReport` read the same `Experiment.data.eval_stream`.
"""
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from calib_jax import metrics, posthoc
from calib_jax.training import step as step_lib

VALIDATION_KEYS = ("accuracy", "nll", "ece", "aece", "brier", "aurc")


def eval_problems(eval_config: ml_collections.ConfigDict) -> list[str]:
  """What is wrong with a config's `eval` sub-config (the settings of the evaluators)."""
  e = eval_config
  checks = [
      (e.num_bins > 0, f"eval.num_bins must be > 0, got {e.num_bins}"),
      (len(e.pnorm_candidates) > 0 and all(p > 0 for p in e.pnorm_candidates),
       f"eval.pnorm_candidates must be positive numbers, got {e.pnorm_candidates}"),
      (all(0 < r <= 1 for r in e.risk_levels),
       f"eval.risk_levels must be in (0, 1], got {e.risk_levels}"),
      (all(0 < c <= 1 for c in e.coverage_levels),
       f"eval.coverage_levels must be in (0, 1], got {e.coverage_levels}"),
      (all(t > 0 for t in e.temperature_grid),
       f"eval.temperature_grid must hold temperatures > 0, got {e.temperature_grid}"),
      (e.max_examples == -1 or e.max_examples > 0,
       f"eval.max_examples must be -1 (all) or > 0, got {e.max_examples}"),
      (e.fit_split in ("val", "test"),
       f"eval.fit_split must be 'val' or 'test', got {e.fit_split!r}"),
  ]
  checks += [(e[field] > 0, f"eval.{field} must be > 0, got {e[field]}")
             for field in ("fit_pixels_per_image", "score_pixels_per_image", "max_plot_samples")]
  checks += [(isinstance(e[field], int) and e[field] >= 0,
               f"eval.{field} must be an int >= 0 (0 = off), got {e[field]!r}")
              for field in ("cam_images", "seg_map_images", "bootstrap_samples")]
  checks += [
      (all(0 < a < 1 for a in e.conformal_alphas),
       f"eval.conformal_alphas must be miscoverage levels in (0, 1), got {e.conformal_alphas}"),
      (isinstance(e.toolkit_max_samples, int) and e.toolkit_max_samples > 0,
       f"eval.toolkit_max_samples must be an int > 0, got {e.toolkit_max_samples!r}"),
      (isinstance(e.ood, str), f"eval.ood must be a string, got {e.ood!r}"),
  ]
  if e.toolkit:
    unknown = [c for c in e.calibrators if c not in posthoc.calibrator_names()]
    if unknown:
      checks.append((False, f"eval.calibrators: unknown calibrator {unknown[0]!r}; valid "
                            f"names: {', '.join(posthoc.calibrator_names())}"))
  return [message for ok, message in checks if not ok]


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


class ValidationEvaluator:
  """Accuracy, NLL, ECE, AECE, Brier and AURC (and mIoU for segmentation) on one split.

  Built once per run (its predict function compiles once); `run(variables)` streams the split
  through the `accumulators` these metrics need (no classwise bins), on device.
  """

  def __init__(self, experiment: Any, split: str = "val"):
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
