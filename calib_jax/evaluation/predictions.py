"""Any model's predictions: the calibration report from logits alone, no config or model.

    results = calib_jax.evaluate_predictions(val_logits, val_labels, test_logits, test_labels,
                                             ood_logits=None)
    python eval.py --predictions=preds.npz --workdir=DIR    # DIR/eval_predictions/metrics.json

The validation split fits; the test split is reported:

* `calibrators`: for the raw logits (`"raw"`) and each post-hoc calibrator named in
  `calibrators` (`posthoc.fit_calibrator`, fitted on val): the test split's `accuracy`, `ece`,
  `aece`, `smooth_ece`, `rms_ece`, `nll`, `brier` and `aurc` (of the calibrated maximum
  probability), and 95 % bootstrap percentile intervals of `ece`, `smooth_ece` and `aurc`
  (`metrics.bootstrap`, `bootstrap_samples` resamples; `{value, lower, upper, std}`);
  `conformal`: split-conformal THR, APS, RAPS and SAPS sets (`conformal.fit` on val with the
  library's defaults: APS, RAPS and SAPS randomised, RAPS with λ = 0.01, k_reg = 5), each also class-conditional (Mondrian, `<name>-class`),
  at each `alpha` (keys `thr@0.1`, `thr-class@0.1`, ...), with their test `coverage`,
  `mean_set_size` and `worst_class_coverage` (the lowest coverage of a class);
* `skipped` (only when something was): a calibrator that refused to fit on this few
  validation samples (`posthoc.TooFewSamplesError`: vector, matrix and Dirichlet scaling need
  10 per free parameter), or conformal sets at an alpha that needs more of them
  (`conformal@<alpha>`: n ≥ 1/alpha − 1; `conformal-class@<alpha>`: as many in every class),
  left out with the one-line reason here; the rest is reported;
* `failure`: detecting the wrong test predictions (the positives) by a low confidence score,
  `metrics.detection`'s convention: `auroc`, `aupr` and `fpr_at_95_tpr` (the share of correct
  predictions flagged when 95 % of the wrong ones are) for the scores `msp`, `max_logit`,
  `neg_entropy`, `energy` (not for an ensemble: constant on its `log p̄`) and `pnorm`
  (`max_logit_pnorm` with the p fitted on val by AURC, or the MSP where no p beats it:
  `pnorm_p` says which);
* `ood` (with `ood_logits`): detecting the OOD samples (positives) among the test split and the
  OOD set by the same scores: `auroc`, `aupr` (AUPR-Out) and `fpr_at_95_tpr` (the share of test
  samples flagged when 95 % of the OOD set is);
* `ensemble` and more scores, for member-stacked logits `[M, N, C]`: `evaluation.ensembles`.

Bad inputs raise `PredictionsError` (a `ValueError`), one line naming the array and the problem.
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import program_store
from calib_jax import conformal, metrics, posthoc
from calib_jax.evaluation import (conformal_sets, ensembles, predictions_intervals,
                                  predictions_plots)
from calib_jax.evaluation.predictions_input import (  # noqa: F401  (this module's API too)
    OPTIONAL, REQUIRED, PredictionsError, check_predictions, load_npz)

DEFAULT_CALIBRATORS = ("temperature", "vector", "isotonic")
CONFORMAL_SETS = conformal_sets.CONFORMAL_SETS
INTERVAL_KEYS = predictions_intervals.INTERVAL_KEYS


@functools.partial(program_store.jit, static_argnames="num_bins")
def _cacheable_test_metrics(probs: jax.Array, labels: jax.Array, num_bins: int):
  """The test split's numbers that need no host sort, one program (each calibrator gives the
  same shapes, so it compiles once per report), and the per-sample top-label confidence and
  correctness that AURC and the bootstrap use. AECE and AURC stay out of it: their host sorts
  (`pure_callback`) embed a per-process pointer, so a program holding them is never found in
  the persistent compilation cache and would recompile this whole program in every process."""
  confidence, correct = metrics.confidence_and_correct(probs, labels)
  values = {
      "accuracy": metrics.accuracy(probs, labels),
      "ece": metrics.ece(probs, labels, num_bins),
      "smooth_ece": metrics.smooth_ece(probs, labels),
      "rms_ece": metrics.rms_calibration_error(probs, labels, num_bins),
      "nll": metrics.nll(probs, labels),
      "brier": metrics.brier(probs, labels),
  }
  return values, confidence, correct


@functools.partial(program_store.jit, static_argnames="num_bins")
def _rank_test_metrics(confidence: jax.Array, correct: jax.Array,
                       num_bins: int) -> dict[str, jax.Array]:
  """`aece` and `aurc` of the test split's top-label `(confidence, correct)`, one program and
  one sort (`metrics.rank_summary`; cached too where the sort is XLA's:
  `metrics.use_cacheable_cpu_sorts`). The same bits as `metrics.aece(probs, labels)` and
  `metrics.aurc(confidence, correct)`, each with its own sort: checked on the bench's digits
  and 50,000 x 1,000 reports (every calibrator, XLA's and numpy's sorts) and tested."""
  summary = metrics.rank_summary(confidence, correct, num_bins=num_bins)
  return {"aece": summary["aece"], "aurc": summary["aurc"]}


def _test_metrics(probs: jax.Array, labels: jax.Array, num_bins: int):
  """`_cacheable_test_metrics`' numbers with `aece` and `aurc` added (`_rank_test_metrics`)."""
  values, confidence, correct = _cacheable_test_metrics(probs, labels, num_bins)
  values = {**values, **_rank_test_metrics(confidence, correct, num_bins)}
  return values, confidence, correct


def confidence_scores(logits: jax.Array, pnorm_p: float | None, *,
                      of_ensemble: bool = False) -> dict[str, jax.Array]:
  """The scores of `failure` and `ood` (higher = more confident / more in-distribution).
  Each is computed on its own, not fused into one program: scores with many near-ties
  (a random forest's logits) would rank differently by a last-bit difference.

  `of_ensemble`: `logits` are an ensemble's `log p̄`, whose `energy` is `logsumexp(log p̄) = 0`
  for every sample: only its rounding would be ranked (an AUROC of noise), so it is left out."""
  scores = {"msp": posthoc.msp(logits), "max_logit": posthoc.max_logit(logits),
            "neg_entropy": posthoc.neg_entropy(logits)}
  if not of_ensemble:
    scores["energy"] = posthoc.energy(logits)
  scores["pnorm"] = (posthoc.msp(logits) if pnorm_p is None
                     else posthoc.max_logit_pnorm(logits, pnorm_p))
  return scores


def _detection(scores: dict[str, jax.Array], positives: jax.Array) -> dict[str, dict[str, Any]]:
  """AUROC, AUPR and FPR at 95 % TPR of each score, dispatched (`_fetched` takes them)."""
  return {name: {"auroc": metrics.auroc(s, positives), "aupr": metrics.aupr(s, positives),
                 "fpr_at_95_tpr": metrics.fpr_at_tpr(s, positives, 0.95)}
          for name, s in scores.items()}


def _fetched(tree: Any) -> Any:
  """`tree` (dicts and lists) with its device values fetched in one `jax.device_get` and every
  array scalar a Python float (float32 values widened exactly), dicts in their own order
  (`jax.tree.map` would sort their keys: the console's rows follow this order)."""
  pending = []

  def mark(x):
    if isinstance(x, dict):
      return {k: mark(v) for k, v in x.items()}
    if isinstance(x, list):
      return [mark(v) for v in x]
    if isinstance(x, jax.Array):
      pending.append(x)
      return _Fetch(len(pending) - 1)
    return x

  marked, values = mark(tree), None

  def fill(x):
    if isinstance(x, dict):
      return {k: fill(v) for k, v in x.items()}
    if isinstance(x, list):
      return [fill(v) for v in x]
    value = values[x.index] if isinstance(x, _Fetch) else x
    return float(value) if isinstance(value, (np.ndarray, np.generic)) else value

  values = jax.device_get(pending)
  return fill(marked)


class _Fetch(NamedTuple):
  index: int  # a device value's place in `_fetched`'s one `device_get`


def evaluate_predictions(val_logits: Any, val_labels: Any, test_logits: Any, test_labels: Any,
                         *, ood_logits: Any = None,
                         calibrators: Sequence[str] = DEFAULT_CALIBRATORS,
                         alphas: Sequence[float] = (0.1, 0.05), num_bins: int = 15,
                         bootstrap_samples: int = 1000, seed: int = 0) -> dict[str, Any]:
  """The report of a model's val/test logits (see the module docstring for every key); the
  arguments and errors are `fit_and_evaluate`'s."""
  return fit_and_evaluate(val_logits, val_labels, test_logits, test_labels,
                          ood_logits=ood_logits, calibrators=calibrators, alphas=alphas,
                          num_bins=num_bins, bootstrap_samples=bootstrap_samples, seed=seed)[0]


def fit_and_evaluate(val_logits: Any, val_labels: Any, test_logits: Any, test_labels: Any,
                     *, ood_logits: Any = None,
                     calibrators: Sequence[str] = DEFAULT_CALIBRATORS,
                     alphas: Sequence[float] = (0.1, 0.05), num_bins: int = 15,
                     bootstrap_samples: int = 1000,
                     seed: int = 0) -> tuple[dict[str, Any], dict[str, posthoc.Calibrator]]:
  """`evaluate_predictions`' report and the calibrators it fitted (by name; those that
  refused to fit are in the report's `skipped`), for `plot_report` to reuse.

  Args:
    val_logits, val_labels: the fit split, `[N_val, C]` and `[N_val]`.
    test_logits, test_labels: the reported split, `[N_test, C]` and `[N_test]`.
    ood_logits: optional `[N_ood, C]` OOD logits (every logits array `[M, N, C]`: an ensemble).
    calibrators: names of `posthoc.calibrator_names()`, each fitted on val.
    alphas: miscoverage levels of the conformal sets (target coverage 1 − alpha).
    num_bins: bins of the binned calibration errors.
    bootstrap_samples: resamples of the intervals (0: no intervals).
    seed: the bootstrap's key.

  Raises:
    PredictionsError: a missing array, a shape mismatch, NaN logits, labels out of range.
    ValueError: an unknown calibrator (with the valid names).
  """
  pending, fitted, resampled = _dispatched(
      val_logits, val_labels, test_logits, test_labels, ood_logits=ood_logits,
      calibrators=calibrators, alphas=alphas, num_bins=num_bins,
      bootstrap_samples=bootstrap_samples, seed=seed)
  predictions_intervals.add_intervals(pending, resampled, num_bins, bootstrap_samples, seed)
  return _fetched(pending), fitted


def _dispatched(val_logits: Any, val_labels: Any, test_logits: Any, test_labels: Any, *,
                ood_logits: Any, calibrators: Sequence[str], alphas: Sequence[float],
                num_bins: int, bootstrap_samples: int, seed: int = 0
                ) -> tuple[dict[str, Any], dict[str, posthoc.Calibrator],
                                        dict[str, tuple[jax.Array, jax.Array]]]:
  """`fit_and_evaluate`'s report, its numbers still on the device (dispatched, not awaited;
  only the conformal sets are awaited per calibrator, so one calibrator's `[N, C]`
  probabilities at a time stay alive), the fitted calibrators, and each calibrator's test
  `(confidence, correct)`. Its intervals are in it only where a spare CPU device computes them
  beside the rest (`predictions_intervals.spare_device`); else
  `predictions_intervals.add_intervals` adds them after the last host wait."""
  arrays, members = ensembles.split_members(check_predictions({  # an ensemble's: its log p̄
      "val_logits": val_logits, "val_labels": val_labels, "test_logits": test_logits,
      "test_labels": test_labels, "ood_logits": ood_logits}))
  unknown = [c for c in calibrators if c not in posthoc.calibrator_names()]
  if unknown:
    raise ValueError(f"unknown calibrator {unknown[0]!r}; valid names: "
                     f"{', '.join(posthoc.calibrator_names())}")
  val_x = jnp.asarray(arrays["val_logits"], jnp.float32)
  test_x = jnp.asarray(arrays["test_logits"], jnp.float32)
  val_y = jnp.asarray(arrays["val_labels"].astype(np.int32))
  test_y = jnp.asarray(arrays["test_labels"].astype(np.int32))
  skipped = {}
  too_few = [a for a in alphas if conformal.min_calibration_size(a) > val_x.shape[0]]
  for alpha in too_few:  # Split conformal cannot reach 1 − alpha on so few samples.
    skipped[f"conformal@{alpha:g}"] = (
        f"{val_x.shape[0]} validation samples are too few for conformal sets at alpha={alpha:g}"
        f" (need >= {conformal.min_calibration_size(alpha)})")
  alphas = [a for a in alphas if a not in too_few]
  class_alphas = []
  for alpha in alphas:  # Mondrian sets need as many samples in every class.
    try:
      conformal.check_class_sizes(arrays["val_labels"], val_x.shape[1], alpha)
      class_alphas.append(alpha)
    except ValueError as e:
      skipped[f"conformal-class@{alpha:g}"] = str(e)
  # One calibrator at a time: its [N, C] probabilities are dropped once its numbers are taken
  # (the bootstrap needs only each test sample's confidence and correctness).
  report, fitted, resampled = {}, {}, {}
  spare = predictions_intervals.spare_device() if bootstrap_samples else None
  if spare is not None:
    keys = dict(zip(INTERVAL_KEYS, predictions_intervals.interval_keys(seed)))
  for name in ("raw",) + tuple(calibrators):
    if name == "raw":
      # Op by op (not one jitted program: that rounds differently, and these are the
      # reported raw numbers).
      val_p, test_p = jax.nn.softmax(val_x, -1), jax.nn.softmax(test_x, -1)
    else:
      try:
        calibrator = posthoc.fit_calibrator(name, val_x, val_y)
      except posthoc.TooFewSamplesError as e:  # Report the others; say why this one is missing.
        skipped[name] = str(e)
        continue
      fitted[name] = calibrator
      val_p, test_p = calibrator(val_x), calibrator(test_x)
    values, confidence, correct = _test_metrics(test_p, test_y, num_bins)
    report[name] = {"test": dict(values)}
    if spare is not None:  # computing there from now on, while the host goes on here
      report[name]["test"]["intervals"] = predictions_intervals.dispatch(
          confidence, correct, values, num_bins, bootstrap_samples, keys, spare)
    report[name]["conformal"] = conformal_sets.conformal_report(val_p, val_y, test_p, test_y,
                                                                alphas, class_alphas)
    del val_p, test_p
    resampled[name] = (confidence, correct)
  pnorm_p = posthoc.select_pnorm(val_x, val_y)
  wrong = np.asarray(arrays["test_logits"]).argmax(-1) != arrays["test_labels"]
  results = {
      "num_val": int(val_x.shape[0]), "num_test": int(test_x.shape[0]),
      "num_classes": int(val_x.shape[1]), "num_bins": num_bins,
      "bootstrap_samples": bootstrap_samples, "calibrators": report,
      "pnorm_p": pnorm_p,
      "failure": _detection(confidence_scores(test_x, pnorm_p, of_ensemble=bool(members)),
                            wrong),
  }
  if skipped:
    results["skipped"] = skipped
  if "ood_logits" in arrays:
    both = np.concatenate([arrays["test_logits"], arrays["ood_logits"]]).astype(np.float32)
    is_ood = np.arange(both.shape[0]) >= test_x.shape[0]
    results["num_ood"] = int(arrays["ood_logits"].shape[0])
    results["ood"] = _detection(confidence_scores(both, pnorm_p, of_ensemble=bool(members)),
                                is_ood)
  results = ensembles.add_to_report(results, members, test_y, wrong, num_bins, _detection)
  return results, fitted, resampled


def format_table(results: dict[str, Any]) -> str:
  """A plain-text summary of `evaluate_predictions`' results."""
  # The intervals' column only where there are intervals (none with bootstrap_samples=0).
  width = 22 if any("intervals" in e["test"] for e in results["calibrators"].values()) else 0
  lines = [f"{results['num_test']} test samples, {results['num_classes']} classes; calibrators "
           f"and conformal sets fitted on {results['num_val']} validation samples", "",
           f"{'calibrator':<14}{'acc':>8}{'ECE':>8}{'  ECE 95 % interval'[:width]:<{width}}"
           f"{'smECE':>8}{'NLL':>8}{'AURC':>8}"]
  for name, entry in results["calibrators"].items():
    t = entry["test"]
    interval = t.get("intervals", {}).get("ece")
    span = f"  [{interval['lower']:.4f}, {interval['upper']:.4f}]" if interval else ""
    lines.append(f"{name:<14}{t['accuracy']:>8.4f}{t['ece']:>8.4f}{span:<{width}}"
                 f"{t['smooth_ece']:>8.4f}{t['nll']:>8.4f}{t['aurc']:>8.4f}")
  # One space at least: a name as long as the column ("conformal-class@0.05") ran into "skipped".
  lines += [f"{name:<13} skipped: {why}" for name, why in results.get("skipped", {}).items()]
  lines += conformal_sets.format_lines(results)
  for part, title in (("failure", "wrong predictions"), ("ood", "OOD vs test")):
    if part in results:
      lines += ["", f"{title:<20}{'AUROC':>8}{'AUPR':>8}{'FPR95':>8}"]
      lines += [f"{name:<20}{d['auroc']:>8.4f}{d['aupr']:>8.4f}{d['fpr_at_95_tpr']:>8.4f}"
                for name, d in results[part].items()]
  return "\n".join(lines + ensembles.format_lines(results))


PREDICTIONS_DIR = "eval_predictions"


def plot_report(out_dir: str, arrays: Mapping[str, np.ndarray], results: dict[str, Any], *,
                reliability_file: str = "reliability.png",
                calibrators: Mapping[str, posthoc.Calibrator] | None = None) -> dict[str, str]:
  """Draws `reliability_file` (the raw test logits beside the calibrator with the lowest test
  ECE: from `calibrators`, `fit_and_evaluate`'s, or refitted on val) and
  `smooth_reliability.png` (the raw logits) into `out_dir`; returns their paths."""
  return predictions_plots.draw(out_dir, predictions_plots.plot_numbers(
      arrays, results, calibrators), reliability_file)


def write_report(out_dir: str, arrays: Mapping[str, np.ndarray], results: dict[str, Any],
                 calibrators: Mapping[str, posthoc.Calibrator] | None = None) -> dict[str, str]:
  """Writes `metrics.json` and the plots of `plot_report` (`reliability.png`,
  `smooth_reliability.png`; `calibrators` as there) to `out_dir`; returns the files written."""
  files = {"metrics": os.path.join(out_dir, "metrics.json"),
           **plot_report(out_dir, arrays, results, calibrators=calibrators)}
  _write_metrics(files, results)
  return files


def _write_metrics(files: dict[str, str], results: dict[str, Any]) -> None:
  with open(files["metrics"], "w") as f:
    json.dump({**results, "files": files}, f, indent=2, sort_keys=True)


def evaluate_and_write(out_dir: str, arrays: Mapping[str, Any],
                       **options: Any) -> tuple[dict[str, Any], dict[str, str]]:
  """`fit_and_evaluate(**arrays, **options)` written as `write_report` writes it; returns
  `(results, files)`. The same numbers and files, sooner: the plots are drawn while the
  bootstrap intervals are still computing (`eval.py --predictions`)."""
  options = {"calibrators": DEFAULT_CALIBRATORS, "alphas": (0.1, 0.05), "num_bins": 15,
             "bootstrap_samples": 1000, "seed": 0, **options}
  pending, _, resampled = _dispatched(
      **{k: arrays.get(k) for k in REQUIRED + OPTIONAL}, **options)
  # Before the intervals on the default device (`predictions_intervals`):
  numbers = predictions_plots.plot_numbers_of(pending, resampled)
  predictions_intervals.add_intervals(pending, resampled, options["num_bins"],
                                      options["bootstrap_samples"], options["seed"])
  files = {"metrics": os.path.join(out_dir, "metrics.json"),
           **predictions_plots.draw(out_dir, numbers, "reliability.png")}  # while they compute
  results = _fetched(pending)
  _write_metrics(files, results)
  return results, files
