"""The calibration report of `eval.py`, an evaluator: `CalibrationReport(experiment, split)`.

`run(variables)`:
1. on the fit split (`config.eval.fit_split`, the validation split by default) fits the
   temperature T (`posthoc.fit_temperature`, held-out NLL) and picks the logit-normalisation
   p (`posthoc.select_pnorm`, held-out AURC; None keeps MSP);
2. streams the report split through two sets of streaming accumulators
   (`validation.accumulators`), on logits and on logits / T: every calibration metric
   before and after temperature scaling (the papers' PreT / PosT columns), MSP-based selective
   metrics, and mIoU for segmentation;
3. computes the selective metrics of the other confidence scores (max logit, negative entropy,
   max-logit p-norm) exactly, from per-sample scores (segmentation: from
   `eval.score_pixels_per_image` random labelled pixels per image, the same pixels for every
   model, as LS-vs-SC do);
4. for ALS models (`eval.context_eval`) evaluates context-only images (every object box filled
   with the mean pixel): a model that relies on objects should be unsure there;
and `write(out_dir)` draws `reliability.png` (PreT and PosT), `risk_coverage.png` and saves
`predictions.npz` (the plotted samples' PreT/PosT probabilities and labels, to draw several
models side by side with `plotting.reliability_diagrams`). Its sibling `maps.MapReport` draws
class activation maps or confidence maps; `run.evaluate_run` runs both on a trained run.
"""
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from calib_jax import metrics, posthoc
from calib_jax.evaluation import validation
from calib_jax.experiment import Experiment
from calib_jax.training import step as step_lib

RELIABILITY_FILE = "reliability.png"
RISK_COVERAGE_FILE = "risk_coverage.png"
PREDICTIONS_FILE = "predictions.npz"
# Scalars of the accumulators' `result()` reported in the PreT / PosT tables.
CALIBRATION_KEYS = ("accuracy", "ece", "aece", "mce", "classwise_ece", "nll", "brier",
                    "average_confidence", "overconfidence", "underconfidence", "aurc", "eaurc",
                    "augrc")


@functools.partial(jax.jit, static_argnames="num_pixels")
def _sample_pixels(logits: jax.Array, labels: jax.Array, mask: jax.Array, key: jax.Array,
                   num_pixels: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The labelled pixels of `metrics.subsample_pixels` (up to `num_pixels` per image, drawn
  uniformly), as flat samples.

  Returns `(logits [B*k, C], labels [B*k], mask [B*k])` with `k = min(num_pixels, H*W)`;
  images with fewer labelled pixels keep all of them (the rest of their k slots are masked).
  """
  b, num_classes = logits.shape[0], logits.shape[-1]
  index, chosen = metrics.subsample_pixel_indices(key, mask, num_pixels)
  picked = jnp.take_along_axis(logits.reshape(b, -1, num_classes), index[..., None], axis=1)
  picked_labels = jnp.take_along_axis(labels.reshape(b, -1), index, axis=1)
  return picked.reshape(-1, num_classes), picked_labels.reshape(-1), chosen.reshape(-1)


def _samples(logits, labels, mask, key, num_pixels):
  """Per-example (classification) or sampled per-pixel (segmentation) flat samples."""
  if logits.ndim == 2:
    return logits, labels, mask
  return _sample_pixels(logits, labels, mask, key, num_pixels)


def _scores(logits: jax.Array, pnorm, center: bool) -> dict[str, jax.Array]:
  scores = {"msp": posthoc.msp(logits), "max_logit": posthoc.max_logit(logits),
            "neg_entropy": posthoc.neg_entropy(logits)}
  scores["max_logit_pnorm"] = (scores["msp"] if pnorm is None
                               else posthoc.max_logit_pnorm(logits, pnorm, center))
  return scores


def jsonable(x: Any) -> Any:
  """`x` with arrays and numpy scalars turned into lists and Python numbers (for JSON)."""
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, (np.ndarray, jax.Array)):
    x = np.asarray(x)
    return x.tolist() if x.ndim else x.item()
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  return x


@functools.partial(jax.jit, static_argnames=("num_pixels", "pnorm", "center"))
def _report_batch(logits, labels, mask, key, temperature, *, num_pixels: int, pnorm,
                  center: bool) -> dict[str, Any]:
  """Everything the report needs from one batch, in one compiled program."""
  flat_logits, flat_labels, flat_mask = _samples(logits, labels, mask, key, num_pixels)
  return {
      "logits": flat_logits,
      "scaled_logits": logits / temperature,
      "scores": _scores(flat_logits, pnorm, center),
      "correct": jnp.argmax(flat_logits, -1) == flat_labels,
      "labels": flat_labels,
      "mask": flat_mask,
      "probs_pre": jax.nn.softmax(flat_logits),
      "probs_post": jax.nn.softmax(flat_logits / temperature),
  }


def _calibration_table(result: dict[str, Any], segmentation: bool) -> dict[str, float]:
  keys = CALIBRATION_KEYS + (("miou",) if segmentation else ())
  table = {k: float(result[k]) for k in keys}
  table.update({k: float(v) for k, v in result.items()
                if k.startswith(("coverage_at_", "risk_at_"))})
  table["num_samples"] = int(result["num_samples"])
  return table


def _selective_tables(samples: dict[str, np.ndarray], settings) -> dict[str, dict[str, float]]:
  risks, coverages = tuple(settings.risk_levels), tuple(settings.coverage_levels)
  out = {}
  for name in ("msp", "max_logit", "neg_entropy", "max_logit_pnorm"):
    summary = metrics.selective_summary(samples[name], samples["correct"], risks=risks,
                                        coverages=coverages)
    table = {k: float(summary[k]) for k in ("aurc", "eaurc", "augrc")}
    for r, v in zip(risks, np.asarray(summary["coverage_at_risk"])):
      table[metrics.coverage_at_risk_key(r)] = float(v)
    for c, v in zip(coverages, np.asarray(summary["risk_at_coverage"])):
      table[metrics.risk_at_coverage_key(c)] = float(v)
    out[name] = table
  return out


def _plots(out_dir: str, samples: dict[str, np.ndarray], temperature: float, pnorm,
           settings) -> dict[str, str]:
  from calib_jax import plotting  # Deferred: matplotlib.
  reliability = plotting.reliability_diagrams(
      {"PreT": (samples["probs_pre"], samples["labels"]),
       f"PosT (T = {temperature:.2f})": (samples["probs_post"], samples["labels"])},
      os.path.join(out_dir, RELIABILITY_FILE), num_bins=settings.num_bins)
  curves = {name: (samples[name], samples["correct"])
            for name in ("msp", "max_logit", "neg_entropy")}
  if pnorm is not None:
    curves[f"max_logit_pnorm (p = {pnorm:g})"] = (samples["max_logit_pnorm"],
                                                   samples["correct"])
  risk_coverage = plotting.risk_coverage_plot(
      curves, os.path.join(out_dir, RISK_COVERAGE_FILE),
      risk_levels=tuple(settings.risk_levels)[:1])
  return {"reliability": reliability, "risk_coverage": risk_coverage}


def _save_predictions(out_dir: str, samples: dict[str, np.ndarray]) -> str:
  path = os.path.join(out_dir, PREDICTIONS_FILE)
  np.savez_compressed(path, **{k: samples[k] for k in ("probs_pre", "probs_post", "labels")})
  return path


class CalibrationReport:
  """The calibration and selective-classification report of one split (see the module
  docstring): built once from an `experiment.Experiment`, `run(variables)` returns the results
  dict and `write(out_dir)` the files of the last run."""

  def __init__(self, experiment: Experiment, split: str = "test"):
    self.experiment, self.split = experiment, split
    self.settings = experiment.config.eval
    self.predict = step_lib.make_predict_fn(experiment.model, experiment.mesh)
    self._samples: dict[str, np.ndarray] | None = None
    self._fit: dict[str, Any] | None = None
    self.fit_samples: dict[str, np.ndarray] | None = None  # the fit split's logits and labels

  def _stream(self, role: str, **options: Any):
    return self.experiment.data.eval_stream(role, self.experiment.mesh,
                                            max_examples=self.settings.max_examples, **options)

  def _accumulators(self, *, full: bool) -> metrics.StreamingMetrics:
    return validation.accumulators(self.experiment.meta, self.settings.num_bins,
                                   classwise=full, histogram=full)

  def fit_posthoc(self, variables: dict[str, Any]) -> dict[str, Any]:
    """Fits the temperature and picks the p-norm on the fit split; returns them with the fit
    split's name, size and NLL before/after (and the grid temperature with
    `eval.temperature_grid`)."""
    e = self.settings
    logits, labels, masks = [], [], []
    key = jax.random.key(self.experiment.config.seed)
    for i, batch in enumerate(self._stream(e.fit_split)):
      out = _samples(self.predict(variables, batch), batch["label"], batch["mask"],
                     jax.random.fold_in(key, i), e.fit_pixels_per_image)
      for store, value in zip((logits, labels, masks), out):
        store.append(validation.to_host(value))
    logits, labels, mask = (np.concatenate(x) for x in (logits, labels, masks))
    logits, labels = logits[mask], labels[mask]
    self.fit_samples = {"logits": logits, "labels": labels}
    temperature = posthoc.fit_temperature(logits, labels)
    pnorm = posthoc.select_pnorm(logits, labels, ps=tuple(e.pnorm_candidates),
                                 center=e.pnorm_center)
    nll_before, nll_after = (float(metrics.nll(logits / t, labels, from_logits=True))
                             for t in (1.0, temperature))
    fit = {"split": e.fit_split, "num_samples": int(labels.shape[0]),
           "temperature": temperature, "pnorm": pnorm, "nll_before": nll_before,
           "nll_after": nll_after}
    if e.temperature_grid:
      fit["temperature_grid"] = posthoc.select_temperature_from_grid(
          logits, labels, tuple(e.temperature_grid), num_bins=e.num_bins)
    return fit

  def _stream_report_split(self, variables: dict[str, Any], fit: dict[str, Any]):
    """The accumulators (PreT, PosT and, with a grid temperature, PosT-grid) and the sampled
    per-sample scores of the report split."""
    e = self.settings
    temperature, grid_temperature = fit["temperature"], fit.get("temperature_grid")
    scaled = {"pre": 1.0, "post": temperature}
    if grid_temperature is not None:
      scaled["post_grid"] = grid_temperature
    accumulated = {name: self._accumulators(full=True) for name in scaled}
    samples: dict[str, list[np.ndarray]] = {"correct": [], "probs_pre": [], "probs_post": [],
                                            "labels": []}
    key = jax.random.key(self.experiment.config.seed + 1)
    num_plotted = 0
    for i, batch in enumerate(self._stream(self.split)):
      logits = self.predict(variables, batch)
      out = _report_batch(logits, batch["label"], batch["mask"], jax.random.fold_in(key, i),
                          jnp.float32(temperature), num_pixels=e.score_pixels_per_image,
                          pnorm=fit["pnorm"], center=bool(e.pnorm_center))
      for name, t in scaled.items():
        accumulated[name] = accumulated[name].update(
            logits=out["scaled_logits"] if name == "post" else logits / t,
            labels=batch["label"], mask=batch["mask"])
      keep = validation.to_host(out["mask"])
      for name, score in out["scores"].items():
        samples.setdefault(name, []).append(validation.to_host(score)[keep])
      samples["correct"].append(validation.to_host(out["correct"])[keep])
      if e.toolkit:  # The post-hoc toolkit (`toolkit.PosthocReport`) refits on these.
        samples.setdefault("logits", []).append(validation.to_host(out["logits"])[keep])
        samples.setdefault("labels_all", []).append(validation.to_host(out["labels"])[keep])
      if num_plotted < e.max_plot_samples:
        take = e.max_plot_samples - num_plotted
        for name in ("probs_pre", "probs_post", "labels"):
          samples[name].append(validation.to_host(out[name])[keep][:take])
        num_plotted += len(samples["labels"][-1])
    risks, coverages = tuple(e.risk_levels), tuple(e.coverage_levels)
    results = {name: acc.result(risks=risks, coverages=coverages)
               for name, acc in accumulated.items()}
    return results, {k: np.concatenate(v) for k, v in samples.items()}

  def context_metrics(self, variables: dict[str, Any]) -> dict[str, float]:
    """Calibration on context-only images (all objects filled with the mean pixel)."""
    acc = self._accumulators(full=False)
    entropy_sum, count = 0.0, 0
    for batch in self._stream(self.split, remove_objects=True):
      logits = self.predict(variables, batch)
      acc = acc.update(logits=logits, labels=batch["label"], mask=batch["mask"])
      mask = validation.to_host(batch["mask"])
      entropy_sum += float(np.sum(-validation.to_host(posthoc.neg_entropy(logits))[mask]))
      count += int(mask.sum())
    result = acc.result(risks=(), coverages=())
    out = {k: float(result[k]) for k in ("accuracy", "average_confidence", "ece", "nll")}
    out["mean_entropy"] = entropy_sum / max(count, 1)
    out["uniform_confidence"] = 1.0 / self.experiment.meta.num_classes
    out["num_samples"] = count
    return out

  def run(self, variables: dict[str, Any]) -> dict[str, Any]:
    """Every number of the report for `variables` (JSON-able)."""
    config = self.experiment.config
    fit = self.fit_posthoc(variables)
    logging.info("Fitted on %s: T=%.3f, p=%s", fit["split"], fit["temperature"], fit["pnorm"])
    accumulated, samples = self._stream_report_split(variables, fit)
    segmentation = self.experiment.meta.task == "segmentation"
    results = {
        "dataset": config.data.name, "model": config.model, "loss": config.loss,
        "loss_kwargs": config.loss_kwargs.to_dict(), "split": self.split,
        "fit": fit,
        **{table: _calibration_table(accumulated[name], segmentation)
           for name, table in (("pre", "pre_temperature"), ("post", "post_temperature"),
                               ("post_grid", "post_temperature_grid"))
           if name in accumulated},
        "reliability": {k: accumulated["pre"][k] for k in
                        ("reliability_counts", "reliability_confidence",
                         "reliability_accuracy")},
        "selective": _selective_tables(samples, self.settings),
        "selective_num_samples": int(samples["correct"].shape[0]),
    }
    if self.settings.context_eval:
      results["context"] = self.context_metrics(variables)
    self._samples, self._fit = samples, fit
    return jsonable(results)

  def report_samples(self) -> dict[str, np.ndarray]:
    """The report split's logits and labels of the last `run` (sampled pixels for
    segmentation; with `eval.toolkit`)."""
    if self._samples is None or "logits" not in self._samples:
      raise RuntimeError("CalibrationReport.report_samples needs a run() with eval.toolkit")
    return {"logits": self._samples["logits"], "labels": self._samples["labels_all"]}

  def write(self, out_dir: str) -> dict[str, str]:
    """Plots and `predictions.npz` of the last `run` into `out_dir`; returns their paths."""
    if self._samples is None:
      raise RuntimeError("CalibrationReport.write needs a run() first")
    os.makedirs(out_dir, exist_ok=True)
    files = _plots(out_dir, self._samples, self._fit["temperature"], self._fit["pnorm"],
                   self.settings)
    files["predictions"] = _save_predictions(out_dir, self._samples)
    return files
