"""The evaluation program behind `eval.py`: the calibration report of a trained run.

`evaluate_run(config, workdir, split='test')`:
1. restores the newest (or a given) checkpoint's parameters and BatchNorm statistics, and
   nothing else (no optimiser, no training set); or, with `weights=FILE`, reads them from a
   weight file (ours or PyTorch / safetensors) with no training run at all;
2. on the fit split (`config.eval.fit_split`, the validation split by default) fits the
   temperature T (`posthoc.fit_temperature`, held-out NLL) and picks the logit-normalisation
   p (`posthoc.select_pnorm`, held-out AURC; None keeps MSP);
3. streams the report split through two sets of streaming accumulators
   (`evaluators.accumulators`) on logits and logits/T: each calibration metric (docs/conventions.md)
   before and after temperature scaling (the papers' PreT / PosT columns), MSP-based selective
   metrics, and mIoU for segmentation;
4. computes the selective metrics of the other confidence scores (max logit, negative entropy,
   max-logit p-norm) exactly, from per-sample scores (segmentation: from
   `eval.score_pixels_per_image` random labelled pixels per image, the same pixels for every
   model, as LS-vs-SC do);
5. for ALS models (`eval.context_eval`) evaluates context-only images (every object box filled
   with the mean pixel): a model that relies on objects should be unsure there;
6. writes `<workdir>/eval_<split>/metrics.json`, `reliability.png` (PreT and PosT),
   `risk_coverage.png` and `predictions.npz` (the plotted samples' PreT/PosT probabilities and
   labels, to draw several models side by side with `plotting.reliability_diagrams`), and
   returns the results; `map_report.MapReport` adds class activation maps and localisation
   scores (classification) or confidence maps (segmentation).
"""
import functools
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from calib_jax import metrics, posthoc
from calib_jax.training import builders
from calib_jax.training import checkpoint as checkpoint_lib
from calib_jax.training import config_validation, evaluators, map_report, parallel, reporting
from calib_jax.training import step as step_lib

RESULTS_FILE = "metrics.json"
RELIABILITY_FILE = "reliability.png"
RISK_COVERAGE_FILE = "risk_coverage.png"
PREDICTIONS_FILE = "predictions.npz"
# Scalars of the accumulators' `result()` reported in the PreT / PosT tables.
CALIBRATION_KEYS = ("accuracy", "ece", "aece", "mce", "classwise_ece", "nll", "brier",
                    "average_confidence", "overconfidence", "underconfidence", "aurc", "eaurc",
                    "augrc")


def eval_dir(workdir: str, split: str) -> str:
  """Where `evaluate_run` writes the results of `split`."""
  return os.path.join(workdir, f"eval_{split}")


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


def restore_variables(config: ml_collections.ConfigDict, workdir: str, model,
                      mesh: jax.sharding.Mesh, example: np.ndarray,
                      step: int | None = None) -> tuple[dict[str, Any], int]:
  """The model variables (params, batch_stats) of a run's checkpoint (newest unless `step`) and
  its step. Only those arrays are read: no optimiser is built and the training set is not
  opened, so evaluation works whatever the optimiser settings are now."""
  del config  # The variables' structure comes from the model alone.
  checkpointer = checkpoint_lib.Checkpointer(workdir, read_only=True)
  if checkpointer.latest_step() is None:
    raise FileNotFoundError(f"No checkpoint in {checkpointer.directory}; train first "
                            "(python train.py --config=... --workdir=...)")
  variables, meta = checkpointer.restore_variables(
      builders.abstract_variables(model, example, mesh), step)
  checkpointer.close()
  if checkpointer.skipped:
    reporting.warn("; ".join(f"skipped checkpoint {s}, unreadable ({why})"
                             for s, why in checkpointer.skipped)
                   + f"; evaluating step {meta['step']}")
  return variables, int(meta["step"])


def fit_posthoc(config: ml_collections.ConfigDict, predict, variables, mesh, meta: Any
                ) -> dict[str, Any]:
  """Fits the temperature and picks the p-norm on the fit split; returns them with context."""
  logits, labels, masks = [], [], []
  key = jax.random.key(config.seed)
  for i, batch in enumerate(evaluators.eval_batches(config, config.eval.fit_split, mesh)):
    out = _samples(predict(variables, batch), batch["label"], batch["mask"],
                   jax.random.fold_in(key, i), config.eval.fit_pixels_per_image)
    for store, value in zip((logits, labels, masks), out):
      store.append(evaluators.to_host(value))
  logits, labels, mask = (np.concatenate(x) for x in (logits, labels, masks))
  logits, labels = logits[mask], labels[mask]
  temperature = posthoc.fit_temperature(logits, labels)
  pnorm = posthoc.select_pnorm(logits, labels, ps=tuple(config.eval.pnorm_candidates),
                               center=config.eval.pnorm_center)
  nll_before, nll_after = (float(metrics.nll(logits / t, labels, from_logits=True))
                           for t in (1.0, temperature))
  fit = {"split": config.eval.fit_split, "num_samples": int(labels.shape[0]),
         "temperature": temperature, "pnorm": pnorm, "nll_before": nll_before,
         "nll_after": nll_after}
  if config.eval.temperature_grid:
    fit["temperature_grid"] = posthoc.select_temperature_from_grid(
        logits, labels, tuple(config.eval.temperature_grid), num_bins=config.eval.num_bins)
  return fit


def _scores(logits: jax.Array, pnorm, center: bool) -> dict[str, jax.Array]:
  scores = {"msp": posthoc.msp(logits), "max_logit": posthoc.max_logit(logits),
            "neg_entropy": posthoc.neg_entropy(logits)}
  scores["max_logit_pnorm"] = (scores["msp"] if pnorm is None
                               else posthoc.max_logit_pnorm(logits, pnorm, center))
  return scores


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
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
      "scaled_logits": logits / temperature,
      "scores": _scores(flat_logits, pnorm, center),
      "correct": jnp.argmax(flat_logits, -1) == flat_labels,
      "labels": flat_labels,
      "mask": flat_mask,
      "probs_pre": jax.nn.softmax(flat_logits),
      "probs_post": jax.nn.softmax(flat_logits / temperature),
  }


def _stream_report_split(config, split, predict, variables, mesh, meta, temperature, pnorm,
                         grid_temperature=None):
  """The accumulators (PreT, PosT and, with a grid temperature, PosT-grid) and the sampled
  per-sample scores of the report split."""
  risks, coverages = tuple(config.eval.risk_levels), tuple(config.eval.coverage_levels)
  pre, post, post_grid = (evaluators.accumulators(meta, config.eval.num_bins, classwise=True,
                                                  histogram=True) for _ in range(3))
  samples: dict[str, list[np.ndarray]] = {"correct": [], "probs_pre": [], "probs_post": [],
                                          "labels": []}
  key = jax.random.key(config.seed + 1)
  num_plotted = 0
  for i, batch in enumerate(evaluators.eval_batches(config, split, mesh)):
    logits = predict(variables, batch)
    out = _report_batch(logits, batch["label"], batch["mask"], jax.random.fold_in(key, i),
                        jnp.float32(temperature), num_pixels=config.eval.score_pixels_per_image,
                        pnorm=pnorm, center=bool(config.eval.pnorm_center))
    pre = pre.update(logits=logits, labels=batch["label"], mask=batch["mask"])
    post = post.update(logits=out["scaled_logits"], labels=batch["label"], mask=batch["mask"])
    if grid_temperature is not None:
      post_grid = post_grid.update(logits=logits / grid_temperature, labels=batch["label"],
                                   mask=batch["mask"])
    keep = evaluators.to_host(out["mask"])
    for name, score in out["scores"].items():
      samples.setdefault(name, []).append(evaluators.to_host(score)[keep])
    samples["correct"].append(evaluators.to_host(out["correct"])[keep])
    if num_plotted < config.eval.max_plot_samples:
      take = config.eval.max_plot_samples - num_plotted
      for name in ("probs_pre", "probs_post", "labels"):
        samples[name].append(evaluators.to_host(out[name])[keep][:take])
      num_plotted += len(samples["labels"][-1])
  accumulators = [("pre", pre), ("post", post)]
  if grid_temperature is not None:
    accumulators.append(("post_grid", post_grid))
  results = {name: acc.result(risks=risks, coverages=coverages) for name, acc in accumulators}
  return results, {k: np.concatenate(v) for k, v in samples.items()}


def _calibration_table(result: dict[str, Any], segmentation: bool) -> dict[str, float]:
  keys = CALIBRATION_KEYS + (("miou",) if segmentation else ())
  table = {k: float(result[k]) for k in keys}
  table.update({k: float(v) for k, v in result.items()
                if k.startswith(("coverage_at_", "risk_at_"))})
  table["num_samples"] = int(result["num_samples"])
  return table


def _selective_tables(samples: dict[str, np.ndarray], config) -> dict[str, dict[str, float]]:
  risks, coverages = tuple(config.eval.risk_levels), tuple(config.eval.coverage_levels)
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


def _context_metrics(config, split, predict, variables, mesh, meta) -> dict[str, float]:
  """Calibration on context-only images (all objects filled with the mean pixel)."""
  acc = evaluators.accumulators(meta, config.eval.num_bins, classwise=False, histogram=False)
  entropy_sum, count = 0.0, 0
  for batch in evaluators.eval_batches(config, split, mesh, remove_objects=True):
    logits = predict(variables, batch)
    acc = acc.update(logits=logits, labels=batch["label"], mask=batch["mask"])
    mask = evaluators.to_host(batch["mask"])
    entropy_sum += float(np.sum(-evaluators.to_host(posthoc.neg_entropy(logits))[mask]))
    count += int(mask.sum())
  result = acc.result(risks=(), coverages=())
  out = {k: float(result[k]) for k in ("accuracy", "average_confidence", "ece", "nll")}
  out["mean_entropy"] = entropy_sum / max(count, 1)
  out["uniform_confidence"] = 1.0 / meta.num_classes
  out["num_samples"] = count
  return out


def _plots(out_dir: str, samples: dict[str, np.ndarray], temperature: float, pnorm,
           config) -> dict[str, str]:
  from calib_jax import plotting  # Deferred: matplotlib.
  reliability = plotting.reliability_diagrams(
      {"PreT": (samples["probs_pre"], samples["labels"]),
       f"PosT (T = {temperature:.2f})": (samples["probs_post"], samples["labels"])},
      os.path.join(out_dir, RELIABILITY_FILE), num_bins=config.eval.num_bins)
  curves = {name: (samples[name], samples["correct"])
            for name in ("msp", "max_logit", "neg_entropy")}
  if pnorm is not None:
    curves[f"max_logit_pnorm (p = {pnorm:g})"] = (samples["max_logit_pnorm"],
                                                   samples["correct"])
  risk_coverage = plotting.risk_coverage_plot(
      curves, os.path.join(out_dir, RISK_COVERAGE_FILE),
      risk_levels=tuple(config.eval.risk_levels)[:1])
  return {"reliability": reliability, "risk_coverage": risk_coverage}


def _save_predictions(out_dir: str, samples: dict[str, np.ndarray]) -> str:
  path = os.path.join(out_dir, PREDICTIONS_FILE)
  np.savez_compressed(path, **{k: samples[k] for k in ("probs_pre", "probs_post", "labels")})
  return path


class CalibrationReport:
  """The report of `eval.py` as an evaluator (see `evaluators`): built from the config once,
  `run(variables)` returns the results dict and `write(out_dir)` the files of the last run.

  `run` fits T (and the grid T with `eval.temperature_grid`) and the p-norm on the fit split,
  streams the report split through the PreT / PosT accumulators, computes the selective tables
  per confidence score and, with `eval.context_eval`, the context-only metrics.
  """

  def __init__(self, config: ml_collections.ConfigDict, model, mesh: jax.sharding.Mesh,
               meta: Any, split: str = "test"):
    self.config, self.mesh, self.meta, self.split = config, mesh, meta, split
    self.predict = step_lib.make_predict_fn(model, mesh)
    self.maps = map_report.MapReport(config, model, mesh, meta, split, self.predict)
    self._samples: dict[str, np.ndarray] | None = None
    self._fit: dict[str, Any] | None = None

  def run(self, variables: dict[str, Any]) -> dict[str, Any]:
    """Every number of the report for `variables` (JSON-able)."""
    config, meta, split = self.config, self.meta, self.split
    fit = fit_posthoc(config, self.predict, variables, self.mesh, meta)
    logging.info("Fitted on %s: T=%.3f, p=%s", fit["split"], fit["temperature"], fit["pnorm"])
    accumulated, samples = _stream_report_split(
        config, split, self.predict, variables, self.mesh, meta, fit["temperature"],
        fit["pnorm"], fit.get("temperature_grid"))
    segmentation = meta.task == "segmentation"
    results = {
        "dataset": config.data.name, "model": config.model, "loss": config.loss,
        "loss_kwargs": config.loss_kwargs.to_dict(), "split": split,
        "fit": fit,
        "pre_temperature": _calibration_table(accumulated["pre"], segmentation),
        "post_temperature": _calibration_table(accumulated["post"], segmentation),
        **({"post_temperature_grid": _calibration_table(accumulated["post_grid"],
                                                         segmentation)}
           if "post_grid" in accumulated else {}),
        "reliability": {k: accumulated["pre"][k] for k in
                        ("reliability_counts", "reliability_confidence",
                         "reliability_accuracy")},
        "selective": _selective_tables(samples, config),
        "selective_num_samples": int(samples["correct"].shape[0]),
    }
    if config.eval.context_eval:
      results["context"] = _context_metrics(config, split, self.predict, variables, self.mesh,
                                            meta)
    results.update(self.maps.run(variables))
    self._samples, self._fit = samples, fit
    return _jsonable(results)

  def write(self, out_dir: str) -> dict[str, str]:
    """Plots and `predictions.npz` of the last `run` into `out_dir`; returns their paths."""
    if self._samples is None:
      raise RuntimeError("CalibrationReport.write needs a run() first")
    os.makedirs(out_dir, exist_ok=True)
    files = _plots(out_dir, self._samples, self._fit["temperature"], self._fit["pnorm"],
                   self.config)
    files["predictions"] = _save_predictions(out_dir, self._samples)
    return {**files, **self.maps.write(out_dir)}


def evaluate_run(config: ml_collections.ConfigDict, workdir: str, *, split: str = "test",
                 step: int | None = None, weights: str | None = None,
                 devices: list[jax.Device] | None = None) -> dict[str, Any]:
  """Evaluates a trained run and writes `metrics.json` and plots (see the module docstring).

  Args:
    config: the config the run was trained with.
    workdir: the run's work directory (with `checkpoints/`); with `weights`, only where the
      results go (no checkpoint is read).
    split: `test` or `val`: the split to report.
    step: checkpoint step (default: newest); not used with `weights`.
    weights: a weight file to evaluate instead of the run's checkpoint: our variables file or
      a PyTorch / safetensors file of the config's model (`builders.weight_file_variables`).
    devices: devices of the mesh (default: all).

  Returns:
    The dict written to `metrics.json`: run identification, `fit` (temperature, p-norm and the
    fit split's NLL before/after; `temperature_grid` with `eval.temperature_grid`),
    `pre_temperature` and `post_temperature` (calibration and MSP-selective metrics; also
    `post_temperature_grid` at the grid temperature), `selective` (per confidence score),
    optional `context`, `files`; `step` is None and `weights` the file's absolute path when
    `weights` is given.

  Raises:
    FileNotFoundError: no checkpoint in `workdir` (without `weights`), or no `weights` file.
    builders.WeightFileError: a `weights` file that does not fit the config's model.
  """
  config_validation.validate(config, num_devices=len(devices) if devices else None)
  meta = builders.dataset_meta(config)
  mesh = parallel.make_mesh(devices)
  model = builders.build_model(config, meta)
  example = builders.example_input(config)
  if weights:
    variables = builders.weight_file_variables(config, weights, model, example, mesh)
    source = {"step": None, "weights": os.path.abspath(os.path.expanduser(weights))}
  else:
    variables, ckpt_step = restore_variables(config, workdir, model, mesh, example, step)
    source = {"step": ckpt_step}
  report = CalibrationReport(config, model, mesh, meta, split)
  results = {**source, **report.run(variables)}
  if jax.process_index() == 0:
    results["files"] = report.write(eval_dir(workdir, split))
    with open(os.path.join(eval_dir(workdir, split), RESULTS_FILE), "w") as f:
      json.dump(results, f, indent=2, sort_keys=True)
  return results


def format_table(results: dict[str, Any]) -> str:
  """A plain-text summary of `evaluate_run`'s results: PreT/PosT metrics and selective scores."""
  pre, post = results["pre_temperature"], results["post_temperature"]
  fit = results["fit"]
  lines = [f"{results['dataset']} / {results['model']} / {results['loss']} — split "
           f"{results['split']}, "
           + (f"weights {results['weights']}" if results.get("weights")
              else f"step {results['step']}") + f", {pre['num_samples']} samples",
           f"temperature T = {fit['temperature']:.3f} and p-norm p = {fit['pnorm']} fitted on "
           f"{fit['split']} ({fit['num_samples']} samples)",
           "", f"{'metric':<22}{'PreT':>10}{'PosT':>10}"]
  for key in CALIBRATION_KEYS + ("miou",):
    if key in pre:
      lines.append(f"{key:<22}{pre[key]:>10.4f}{post[key]:>10.4f}")
  lines += ["", f"{'score':<18}{'AURC':>10}{'E-AURC':>10}{'AUGRC':>10}"]
  for name, table in results["selective"].items():
    lines.append(f"{name:<18}{table['aurc']:>10.4f}{table['eaurc']:>10.4f}"
                 f"{table['augrc']:>10.4f}")
  if "context" in results:
    ctx = results["context"]
    lines += ["", f"context-only images: accuracy {ctx['accuracy']:.4f}, mean confidence "
                  f"{ctx['average_confidence']:.4f} (uniform {ctx['uniform_confidence']:.4f}), "
                  f"mean entropy {ctx['mean_entropy']:.4f}"]
  return "\n".join(lines + map_report.format_lines(results))
