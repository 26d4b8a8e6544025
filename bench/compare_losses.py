"""Loss comparison on offline data: every loss of `configs/compare.py` on several seeds.

    .venv/bin/python bench/compare_losses.py --out_dir=docs/results \
        [--workdir=workdirs/compare] [--seeds=0,1,2] [--datasets=fashion_mnist,clutter_objects] \
        [--losses=ce,mbls,acls]

Each run trains into `<workdir>/<dataset>/<loss>/seed<k>` with the library's own
`train_and_evaluate` and is evaluated with `evaluate_run` (temperature and p-norm fitted on the
validation split, metrics on the test split). A run whose `eval_test/metrics.json` exists is not
retrained (delete its directory to redo it), so an interrupted study continues where it stopped.

Writes to `--out_dir`:
* `results.md`: per dataset, mean ± std over seeds (sample std) of accuracy, ECE, AECE,
  classwise ECE, NLL before and after temperature scaling, the fitted T, the selective metrics
  (AURC, E-AURC, coverage at 5 % risk) of MSP, max logit and max-logit p-norm, context-only
  confidence where evaluated, and the papers' claims checked seed by seed;
* `reliability_<dataset>.png`: CE vs MbLS vs ACLS reliability diagrams (first seed), PreT.
Not a test: it trains models and prints numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "compare.py")
DISPLAY = {"ce": "CE", "ls": "LS", "focal": "FL", "flsd": "FLSD", "ecp": "ECP", "mbls": "MbLS",
           "acls": "ACLS", "lr": "LR", "als": "ALS", "als_context": "ALS + context"}
RELIABILITY_LOSSES = ("ce", "mbls", "acls")

Results = dict[str, Any]  # one run's metrics.json


# ----------------------------------------------------------------------------- running


def run_dir(workdir: str, dataset: str, loss: str, seed: int) -> str:
  return os.path.join(workdir, dataset, loss, f"seed{seed}")


def train_and_evaluate_cell(workdir: str, dataset: str, loss: str, seed: int) -> Results:
  """Trains and evaluates one (dataset, loss, seed) run, or re-reads a finished one.

  A run whose loss or gradient became non-finite is recorded (`diverged.json`, and
  `{"diverged": message}` returned) instead of stopping the study.
  """
  from calib_jax import config as config_lib
  from calib_jax.evaluation import run as evaluate
  from calib_jax.training import loop

  path = os.path.abspath(run_dir(workdir, dataset, loss, seed))
  metrics_file = os.path.join(evaluate.eval_dir(path, "test"), evaluate.RESULTS_FILE)
  timing_file = os.path.join(path, "timing.json")
  diverged_file = os.path.join(path, "diverged.json")
  if not os.path.exists(metrics_file) and not os.path.exists(diverged_file):
    config = config_lib.load_config_file(f"{CONFIG}:{dataset},{loss}")
    config.seed = seed
    start = time.monotonic()
    try:
      loop.train_and_evaluate(config, path)
    except loop.NonFiniteLossError as e:
      with open(diverged_file, "w") as f:
        json.dump({"diverged": str(e), "train_s": time.monotonic() - start}, f)
    else:
      trained = time.monotonic()
      evaluate.evaluate_run(config, path, split="test")
      with open(timing_file, "w") as f:
        json.dump({"train_s": trained - start, "eval_s": time.monotonic() - trained}, f)
  if os.path.exists(diverged_file):
    with open(diverged_file) as f:
      record = json.load(f)
    return {"diverged": record["diverged"], "timing": {"train_s": record["train_s"]}}
  with open(metrics_file) as f:
    results = json.load(f)
  if os.path.exists(timing_file):
    with open(timing_file) as f:
      results["timing"] = json.load(f)
  return results


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
  """Writes `results.md` and the reliability figures; returns the report text."""
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
  with open(os.path.join(out_dir, "results.md"), "w") as f:
    f.write(text)
  return text


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join("workdirs", "compare"))
  parser.add_argument("--out_dir", default=None, help="report directory (default: workdir)")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--datasets", default="fashion_mnist,clutter_objects")
  parser.add_argument("--losses", default="", help="subset of losses (default: all)")
  args = parser.parse_args(argv)

  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  from calib_jax import config as config_lib
  study = config_lib.load_config_module(CONFIG)

  seeds = [int(s) for s in args.seeds.split(",") if s]
  datasets = [d for d in args.datasets.split(",") if d]
  wanted = [loss for loss in args.losses.split(",") if loss]
  for dataset in datasets:
    if dataset not in study.LOSSES:
      parser.error(f"unknown dataset {dataset!r}; valid: {', '.join(study.LOSSES)}")
  start = time.monotonic()
  all_runs: dict[str, dict[str, list[Results]]] = {}
  for dataset in datasets:
    losses = [loss for loss in study.LOSSES[dataset] if not wanted or loss in wanted]
    for loss in losses:
      for seed in seeds:
        tick = time.monotonic()
        results = train_and_evaluate_cell(args.workdir, dataset, loss, seed)
        results["seed"] = seed
        all_runs.setdefault(dataset, {}).setdefault(loss, []).append(results)
        if "diverged" in results:
          summary = results["diverged"].splitlines()[0]
        else:
          pre = results["pre_temperature"]
          summary = f"acc {pre['accuracy']:.4f} ECE {pre['ece']:.4f} AURC {pre['aurc']:.4f}"
        print(f"{dataset:<16}{loss:<12}seed {seed}: {summary} "
              f"({time.monotonic() - tick:.0f} s)", flush=True)
  command = "python bench/compare_losses.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
  text = write_report(args.workdir, args.out_dir or args.workdir, all_runs, seeds,
                      command.strip())
  print(f"({time.monotonic() - start:.0f} s for this invocation)")
  print("\n" + text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
