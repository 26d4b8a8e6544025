"""The report of the loss-comparison study (`python -m studies.compare`): mean ± std over seeds
of each metric, the papers' claims checked seed by seed, and the reliability figures, from the
runs' `metrics.json`. It trains nothing.
"""
from __future__ import annotations

import os
import platform
import re
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from studies.compare.run import Results, run_dir

DISPLAY = {"ce": "CE", "ls": "LS", "focal": "FL", "flsd": "FLSD", "ecp": "ECP", "mbls": "MbLS",
           "acls": "ACLS", "lr": "LR", "als": "ALS", "als_context": "ALS + context"}
RELIABILITY_LOSSES = ("ce", "mbls", "acls")


# ----------------------------------------------------------------------------- runs


def finished(results: Sequence[Results]) -> list[Results]:
  return [r for r in results if "diverged" not in r]


def divergence_note(results: Sequence[Results]) -> str:
  """'' if every seed finished, else e.g. 'diverged on 3/3 seeds (step 51, 48, 60)'."""
  bad = [r for r in results if "diverged" in r]
  if not bad:
    return ""
  steps = [m.group(1) if (m := re.search(r"at step (\d+)", r["diverged"])) else "?" for r in bad]
  return f"diverged on {len(bad)}/{len(results)} seeds (step {', '.join(steps)})"


# ----------------------------------------------------------------------------- metrics


def _pre(key: str) -> Callable[[Results], float]:
  return lambda r: r["pre_temperature"][key]


def _post(key: str) -> Callable[[Results], float]:
  return lambda r: r["post_temperature"][key]


def _selective(score: str, key: str) -> Callable[[Results], float]:
  return lambda r: r["selective"][score][key]


@dataclass(frozen=True)
class Column:
  header: str
  value: Callable[[Results], float]
  scale: float = 100.0  # most metrics are shown in %
  digits: int = 2


CALIBRATION_COLUMNS = (
    Column("Acc %", _pre("accuracy")),
    Column("ECE %", _pre("ece")),
    Column("AECE %", _pre("aece")),
    Column("cw-ECE %", _pre("classwise_ece")),
    Column("NLL", _pre("nll"), 1.0, 3),
    Column("T", lambda r: r["fit"]["temperature"], 1.0),
    Column("ECE PosT %", _post("ece")),
    Column("AECE PosT %", _post("aece")),
    Column("cw-ECE PosT %", _post("classwise_ece")),
    Column("NLL PosT", _post("nll"), 1.0, 3),
)
SELECTIVE_COLUMNS = (
    Column("AURC % (MSP)", _selective("msp", "aurc")),
    Column("E-AURC % (MSP)", _selective("msp", "eaurc")),
    Column("Cov@5%risk % (MSP)", _selective("msp", "coverage_at_5pct_risk")),
    Column("AURC % PosT (MSP)", _post("aurc")),
    Column("AURC % (max logit)", _selective("max_logit", "aurc")),
    Column("AURC % (p-norm)", _selective("max_logit_pnorm", "aurc")),
    Column("Cov@5%risk % (p-norm)", _selective("max_logit_pnorm", "coverage_at_5pct_risk")),
)
CONTEXT_COLUMNS = (
    Column("context acc %", lambda r: r["context"]["accuracy"]),
    Column("context mean conf %", lambda r: r["context"]["average_confidence"]),
    Column("context entropy (nats)", lambda r: r["context"]["mean_entropy"], 1.0, 3),
)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for a single value)."""
  values = [float(v) for v in values]
  return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def format_cell(values: Sequence[float], scale: float, digits: int) -> str:
  mean, std = mean_std([v * scale for v in values])
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(runs: dict[str, list[Results]], columns: Sequence[Column]) -> str:
  """One row per loss: mean ± std over its seeds of each column."""
  lines = ["| loss | " + " | ".join(c.header for c in columns) + " |",
           "|---|" + "---:|" * len(columns)]
  for loss, results in runs.items():
    name, note, done = DISPLAY.get(loss, loss), divergence_note(results), finished(results)
    if not done:
      lines.append(f"| {name} | {note} |" + " |" * (len(columns) - 1))
      continue
    cells = [format_cell([c.value(r) for r in done], c.scale, c.digits) for c in columns]
    lines.append(f"| {name}{f' ({note})' if note else ''} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def pnorm_choices(runs: dict[str, list[Results]]) -> str:
  """Which p the validation split picked per seed (`MSP` where no p beat MSP)."""
  parts = []
  for loss, results in runs.items():
    results = finished(results)
    if not results:
      continue
    chosen = ["MSP" if r["fit"]["pnorm"] is None else f"{r['fit']['pnorm']:g}" for r in results]
    parts.append(f"{DISPLAY.get(loss, loss)}: {', '.join(chosen)}")
  return "; ".join(parts)


# ----------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Claim:
  """`metric(better run) < worse_metric(worse run)` on each seed (paired by seed) is what the
  paper says; `worse_metric` defaults to `metric` (it differs when two scores of the same runs
  are compared)."""
  paper: str
  text: str
  better: str
  worse: str
  metric: Callable[[Results], float]
  scale: float = 100.0
  worse_metric: Callable[[Results], float] | None = None


CLAIMS = (
    Claim("MbLS", "MbLS has lower ECE than CE", "mbls", "ce", _pre("ece")),
    Claim("MbLS", "MbLS has lower ECE than LS", "mbls", "ls", _pre("ece")),
    Claim("MbLS", "MbLS has lower ECE than focal loss", "mbls", "focal", _pre("ece")),
    Claim("MbLS", "MbLS is more accurate than CE (lower error)", "mbls", "ce",
          lambda r: 1.0 - r["pre_temperature"]["accuracy"]),
    Claim("ACLS", "ACLS has lower ECE than MbLS", "acls", "mbls", _pre("ece")),
    Claim("ACLS", "ACLS has lower ECE than CE", "acls", "ce", _pre("ece")),
    Claim("LR", "LR has lower ECE than CE", "lr", "ce", _pre("ece")),
    Claim("LR", "LR has lower ECE than LS", "lr", "ls", _pre("ece")),
    Claim("LR", "LR has lower NLL than CE", "lr", "ce", _pre("nll"), 1.0),
    Claim("LS-vs-SC", "CE has lower MSP AURC than LS (LS hurts selective classification)",
          "ce", "ls", _selective("msp", "aurc")),
    Claim("LS-vs-SC", "LS: max-logit p-norm has lower AURC than MSP", "ls", "ls",
          _selective("max_logit_pnorm", "aurc"), worse_metric=_selective("msp", "aurc")),
    Claim("ALS", "ALS has lower ECE than CE", "als", "ce", _pre("ece")),
    Claim("ALS", "ALS has lower ECE than LS", "als", "ls", _pre("ece")),
    Claim("ALS", "ALS + context is less confident than CE on context-only images", "als_context",
          "ce", lambda r: r["context"]["average_confidence"]),
    Claim("ALS", "ALS + context is less confident than ALS on context-only images",
          "als_context", "als", lambda r: r["context"]["average_confidence"]),
)


def _claim_values(claim: Claim, runs: dict[str, list[Results]]) -> tuple[list[float],
                                                                          list[float]]:
  worse_metric = claim.worse_metric or claim.metric
  better = {r["seed"]: claim.metric(r) for r in runs[claim.better]}
  worse = {r["seed"]: worse_metric(r) for r in runs[claim.worse]}
  seeds = sorted(better.keys() & worse.keys())
  return [better[s] for s in seeds], [worse[s] for s in seeds]


def check_claim(claim: Claim, runs: dict[str, list[Results]]) -> dict[str, Any] | None:
  """Paired per-seed differences `better - worse` (negative supports the claim) and a verdict:
  `supported` (every seed), `not supported` (no seed), `no difference` (identical on every
  seed), else `mixed`. None if a side is missing."""
  runs = {loss: finished(results) for loss, results in runs.items()}
  if not runs.get(claim.better) or not runs.get(claim.worse):
    return None
  better, worse = _claim_values(claim, runs)
  if not better:
    return None
  diffs = [(b - w) * claim.scale for b, w in zip(better, worse)]
  wins = sum(d < 0 for d in diffs)
  if all(d == 0 for d in diffs):
    verdict = "no difference"  # e.g. p-norm selection fell back to MSP on every seed
  else:
    verdict = ("supported" if wins == len(diffs) else "not supported" if wins == 0 else "mixed")
  mean, std = mean_std(diffs)
  return {"paper": claim.paper, "claim": claim.text, "diff_mean": mean, "diff_std": std,
          "wins": wins, "seeds": len(diffs), "verdict": verdict,
          "unit": "%" if claim.scale == 100.0 else ""}


def claims_table(runs: dict[str, list[Results]]) -> str:
  lines = ["| paper | claim | difference (mean ± std) | seeds agreeing | verdict |",
           "|---|---|---:|---:|---|"]
  for claim in CLAIMS:
    checked = check_claim(claim, runs)
    if checked is None:
      untestable = [DISPLAY[loss] for loss in {claim.better, claim.worse}
                    if loss in runs and not finished(runs[loss])]
      if untestable:
        lines.append(f"| {claim.paper} | {claim.text} | — | — | not testable: "
                     f"{' and '.join(untestable)} diverged |")
      continue
    unit = " pt" if checked["unit"] == "%" else ""
    lines.append(f"| {checked['paper']} | {checked['claim']} | {checked['diff_mean']:+.2f} ± "
                 f"{checked['diff_std']:.2f}{unit} | {checked['wins']}/{checked['seeds']} | "
                 f"{checked['verdict']} |")
  return "\n".join(lines)


# ----------------------------------------------------------------------------- report


def reliability_figure(workdir: str, dataset: str, seed: int, out_dir: str) -> str | None:
  """CE vs MbLS vs ACLS reliability diagrams of one seed (PreT), from `predictions.npz`."""
  import numpy as np

  from calib_jax import plotting
  from calib_jax.evaluation import report, run as evaluate

  models = {}
  for loss in RELIABILITY_LOSSES:
    path = os.path.join(evaluate.eval_dir(run_dir(workdir, dataset, loss, seed), "test"),
                        report.PREDICTIONS_FILE)
    if os.path.exists(path):
      saved = np.load(path)
      models[DISPLAY[loss]] = (saved["probs_pre"], saved["labels"])
  if not models:
    return None
  return plotting.reliability_diagrams(
      models, os.path.join(out_dir, f"reliability_{dataset}.png"),
      title=f"{dataset}, seed {seed}, test split, before temperature scaling")


def dataset_section(dataset: str, runs: dict[str, list[Results]]) -> str:
  first = next(r for results in runs.values() for r in finished(results))
  sizes = f"{first['pre_temperature']['num_samples']} test samples"
  parts = [f"### {dataset} ({first['model']}, {sizes})", "",
           "Calibration before and after temperature scaling (T fitted on validation NLL):", "",
           markdown_table(runs, CALIBRATION_COLUMNS), "",
           "Selective classification (PreT unless marked):", "",
           markdown_table(runs, SELECTIVE_COLUMNS), "",
           f"p-norm picked on validation per seed — {pnorm_choices(runs)}.", ""]
  if all("context" in r for results in runs.values() for r in finished(results)):
    uniform = first["context"]["uniform_confidence"] * 100
    parts += [f"Context-only test images (objects filled with the mean pixel; uniform "
              f"confidence = {uniform:.0f} %):", "", markdown_table(runs, CONTEXT_COLUMNS), ""]
  return "\n".join(parts)


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def write_report(workdir: str, out_dir: str, all_runs: dict[str, dict[str, list[Results]]],
                 seeds: Sequence[int], command: str) -> str:
  """Writes `compare.md` and the reliability figures; returns the report text."""
  os.makedirs(out_dir, exist_ok=True)
  train_s = sum(r.get("timing", {}).get("train_s", 0.0) + r.get("timing", {}).get("eval_s", 0.0)
                for runs in all_runs.values() for results in runs.values() for r in results)
  parts = ["## Results", "",
           f"Produced by `{command}` ({len(seeds)} seeds: {', '.join(map(str, seeds))}; "
           f"{sum(len(r) for runs in all_runs.values() for r in runs.values())} runs, "
           f"{train_s / 60:.0f} min of training + evaluation on {os.cpu_count()} CPU cores, "
           f"{cpu_name()}). Mean ± sample std over seeds.", ""]
  for dataset, runs in all_runs.items():
    parts.append(dataset_section(dataset, runs))
    figure = reliability_figure(workdir, dataset, seeds[0], out_dir)
    if figure:
      parts += [f"![CE vs MbLS vs ACLS on {dataset}]({os.path.basename(figure)})", ""]
  parts += ["### The papers' claims, checked seed by seed", "",
            "Difference = metric(first-named) − metric(second-named) on the same seed; "
            "negative supports the claim.", ""]
  for dataset, runs in all_runs.items():
    parts += [f"{dataset}:", "", claims_table(runs), ""]
  text = "\n".join(parts)
  with open(os.path.join(out_dir, "compare.md"), "w") as f:
    f.write(text)
  return text
