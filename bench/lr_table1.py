"""Label relaxation Table 1 (Fashion-MNIST) reproduced, with MbLS and ACLS on the same protocol.

    .venv/bin/python bench/lr_table1.py [--workdir=workdirs/lr_table1] \
        [--out_dir=docs/results] [--seeds=0,1,2] [--max_minutes=M] [--report_only]

Runs the configs of `configs/lr_table1.py` in the order of `plan`: the tuning grids on a
hold-out (seed 0), then for each tuned loss the value best for accuracy and the value best for
ECE, retrained on the whole training set and tested, on every seed; CE, CE + T (grid) and ACLS (with and without
the official clip) need no tuning. One run's summary is written to
`<out_dir>/lr_table1/<variant>/seed<k>.json` when it finishes; a run with a summary is never
redone (the summaries are committed, so the study continues across machines), and a run that
was interrupted resumes from its checkpoint in `--workdir`. `--max_minutes` stops starting new
runs after that long, so the study can be run in chunks. After each run the report
`<out_dir>/label_relaxation_table1.md` and `<out_dir>/lr_table1_reliability.png` are rewritten
from every summary there is. Not a test: it trains models and prints numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "lr_table1.py")
TUNED = ("ls", "ecp", "focal", "lr")
DISPLAY = {"ce": "CE", "ls": "LS", "ecp": "CP", "focal": "FL", "lr": "LR", "mbls": "MbLS",
           "acls": "ACLS"}
# LR paper Table 1, Fashion-MNIST: (accuracy mean, std, ECE mean, std), 10 seeds.
PAPER = {
    ("ce", None): (0.912, 0.003, 0.129, 0.184),
    ("ls", "acc"): (0.915, 0.002, 0.155, 0.128),
    ("ecp", "acc"): (0.911, 0.004, 0.075, 0.005),
    ("focal", "acc"): (0.911, 0.002, 0.062, 0.002),
    ("lr", "acc"): (0.912, 0.003, 0.059, 0.008),
    ("ce_ts", None): (0.908, 0.004, 0.030, 0.003),
    ("ls", "ece"): (0.915, 0.003, 0.016, 0.002),
    ("ecp", "ece"): (0.911, 0.003, 0.072, 0.003),
    ("focal", "ece"): (0.907, 0.003, 0.011, 0.002),
    ("lr", "ece"): (0.911, 0.003, 0.015, 0.003),
}
Summary = dict[str, Any]


def _study():
  from calib_jax.training import config as config_lib
  return config_lib.load_config_module(CONFIG)


def summary_path(out_dir: str, variant: str, seed: int) -> str:
  return os.path.join(out_dir, "lr_table1", variant.replace(",", "_"), f"seed{seed}.json")


def load_summary(out_dir: str, variant: str, seed: int) -> Summary | None:
  path = summary_path(out_dir, variant, seed)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def summarize(results: dict[str, Any], seconds: float) -> Summary:
  """The numbers the report needs from one run's `metrics.json`."""
  pre, post = results["pre_temperature"], results["post_temperature"]
  out = {"split": results["split"], "step": results["step"], "accuracy": pre["accuracy"],
         "ece": pre["ece"], "aece": pre["aece"], "nll": pre["nll"],
         "average_confidence": pre["average_confidence"], "aurc": pre["aurc"],
         "temperature": results["fit"]["temperature"], "ece_post": post["ece"],
         "accuracy_post": post["accuracy"], "seconds": seconds}
  if "post_temperature_grid" in results:
    out["temperature_grid"] = results["fit"]["temperature_grid"]
    out["ece_post_grid"] = results["post_temperature_grid"]["ece"]
  return out


def run_one(variant: str, seed: int, workdir: str, out_dir: str) -> Summary:
  """Trains and evaluates one run (resuming it if interrupted) and writes its summary."""
  from calib_jax.training import config as config_lib, evaluate, loop

  config = config_lib.load_config_file(f"{CONFIG}:{variant}")
  config.seed = seed
  path = os.path.abspath(os.path.join(workdir, variant.replace(",", "_"), f"seed{seed}"))
  start = time.monotonic()
  try:
    loop.train_and_evaluate(config, path)
  except loop.NonFiniteLossError as e:
    summary = {"diverged": str(e).splitlines()[0], "seconds": time.monotonic() - start}
  else:
    split = "val" if variant.startswith("tune") else "test"
    summary = summarize(evaluate.evaluate_run(config, path, split=split),
                        time.monotonic() - start)
    # Relative to --workdir: summaries are committed, the workdir is not.
    summary["predictions"] = os.path.relpath(
        os.path.join(evaluate.eval_dir(path, split), evaluate.PREDICTIONS_FILE), workdir)
  target = summary_path(out_dir, variant, seed)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  with open(target, "w") as f:
    json.dump(summary, f, indent=1, sort_keys=True)
  return summary


# ----------------------------------------------------------------------------- selection


def tuning_scores(out_dir: str, loss: str) -> dict[float, Summary] | None:
  """Validation summaries of a loss's whole grid, or None while any is missing."""
  study = _study()
  scores = {}
  for value in study.GRIDS[loss][1]:
    summary = load_summary(out_dir, f"tune,{loss},{value:g}", 0)
    if summary is None:
      return None
    scores[value] = summary
  return scores


def select(scores: dict[float, Summary], target: str) -> float:
  """The grid value with the highest validation accuracy or lowest ECE (first on ties);
  a diverged run is never chosen."""
  finished = {v: s for v, s in scores.items() if "diverged" not in s}
  if target == "acc":
    return max(finished, key=lambda v: finished[v]["accuracy"])
  return min(finished, key=lambda v: finished[v]["ece"])


def final_rows(out_dir: str) -> list[tuple[str, str, str | None]]:
  """(row key, variant, selection target) of every final configuration known so far."""
  rows = [("ce", "final,ce", None), ("ce_ts", "final_ts,ce", None)]
  for loss in TUNED:
    scores = tuning_scores(out_dir, loss)
    if scores is not None:
      for target in ("acc", "ece"):
        rows.append((loss, f"final,{loss},{select(scores, target):g}", target))
  scores = tuning_scores(out_dir, "mbls")
  if scores is not None:
    margin = select(scores, "ece")
    rows += [("mbls", f"final,mbls,{margin:g}", "ece"),
             ("mbls", f"final,mbls,{margin:g},clip", "ece")]
  rows += [("acls", "final,acls", None), ("acls", "final,acls,clip", None)]
  return rows


def plan(out_dir: str, seeds: list[int]) -> list[tuple[str, int]]:
  """Runs still to do, in order: tuning of LR and LS; seed 0 of every final configuration
  known so far (so each row has a first number early); the other tunings; then every final on
  every seed. The order only decides when a number arrives: selection reads tuning summaries
  alone, so running a final before another loss's tuning cannot change what is chosen."""
  study = _study()
  first = [f"tune,{loss},{v:g}" for loss in ("lr", "ls") for v in study.GRIDS[loss][1]]
  others = [f"tune,{loss},{v:g}" for loss in ("focal", "ecp", "mbls")
            for v in study.GRIDS[loss][1]]
  finals = [variant for _, variant, _ in final_rows(out_dir)]
  todo = [(variant, 0) for variant in first]
  if all(load_summary(out_dir, variant, 0) is not None for variant in first):
    todo += [(variant, seeds[0]) for variant in finals]
  todo += [(variant, 0) for variant in others]
  todo += [(variant, seed) for variant in finals for seed in seeds]
  seen, result = set(), []
  for item in todo:
    if item not in seen and load_summary(out_dir, *item) is None:
      seen.add(item)
      result.append(item)
  return result


# ----------------------------------------------------------------------------- report


def _mean_std(values: list[float]) -> tuple[float, float]:
  return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(mean: float, std: float) -> str:
  return f"{mean:.3f} ± {std:.3f}"


def _seeds_of(out_dir: str, variant: str, seeds: list[int]) -> list[Summary]:
  return [s for seed in seeds if (s := load_summary(out_dir, variant, seed)) is not None]


def _within(ours: tuple[float, float], paper: tuple[float, float]) -> str:
  """'yes' if our mean lies within the paper's mean ± 2 std (its seed spread)."""
  return "yes" if abs(ours[0] - paper[0]) <= 2 * paper[1] else "no"


def tuning_table(out_dir: str) -> list[str]:
  study = _study()
  lines = ["| loss | parameter | value | val acc | val ECE |", "|---|---|---|---:|---:|"]
  for loss in (*TUNED, "mbls"):
    name, grid = study.GRIDS[loss]
    for value in grid:
      s = load_summary(out_dir, f"tune,{loss},{value:g}", 0)
      if s is None:
        cells = "pending | pending"
      elif "diverged" in s:
        cells = "diverged | diverged"
      else:
        cells = f"{s['accuracy']:.4f} | {s['ece']:.4f}"
      lines.append(f"| {DISPLAY[loss]} | {name} | {value:g} | {cells} |")
  return lines


def final_table(out_dir: str, seeds: list[int]) -> list[str]:
  lines = ["| row | chosen | seeds | acc (ours) | acc (paper) | within | ECE (ours) | "
           "ECE (paper) | within |", "|---|---|---:|---:|---:|---|---:|---:|---|"]
  for key, variant, target in final_rows(out_dir):
    loss = "ce" if key == "ce_ts" else key
    label = {"ce_ts": "CE + T opt. (grid, ECE)"}.get(key, DISPLAY[loss])
    if target:
      label += f" (opt. for {'acc.' if target == 'acc' else 'ECE'})"
    if variant.endswith("clip"):
      label += ", clip 2"
    parts = variant.split(",")
    chosen = parts[2] if len(parts) > 2 and parts[2] != "clip" else "–"
    runs = _seeds_of(out_dir, variant, seeds)
    done = [r for r in runs if "diverged" not in r]
    paper = PAPER.get((key, target))
    paper_acc = _fmt(*paper[:2]) if paper else "–"
    paper_ece = _fmt(*paper[2:]) if paper else "–"
    if not done:
      status = "pending" if not runs else f"diverged on {len(runs)}/{len(runs)}"
      lines.append(f"| {label} | {chosen} | 0/{len(seeds)} | {status} | {paper_acc} | | "
                   f"{status} | {paper_ece} | |")
      continue
    ece_key = "ece_post_grid" if key == "ce_ts" else "ece"
    acc = _mean_std([r["accuracy"] for r in done])
    ece = _mean_std([r[ece_key] for r in done])
    seeds_text = f"{len(done)}/{len(seeds)}"
    if len(runs) > len(done):
      seeds_text += f" ({len(runs) - len(done)} diverged)"
    lines.append(
        f"| {label} | {chosen} | {seeds_text} | {_fmt(*acc)} | {paper_acc} | "
        f"{_within(acc, paper[:2]) if paper else ''} | {_fmt(*ece)} | {paper_ece} | "
        f"{_within(ece, paper[2:]) if paper else ''} |")
  return lines


def ts_details(out_dir: str, seeds: list[int]) -> list[str]:
  runs = [r for r in _seeds_of(out_dir, "final_ts,ce", seeds) if "diverged" not in r]
  if not runs:
    return []
  grid = ", ".join(f"{r['temperature_grid']:g}" for r in runs)
  fit = ", ".join(f"{r['temperature']:.2f}" for r in runs)
  return ["", f"CE + T: grid T (hold-out ECE) per seed {grid}, test ECE "
              f"{_fmt(*_mean_std([r['ece_post_grid'] for r in runs]))}; our continuous NLL fit "
              f"T = {fit}, test ECE {_fmt(*_mean_std([r['ece_post'] for r in runs]))}; before "
              f"scaling {_fmt(*_mean_std([r['ece'] for r in runs]))}."]


def reliability_figure(out_dir: str, workdir: str, seeds: list[int]) -> str | None:
  """CE, LS, LR, MbLS and ACLS (ECE-selected where tuned) on the first seed, side by side."""
  import numpy as np

  from calib_jax import plotting
  wanted = {"ce": None, "ls": "ece", "lr": "ece", "mbls": "ece", "acls": None}
  models = {}
  for key, variant, target in final_rows(out_dir):
    if key in wanted and wanted[key] == target and not variant.endswith("clip"):
      s = load_summary(out_dir, variant, seeds[0])
      path = os.path.join(workdir, s["predictions"]) if s and "predictions" in s else ""
      if os.path.exists(path):
        saved = np.load(path)
        models[f"{DISPLAY[key]} ({variant.split(',', 2)[-1]})"] = (saved["probs_pre"],
                                                                   saved["labels"])
  if not models:
    return None
  return plotting.reliability_diagrams(
      models, os.path.join(out_dir, "lr_table1_reliability.png"),
      title=f"Fashion-MNIST test, seed {seeds[0]}, before temperature scaling")


def write_report(out_dir: str, workdir: str, seeds: list[int]) -> str:
  lines = ["# Label relaxation Table 1 (Fashion-MNIST), reproduced", "",
           "Produced by `python bench/lr_table1.py --out_dir=docs/results` (configs: "
           "`configs/lr_table1.py`). Paper: mean ± std of 10 seeds with the train/test "
           "pool resampled per seed; ours: mean ± sample std over seeds on the original split, "
           "tuning once on seed 0. 'within' = our mean inside the paper's mean ± 2 std.", "",
           "## Final runs (test split)", ""]
  lines += final_table(out_dir, seeds)
  lines += ts_details(out_dir, seeds)
  lines += ["", "## Protocol notes", "",
            "- Splits: the original 60k/10k split, not resampled per seed as the paper does "
            "(the official `get_dataset_by_type` pools the 70k images and draws a random 1/7 "
            "test set per seed); the tuning hold-out is the last 1/6 of the training set as the "
            "paper says (the official code's `train_test_split` holds out 25 % at random).",
            "- Inputs are standardised, `(x/255 - mean) / std`; the official Keras code only "
            "subtracts the training mean. One check run of `final,ce` seed 0 with "
            "`--config.data.options.normalize=center` (the official preprocessing) gave test "
            "accuracy 0.9045 and ECE 0.0754 against 0.9043 and 0.0771 standardised: the input "
            "scaling does not move these numbers.",
            "- The original test set is harder than the paper's random test sets: a check run "
            "of `final,ce` seed 0 trained on `train[10000:]+test` and tested on `train[:10000]` "
            "(`--config.data.splits.train=... --config.data.splits.test=...`) reached accuracy "
            "0.9083 (ECE 0.0734), against 0.9043 on the original test set — inside the paper's "
            "0.912 ± 0.003 at 2 std. Our accuracies below the paper's spread are measured on "
            "the original split; one seed of each check, so read them as a direction.",
            "- Tuning runs once, on seed 0 (the paper tunes inside each of its 10 seeds); the "
            "selected value is retrained on every seed. No cut was made in tuning: every run "
            "has the full 50 epochs and every grid point.",
            "- Schedule as the official `hyperparams_*.json`: lr 0.05, x0.3162 once the 0-based "
            "epoch exceeds 30, Keras time decay 1e-5 per step; no augmentation or weight decay.",
            "- CP is Pereyra et al.'s confidence penalty, `-log p_y - beta*H(p)`. The official "
            "code's `ConfidencePenaltyLoss` returns `-log p_y + alpha*H(p)`, which rewards "
            "confident outputs; the paper's CP rows come from that sign.",
            "- CE + T: T from the paper's grid by hold-out ECE, as the official `evaluate_ece`; "
            "our continuous NLL fit is reported beside it.",
            "- MbLS (alpha 0.1) margin chosen by hold-out ECE from {2, 4, 6, 8, 10}, trained "
            "without clipping; its 'clip 2' row reuses that margin. ACLS uses the official "
            "defaults (margin 10, lambda 0.1 / 0.01, winner term on the max)."]
  lines += ["", "## Tuning (seed 0; train[:50000], scored on train[50000:])", ""]
  lines += tuning_table(out_dir)
  figure = reliability_figure(out_dir, workdir, seeds)
  if figure:
    lines += ["", f"![reliability]({os.path.basename(figure)})"]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out_dir, "label_relaxation_table1.md"), "w") as f:
    f.write(text)
  return text


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join("workdirs", "lr_table1"))
  parser.add_argument("--out_dir", default=os.path.join("docs", "results"))
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--max_minutes", type=float, default=0.0, help="0 = no limit")
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  seeds = [int(s) for s in args.seeds.split(",") if s]
  start = time.monotonic()
  while not args.report_only:
    todo = plan(args.out_dir, seeds)
    if not todo:
      break
    if args.max_minutes and time.monotonic() - start > 60 * args.max_minutes:
      print(f"time budget reached; {len(todo)} runs left", flush=True)
      break
    variant, seed = todo[0]
    from calib_jax.training import preemption
    try:
      summary = run_one(variant, seed, args.workdir, args.out_dir)
    except preemption.Preempted as e:  # SIGTERM: the run saved its step; rerun to resume.
      print(f"{variant:<24} seed {seed}: {e}", flush=True)
      return preemption.PREEMPTED_EXIT_CODE
    text = summary.get("diverged") or (f"acc {summary['accuracy']:.4f} ECE {summary['ece']:.4f}")
    print(f"{variant:<24} seed {seed}: {text} ({summary['seconds']:.0f} s); "
          f"{len(todo) - 1} runs left", flush=True)
    write_report(args.out_dir, args.workdir, seeds)
  print(write_report(args.out_dir, args.workdir, seeds))
  return 0


if __name__ == "__main__":
  sys.exit(main())
