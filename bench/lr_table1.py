"""Label relaxation Table 1 (Fashion-MNIST) reproduced, with MbLS and ACLS on the same protocol.

    .venv/bin/python bench/lr_table1.py [--workdir=workdirs/lr_table1] \
        [--out_dir=docs/results] [--seeds=0,1,2] [--max_minutes=M] [--report_only] \
        [--readme=README.md]

Runs the configs of `configs/lr_table1.py` in the order of `plan`: the tuning grids on a
hold-out (seed 0), then for each tuned loss the value best for accuracy and the value best for
ECE, retrained on the whole training set and tested, on every seed; CE, CE + T (grid) and ACLS
(with and without the official clip) need no tuning. One run's summary is written to
`<out_dir>/lr_table1/<variant>/seed<k>.json` when it finishes; a run with a summary is never
redone (the summaries are committed, so the study continues across machines), and a run that
was interrupted resumes from its checkpoint in `--workdir`. `--max_minutes` stops starting new
runs after that long, so the study can be run in chunks. After each run the report
`<out_dir>/label_relaxation_table1.md` and `<out_dir>/lr_table1_reliability.png` are rewritten
from every summary there is (`lr_table1_report`); `--readme` also writes its summary table into
the README. Not a test: it trains models and prints numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# This file runs the study; the summaries and selection live in lr_table1_summaries, the
# papers' claims in lr_table1_claims, the tables and figure in lr_table1_report.
from lr_table1_report import update_readme, write_report  # noqa: E402
from lr_table1_summaries import (CONFIG, DISPLAY, PAPER, SUMMARY_FOLDER, TUNED,  # noqa: E402,F401
                                 Summary, final_rows, load_summary, select, split_check_rows,
                                 study_module, summary_path, tuning_scores)


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
  from calib_jax import config as config_lib
  from calib_jax.evaluation import report, run as evaluate
  from calib_jax.training import loop

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
        os.path.join(evaluate.eval_dir(path, split), report.PREDICTIONS_FILE), workdir)
  target = summary_path(out_dir, variant, seed)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  with open(target, "w") as f:
    json.dump(summary, f, indent=1, sort_keys=True)
  return summary


def plan(out_dir: str, seeds: list[int]) -> list[tuple[str, int]]:
  """Runs still to do, in order: tuning of LR and LS; seed 0 of every final configuration
  known so far (so each row has a first number early); the other tunings; then the other seeds,
  seed by seed (every row gets a spread before any row gets its third seed); last the checks of
  the test split (`pooled,<final>,<k>` on seed k, for the rows of SPLIT_CHECKS) and of the
  initialisation (`keras_init,ce`). The order only decides when a number arrives: selection
  reads tuning summaries alone, so running a final before another loss's tuning cannot change
  what is chosen."""
  study = study_module()
  first = [f"tune,{loss},{v:g}" for loss in ("lr", "ls") for v in study.GRIDS[loss][1]]
  others = [f"tune,{loss},{v:g}" for loss in ("focal", "ecp", "mbls")
            for v in study.GRIDS[loss][1]]
  finals = [variant for _, variant, _ in final_rows(out_dir)]
  todo = [(variant, 0) for variant in first]
  if all(load_summary(out_dir, variant, 0) is not None for variant in first):
    todo += [(variant, seeds[0]) for variant in finals]
  todo += [(variant, 0) for variant in others]
  todo += [(variant, seed) for seed in seeds for variant in finals]
  todo += [(study.pooled_variant(variant, fold), fold)
           for _, _, variant in split_check_rows(out_dir) for fold in range(study.POOLED_FOLDS)]
  todo += [("keras_init,ce", 0)]
  seen, result = set(), []
  for item in todo:
    if item not in seen and load_summary(out_dir, *item) is None:
      seen.add(item)
      result.append(item)
  return result


def _runs(count: int) -> str:
  return f"{count} run" + ("" if count == 1 else "s")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join("workdirs", "lr_table1"))
  parser.add_argument("--out_dir", default=os.path.join("docs", "results"))
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--max_minutes", type=float, default=0.0, help="0 = no limit")
  parser.add_argument("--report_only", action="store_true")
  parser.add_argument("--readme", default="", help="also write the summary table into this "
                      "file between its lr_table1 markers (README.md)")
  args = parser.parse_args(argv)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  seeds = [int(s) for s in args.seeds.split(",") if s]
  start, durations = time.monotonic(), []  # durations: this process's runs, for the ETA
  while not args.report_only:
    todo = plan(args.out_dir, seeds)
    if not todo:
      break
    if args.max_minutes and time.monotonic() - start > 60 * args.max_minutes:
      print(f"time budget reached; {_runs(len(todo))} left", flush=True)
      break
    variant, seed = todo[0]
    from calib_jax.training import preemption
    try:
      summary = run_one(variant, seed, args.workdir, args.out_dir)
    except preemption.Preempted as e:  # SIGTERM: the run saved its step; rerun to resume.
      print(f"{variant:<24} seed {seed}: {e}", flush=True)
      return preemption.PREEMPTED_EXIT_CODE
    text = summary.get("diverged") or (f"acc {summary['accuracy']:.4f} ECE {summary['ece']:.4f}")
    durations.append(summary["seconds"])
    left = len(todo) - 1
    eta = f", about {left * statistics.median(durations) / 3600:.1f} h" if left else ""
    print(f"{variant:<24} seed {seed}: {text} ({summary['seconds']:.0f} s); "
          f"{_runs(left)} left{eta}", flush=True)
    write_report(args.out_dir, args.workdir, seeds)
  print(write_report(args.out_dir, args.workdir, seeds))
  if args.readme:
    update_readme(args.readme, args.out_dir, seeds)
  return 0


if __name__ == "__main__":
  sys.exit(main())
