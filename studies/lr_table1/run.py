"""Runs the label-relaxation Table 1 study (`python -m studies.lr_table1`; flags there): the
run plan, one run (train, evaluate, write its summary), and the loop over the plan that rewrites
the report after each run. The summaries and selection live in `studies.lr_table1.summaries`,
the papers' claims in `studies.lr_table1.claims`, the tables and figure in
`studies.lr_table1.report`.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from studies.lr_table1 import config as study_config
from studies.lr_table1.report import update_readme, write_report
from studies.lr_table1 import sweeps as sweeps_lib
from studies.lr_table1.summaries import (Summary, final_rows, load_summary, split_check_rows,
                                         summarize, summary_path)


def run_one(variant: str, seed: int, workdir: str, out_dir: str) -> Summary:
  """Trains and evaluates one run (resuming it if interrupted) and writes its summary."""
  from calib_jax import config as config_lib
  from calib_jax.evaluation import report, run as evaluate
  from calib_jax.run import loop

  config = config_lib.load_config_file(f"{study_config.__file__}:{variant}")
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


def plan(out_dir: str, seeds: list[int], losses: tuple[str, ...] = ()) -> list[tuple[str, int]]:
  """Runs still to do, in order: tuning of LR and LS; seed 0 of every final configuration
  known so far (so each row has a first number early); the other tunings; then the other seeds,
  seed by seed (every row gets a spread before any row gets its third seed); last the checks of
  the test split (`pooled,<final>,<k>` on seed k, for the rows of SPLIT_CHECKS) and of the
  initialisation (`keras_init,ce`). The order only decides when a number arrives: selection
  reads tuning summaries alone, so running a final before another loss's tuning cannot change
  what is chosen. With `losses`, only those losses' tuning and final runs (no checks)."""
  grids = study_config.GRIDS
  first = [f"tune,{loss},{v:g}" for loss in ("lr", "ls") for v in grids[loss][1]]
  others = [f"tune,{loss},{v:g}" for loss in ("focal", "ecp", "mbls", "maxsup", "logitnorm")
            for v in grids[loss][1]]
  finals = [variant for _, variant, _ in final_rows(out_dir)]
  todo = [(variant, 0) for variant in first]
  if all(load_summary(out_dir, variant, 0) is not None for variant in first):
    todo += [(variant, seeds[0]) for variant in finals]
  todo += [(variant, 0) for variant in others]
  todo += [(variant, seed) for seed in seeds for variant in finals]
  todo += [(study_config.pooled_variant(variant, fold), fold)
           for _, _, variant in split_check_rows(out_dir)
           for fold in range(study_config.POOLED_FOLDS)]
  todo += [("keras_init,ce", 0)]
  if losses:
    todo = [item for item in todo if item[0].split(",")[1] in losses
            and item[0].split(",")[0] in ("tune", "final")]
  seen, result = set(), []
  for item in todo:
    if item not in seen and load_summary(out_dir, *item) is None:
      seen.add(item)
      result.append(item)
  return result


def _runs(count: int) -> str:
  return f"{count} run" + ("" if count == 1 else "s")


def run_study(workdir: str, out_dir: str, seeds: list[int], max_minutes: float = 0.0,
              report_only: bool = False, readme: str = "", *, sweeps: bool = False,
              max_members: int = 0, losses: tuple[str, ...] = ()) -> int:
  """Runs the plan until it is empty (or `max_minutes` have passed; 0: no limit), rewriting the
  report after each run, then prints the report and, with `readme`, writes its summary table
  there. With `sweeps`, runs `sweeps.sweep_plan` instead (one sweep per grid or final row,
  a final row's seeds in sweeps of at most `max_members` when it is > 0). With `losses`, only
  those losses' tuning and final runs (e.g. the rows added to a finished study).
  Returns the exit code: 0, or the preemption code when a run was stopped by SIGTERM."""
  start, durations = time.monotonic(), []  # durations: this process's runs, for the ETA
  if sweeps and not report_only:
    code = sweeps_lib.run_sweeps(workdir, out_dir, seeds, max_minutes, start, max_members,
                                 losses)
    if code:
      return code
    report_only = True
  while not report_only:
    todo = plan(out_dir, seeds, losses)
    if not todo:
      break
    if max_minutes and time.monotonic() - start > 60 * max_minutes:
      print(f"time budget reached; {_runs(len(todo))} left", flush=True)
      break
    variant, seed = todo[0]
    from calib_jax.run import preemption
    try:
      summary = run_one(variant, seed, workdir, out_dir)
    except preemption.Preempted as e:  # SIGTERM: the run saved its step; rerun to resume.
      print(f"{variant:<24} seed {seed}: {e}", flush=True)
      return preemption.PREEMPTED_EXIT_CODE
    text = summary.get("diverged") or (f"acc {summary['accuracy']:.4f} ECE {summary['ece']:.4f}")
    durations.append(summary["seconds"])
    left = len(todo) - 1
    eta = f", about {left * statistics.median(durations) / 3600:.1f} h" if left else ""
    print(f"{variant:<24} seed {seed}: {text} ({summary['seconds']:.0f} s); "
          f"{_runs(left)} left{eta}", flush=True)
    write_report(out_dir, workdir, seeds)
  print(write_report(out_dir, workdir, seeds))
  if readme:
    update_readme(readme, out_dir, seeds)
  return 0
