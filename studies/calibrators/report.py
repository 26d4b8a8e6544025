"""The calibrators study's numbers and its Markdown report, from the saved logits.

For each model (training loss) and each post-hoc calibrator of `calib_jax.posthoc` (and none):
the calibrator is fitted on the first half of the held-out validation split; the test split's
accuracy, NLL, ECE (15 bins) and smooth ECE come with 95 % bootstrap intervals (1000
resamples). Split-conformal sets (APS, randomised; and THR) at α = 0.1 are calibrated on the
second half of the validation split, on the calibrated probabilities, so the calibrator's fit
and the conformal threshold never see the same examples; the test split gives their coverage
and mean size.
"""
import functools
import json
import os
from typing import Any

import numpy as np

from studies.calibrators import run

CALIBRATORS = ("none", "temperature", "vector", "matrix", "dirichlet", "isotonic", "histogram")
CONFORMAL = (("aps", 0.1), ("thr", 0.1), ("aps", 0.05))
REPORT_FILE = "calibrators.md"
NUMBERS_FILE = os.path.join("calibrators", "results.json")


def _interval(metric_fn, probs, labels, key) -> dict[str, float]:
  from calib_jax import metrics
  result = metrics.bootstrap(metric_fn, probs, labels, num_samples=1000, key=key)
  return {k: float(v) for k, v in result.items() if k in ("value", "lower", "upper")}


def evaluate_model(arrays: dict[str, np.ndarray], seed: int = 0) -> dict[str, Any]:
  """Every calibrator's test metrics and conformal rows for one model's logits."""
  import jax
  import jax.numpy as jnp
  from calib_jax import conformal, metrics, posthoc
  val_logits, val_labels = arrays["val_logits"], arrays["val_labels"]
  half = len(val_labels) // 2
  fit_logits, fit_labels = val_logits[:half], val_labels[:half]
  conf_logits, conf_labels = val_logits[half:], val_labels[half:]
  test_logits, test_labels = arrays["test_logits"], arrays["test_labels"]
  key = jax.random.key(seed)
  # One function object for every calibrator: the bootstrap's program is keyed by it, so a new
  # partial per calibrator would be traced and lowered again each time.
  ece_15 = functools.partial(metrics.ece, num_bins=15)
  rows = {}
  for name in CALIBRATORS:
    if name == "none":
      calibrate = lambda logits: jax.nn.softmax(jnp.asarray(logits), -1)  # noqa: E731
    else:
      calibrate = posthoc.fit_calibrator(name, fit_logits, fit_labels)
    probs = np.asarray(calibrate(test_logits), np.float32)
    row = {
        "accuracy": float(np.mean(probs.argmax(-1) == test_labels)),
        "nll": float(-np.mean(np.log(np.clip(probs[np.arange(len(test_labels)),
                                                   test_labels], 1e-12, 1.0)))),
        "ece": _interval(ece_15, probs, test_labels, key),
        "smooth_ece": _interval(metrics.smooth_ece, probs, test_labels, key),
    }
    conf_probs = np.asarray(calibrate(conf_logits), np.float32)
    for method, alpha in CONFORMAL:
      # Conformal sets from the calibrated probabilities (log-probabilities as logits).
      predictor = conformal.fit(method, np.log(np.maximum(conf_probs, 1e-30)), conf_labels,
                                alpha=alpha)
      sets = predictor(np.log(np.maximum(probs, 1e-30)))
      row[f"{method}_{alpha:g}"] = {
          "coverage": float(conformal.coverage(sets, test_labels)),
          "mean_set_size": float(conformal.mean_set_size(sets))}
    rows[name] = row
  return rows


def _cell(entry: dict[str, float]) -> str:
  return (f"{100 * entry['value']:.2f} [{100 * entry['lower']:.2f}, "
          f"{100 * entry['upper']:.2f}]")


def _answers(results: dict[str, dict[str, Any]]) -> list[str]:
  """The study's two questions answered from the numbers (so a rerun rewrites the answers)."""
  def best(rows):
    return min((n for n in rows if n != "none"), key=lambda n: rows[n]["ece"]["value"])

  winners = {loss: best(rows) for loss, rows in results.items()}
  common = max(winners.values(), key=list(winners.values()).count)  # ties: the first loss's
  others = [f"{loss} ({name})" for loss, name in winners.items() if name != common]
  # Intervals of the winner that overlap the runner-up's: the ranking is within the noise.
  overlapping = []
  for loss, rows in results.items():
    ranked = sorted((n for n in rows if n != "none"), key=lambda n: rows[n]["ece"]["value"])
    first, second = rows[ranked[0]]["ece"], rows[ranked[1]]["ece"]
    if first["upper"] >= second["lower"]:
      overlapping.append(f"{loss} ({ranked[0]} vs {ranked[1]})")
  smooth_wins = sum(
      min((n for n in rows if n != "none"), key=lambda n: rows[n]["smooth_ece"]["value"])
      == common for rows in results.values())
  sizes = {loss: rows["none"]["aps_0.1"]["mean_set_size"] for loss, rows in results.items()}
  scaled = {loss: rows["temperature"]["aps_0.1"]["mean_set_size"]
            for loss, rows in results.items()}
  smallest, largest = min(sizes, key=sizes.get), max(sizes, key=sizes.get)
  lines = [
      "## What it says",
      "",
      f"- **Best calibrator by test ECE:** {common} after "
      f"{', '.join(l for l, n in winners.items() if n == common)}"
      + (f"; {', '.join(others)}" if others else "") + ". "
      + (f"The winner's 95 % interval overlaps the runner-up's for {', '.join(overlapping)}: "
         "on 10,000 test images those rankings are within the bootstrap noise. "
         if overlapping else "")
      + f"By smooth ECE, which does not depend on where bins fall, {common} is best after "
      f"{smooth_wins} of {len(results)} losses. Histogram binning outputs only as many "
      "confidence levels as it has bins, which costs NLL (the tables: e.g. "
      + ", ".join(f"{loss} {rows['histogram']['nll']:.3f} vs temperature "
                  f"{rows['temperature']['nll']:.3f}" for loss, rows in list(results.items())[:2]
                  if "histogram" in rows) + ").",
      f"- **Conformal set size at 90 % (APS, no calibrator):** smallest after {smallest} "
      f"({sizes[smallest]:.3f}), largest after {largest} ({sizes[largest]:.3f}); "
      + ", ".join(f"{loss} {size:.3f}" for loss, size in sizes.items()) + ". "
      + ("The calibration losses do not give smaller sets than CE: "
         if "CE" in sizes and sizes["CE"] <= min(sizes.values()) + 1e-9 else "")
      + "APS adds classes until their probabilities sum past a threshold, so the sets grow as "
      "the model's probabilities spread out; every row still covers about 90 % (the coverage "
      "column; with 5,000 calibration samples a run's coverage varies by about ±0.004). "
      "After temperature "
      "scaling the order changes: " + ", ".join(f"{loss} {size:.3f}"
                                                 for loss, size in scaled.items())
      + ". THR sets, which minimise the mean size for the coverage, are within "
      f"{max(r['none']['thr_0.1']['mean_set_size'] for r in results.values()) - min(r['none']['thr_0.1']['mean_set_size'] for r in results.values()):.3f} "
      "of each other for every loss.",
  ]
  return lines


def markdown(results: dict[str, dict[str, Any]], seeds: list[int]) -> str:
  """The report: the best calibrator per loss, then the full tables."""
  lines = [
      "# Post-hoc calibrators and conformal sets after each training loss (Fashion-MNIST)",
      "",
      "Produced by `python -m studies.calibrators` (see `studies/calibrators/`). Models: the "
      "label-relaxation Table 1 study's MLP recipe with the values its report chose for ECE "
      "(LS ε = 0.025, LR α = 0.3, MbLS m = 6; CE and ACLS untuned), trained on the first "
      "50,000 training images, seed " + ", ".join(map(str, seeds)) + ". Each calibrator is "
      "fitted on the first 5,000 of the 10,000 held-out training images; conformal thresholds "
      "are calibrated on the other 5,000 (after the calibrator); everything is measured on "
      "the 10,000 test images. ECE (15 equal-width bins) and smooth ECE (Błasiok & Nakkiran "
      "2023) in %, with 95 % bootstrap intervals (1000 resamples).",
      "",
      "## Which calibrator is best after each loss",
      "",
      "| loss | ECE before | best by ECE | ECE after | best by smooth ECE | smooth ECE after |",
      "|---|---:|---|---:|---|---:|",
  ]
  for loss, rows in results.items():
    by_ece = min((n for n in rows if n != "none"), key=lambda n: rows[n]["ece"]["value"])
    by_smooth = min((n for n in rows if n != "none"),
                    key=lambda n: rows[n]["smooth_ece"]["value"])
    lines.append(f"| {loss} | {_cell(rows['none']['ece'])} | {by_ece} | "
                 f"{_cell(rows[by_ece]['ece'])} | {by_smooth} | "
                 f"{_cell(rows[by_smooth]['smooth_ece'])} |")
  lines += ["", "## Conformal sets at 90 % target coverage (APS, randomised)", "",
            "| loss | mean set size (no calibrator) | coverage | mean set size (after "
            "temperature) | coverage | THR mean set size (no calibrator) | coverage |",
            "|---|---:|---:|---:|---:|---:|---:|"]
  for loss, rows in results.items():
    aps, aps_t, thr = rows["none"]["aps_0.1"], rows["temperature"]["aps_0.1"], rows["none"]["thr_0.1"]
    lines.append(f"| {loss} | {aps['mean_set_size']:.3f} | {aps['coverage']:.3f} | "
                 f"{aps_t['mean_set_size']:.3f} | {aps_t['coverage']:.3f} | "
                 f"{thr['mean_set_size']:.3f} | {thr['coverage']:.3f} |")
  lines += ["", *_answers(results)]
  lines += ["", "## Every calibrator", ""]
  for loss, rows in results.items():
    lines += [f"### {loss}", "",
              "| calibrator | accuracy | NLL | ECE % [95 %] | smooth ECE % [95 %] | APS 90 %: "
              "size / coverage | APS 95 %: size / coverage |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
      a1, a5 = row["aps_0.1"], row["aps_0.05"]
      lines.append(f"| {name} | {row['accuracy']:.4f} | {row['nll']:.4f} | "
                   f"{_cell(row['ece'])} | {_cell(row['smooth_ece'])} | "
                   f"{a1['mean_set_size']:.3f} / {a1['coverage']:.3f} | "
                   f"{a5['mean_set_size']:.3f} / {a5['coverage']:.3f} |")
    lines.append("")
  return "\n".join(lines)


def write(workdir: str, out_dir: str, seeds: list[int]) -> str:
  """Evaluates every model with saved logits (first seed) and writes the report and numbers.

  A model whose logits are not in `workdir` (trained on another machine: the workdir is not
  committed, the numbers are) keeps its entry of the committed `NUMBERS_FILE`, so the study
  can be completed one model at a time."""
  numbers = os.path.join(out_dir, NUMBERS_FILE)
  committed = {}
  if os.path.exists(numbers):
    with open(numbers, encoding="utf-8") as f:
      committed = json.load(f)
  results = {}
  seed = seeds[0]
  for name, _ in run.MODELS:
    path = os.path.join(run.run_dir(workdir, name, seed), run.LOGITS_FILE)
    if os.path.exists(path):
      with np.load(path) as saved:
        results[name] = evaluate_model(dict(saved), seed)
    elif name in committed:
      results[name] = committed[name]
  os.makedirs(os.path.dirname(numbers), exist_ok=True)
  with open(numbers, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  target = os.path.join(out_dir, REPORT_FILE)
  with open(target, "w", encoding="utf-8") as f:
    f.write(markdown(results, [seed]) + "\n")
  return target
