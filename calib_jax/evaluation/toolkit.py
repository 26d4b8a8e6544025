"""The post-hoc toolkit of `eval.py` on a trained run, an evaluator:
`PosthocReport(experiment, split, calibration)`.

It runs after `report.CalibrationReport` and reuses the logits that report already computed: the
fit split's (validation by default) and the report split's (sampled pixels for segmentation).
`run(variables)` hands them to `predictions.evaluate_predictions`, the same report a user gets
for any model's logits (`eval.py --predictions`):

* every calibrator of `eval.calibrators` fitted on the fit split, with the report split's
  accuracy, ECE, AECE, smooth ECE, RMS ECE, NLL, Brier and AURC, and 95 % bootstrap intervals of
  ECE, smooth ECE and AURC (`eval.bootstrap_samples` resamples);
* split-conformal THR, APS, RAPS and SAPS sets, marginal and class-conditional, at each
  `eval.conformal_alphas`, before and after each calibrator: coverage, mean set size and the
  worst class's coverage;
* failure detection (wrong predictions as positives) by MSP, max logit, entropy, energy and
  p-norm; and with `eval.ood` OOD detection of that set's samples among the report split
  (`DataRecipe.ood_stream`: the context-only images, a split, or another dataset).

Splits larger than `eval.toolkit_max_samples` are subsampled uniformly (seeded by the config's
seed) for the toolkit; the report's own PreT/PosT tables always cover the whole split.
`write(out_dir)` draws `posthoc_reliability.png` (the raw logits beside the calibrator with the
lowest ECE) and `smooth_reliability.png`.
"""
from typing import Any

import numpy as np

from calib_jax.evaluation import predictions, validation
from calib_jax.experiment import Experiment
from calib_jax.evaluation.report import CalibrationReport

RELIABILITY_FILE = "posthoc_reliability.png"


def _subsample(arrays: dict[str, np.ndarray], limit: int, seed: int) -> dict[str, np.ndarray]:
  """`arrays` (of one length) cut to `limit` rows drawn uniformly without replacement."""
  size = len(next(iter(arrays.values())))
  if size <= limit:
    return arrays
  keep = np.sort(np.random.default_rng(seed).choice(size, limit, replace=False))
  return {k: v[keep] for k, v in arrays.items()}


class PosthocReport:
  """The toolkit report of one split (see the module docstring). `run(variables)` needs the
  sibling `CalibrationReport` to have run on the same variables."""

  def __init__(self, experiment: Experiment, split: str, calibration: CalibrationReport):
    self.experiment, self.split, self.calibration = experiment, split, calibration
    self.settings = experiment.config.eval
    self._arrays: dict[str, np.ndarray] | None = None
    self._results: dict[str, Any] | None = None
    self._calibrators: dict[str, Any] = {}

  def ood_logits(self, variables: dict[str, Any]) -> np.ndarray | None:
    """The model's logits of the `eval.ood` set (None without one)."""
    if not self.settings.ood:
      return None
    out = []
    for batch in self.experiment.data.ood_stream(self.settings.ood, self.split,
                                                 self.experiment.mesh,
                                                 max_examples=self.settings.max_examples):
      logits = validation.to_host(self.calibration.predict(variables, batch))
      out.append(logits[validation.to_host(batch["mask"])])
    if not out or not sum(len(x) for x in out):
      raise ValueError(f"eval.ood={self.settings.ood!r} holds no samples")
    return np.concatenate(out)

  def run(self, variables: dict[str, Any]) -> dict[str, Any]:
    """`{"posthoc": evaluate_predictions(...)}` of the fit and report splits' logits."""
    e, seed = self.settings, self.experiment.config.seed
    fit = _subsample(self.calibration.fit_samples, e.toolkit_max_samples, seed)
    report = _subsample(self.calibration.report_samples(), e.toolkit_max_samples, seed + 1)
    arrays = {"val_logits": fit["logits"], "val_labels": fit["labels"],
              "test_logits": report["logits"], "test_labels": report["labels"]}
    ood = self.ood_logits(variables)
    if ood is not None:
      arrays["ood_logits"] = _subsample({"x": ood}, e.toolkit_max_samples, seed + 2)["x"]
    results, self._calibrators = predictions.fit_and_evaluate(
        **arrays, calibrators=tuple(e.calibrators), alphas=tuple(e.conformal_alphas),
        num_bins=e.num_bins, bootstrap_samples=e.bootstrap_samples, seed=seed)
    results["fit_split"], results["report_split"] = e.fit_split, self.split
    if e.ood:
      results["ood_set"] = e.ood
    self._arrays, self._results = arrays, results
    return {"posthoc": results}

  def write(self, out_dir: str) -> dict[str, str]:
    """The toolkit's plots of the last `run` into `out_dir`; returns their paths."""
    if self._results is None:
      raise RuntimeError("PosthocReport.write needs a run() first")
    files = predictions.plot_report(out_dir, self._arrays, self._results,
                                    reliability_file=RELIABILITY_FILE,
                                    calibrators=self._calibrators)
    return {f"posthoc_{k}" if k == "reliability" else k: v for k, v in files.items()}


def format_lines(results: dict[str, Any]) -> list[str]:
  """The console lines of the toolkit's part of `evaluate_run`'s results (none without it)."""
  if "posthoc" not in results:
    return []
  posthoc = results["posthoc"]
  title = (f"post-hoc toolkit: fitted on {posthoc['fit_split']}, reported on "
           f"{posthoc['report_split']}"
           + (f", OOD set {posthoc['ood_set']!r} ({posthoc['num_ood']} samples)"
              if "ood_set" in posthoc else ""))
  return ["", title, predictions.format_table(posthoc)]

