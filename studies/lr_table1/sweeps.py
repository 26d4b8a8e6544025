"""The label-relaxation Table 1 study as sweeps (`python -m studies.lr_table1 --sweeps`).

The same protocol, configs and selection as the sequential study (`run.plan`), with the runs
grouped into sweeps, each one compiled program (`config.sweep`, `calib_jax.sweep`):

* a tuning grid is one sweep over its values on seed 0 (`tune,<loss>,*`), e.g.
  `loss_kwargs.alpha=0.01,0.025,0.05,0.1,0.2,0.3,0.4`;
* a final row is one sweep over its seeds (`seed=0,1,...,9`, the paper's 10 seeds).

Each member is then evaluated like a single run (`evaluate_run(..., member=i)`) and its summary
written where the sequential study writes a run's (`summaries.summary_path`), so the report,
the selection and the claims read sweeps' members exactly as they read single runs. A sweep
resumes from its checkpoint when interrupted; a member whose summary exists is left out of the
next sweep. A member whose loss diverges stops its sweep (`NonFiniteLossError` names it): it
gets a `diverged` summary and the sweep runs again without it.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from studies.lr_table1 import config as study_config
from studies.lr_table1.summaries import final_rows, load_summary, summarize, summary_path

# (config variant the sweep starts from, sweep text, [(member variant, seed)], split)
SweepItem = tuple[str, str, list[tuple[str, int]], str]
# The losses with a tuning grid (summaries.GRID_LOSSES), in the order their grid sweeps run.
GRID_RUN_ORDER = ("lr", "ls", "focal", "ecp", "mbls", "maxsup", "logitnorm")


def _grid_sweep(out_dir: str, loss: str) -> SweepItem | None:
  name, grid = study_config.GRIDS[loss]
  todo = [v for v in grid if load_summary(out_dir, f"tune,{loss},{v:g}", 0) is None]
  if not todo:
    return None
  text = f"loss_kwargs.{name}=" + ",".join(f"{v:g}" for v in todo)
  return (f"tune,{loss},{todo[0]:g}", text, [(f"tune,{loss},{v:g}", 0) for v in todo], "val")


def _seed_sweep(out_dir: str, variant: str, seeds: list[int],
                max_members: int = 0) -> SweepItem | None:
  todo = [s for s in seeds if load_summary(out_dir, variant, s) is None]
  if not todo:
    return None
  if max_members:
    todo = todo[:max_members]
  return (variant, "seed=" + ",".join(map(str, todo)), [(variant, s) for s in todo], "test")


def row_loss(variant: str) -> str:
  """The loss of a study variant: `tune,maxsup,0.1` and `final,maxsup,0.1` -> 'maxsup',
  `final_ts,ce` -> 'ce'."""
  return variant.split(",")[1]


def sweep_plan(out_dir: str, seeds: list[int], max_members: int = 0,
               losses: tuple[str, ...] = ()) -> list[SweepItem]:
  """Sweeps still to run, in order: every tuning grid (LR and LS first, then FL, CP and MbLS),
  then the final rows on every seed. With `max_members`, a final row's seeds are run in sweeps
  of at most that many (the first ones without a summary; the rest come in a later sweep), the
  rows with the fewest finished seeds first, so every row of the table gets a spread (and
  every claim a first verdict) before any row gets all its seeds. With `losses`, only the
  grids and final rows of those losses (e.g. `("maxsup", "logitnorm")`)."""
  def seed_sweeps():  # the rows with the fewest finished seeds first: spreads before depth
    done = lambda variant: sum(load_summary(out_dir, variant, s) is not None for s in seeds)
    return [_seed_sweep(out_dir, variant, seeds, max_members)
            for variant in sorted((v for _, v, _ in final_rows(out_dir)), key=done)]

  items = [_grid_sweep(out_dir, loss) for loss in GRID_RUN_ORDER] + seed_sweeps()
  return [item for item in items
          if item is not None and (not losses or row_loss(item[0]) in losses)]


def sweep_workdir(workdir: str, variant: str, text: str) -> str:
  """One sweep's work directory: its first variant and a digest of its members."""
  digest = hashlib.sha1(text.encode()).hexdigest()[:8]
  return os.path.abspath(os.path.join(workdir, "sweeps", f"{variant.replace(',', '_')}_{digest}"))


def _write(out_dir: str, variant: str, seed: int, summary: dict[str, Any]) -> None:
  target = summary_path(out_dir, variant, seed)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  with open(target, "w") as f:
    json.dump(summary, f, indent=1, sort_keys=True)


def _training_seconds(path: str, segment: float) -> float:
  """The sweep's training wall time over all its sessions: `segment` seconds are added to what
  `<path>/training_seconds.json` held, which is rewritten. A sweep that resumes (or finds its
  training finished) thus reports the time it took in all, not the time of its last session."""
  record = os.path.join(path, "training_seconds.json")
  total = segment
  if os.path.exists(record):
    with open(record) as f:
      total += float(json.load(f)["seconds"])
  os.makedirs(path, exist_ok=True)
  with open(record, "w") as f:
    json.dump({"seconds": total}, f)
  return total


def run_sweep(item: SweepItem, workdir: str, out_dir: str) -> list[tuple[str, int, dict]]:
  """Trains one sweep (resuming it), evaluates each member and writes its summary; returns
  `(variant, seed, summary)` per member written. A member's `seconds` is the sweep's training
  wall time over all its sessions (`_training_seconds`) divided by its members."""
  from calib_jax import config as config_lib
  from calib_jax.evaluation import report, run as evaluate
  from calib_jax.run import loop

  variant, text, members, split = item
  config = config_lib.load_config_file(f"{study_config.__file__}:{variant}")
  config.sweep = text
  path = sweep_workdir(workdir, variant, text)
  start = time.monotonic()
  diverged = None
  try:
    loop.train_and_evaluate(config, path)
  except loop.NonFiniteLossError as e:
    diverged = e
  finally:  # a preempted session's time counts too: the sweep resumes from its checkpoint
    total_seconds = _training_seconds(path, time.monotonic() - start)
  if diverged is not None:
    if diverged.member is None:
      raise diverged
    member_variant, seed = members[diverged.member]
    summary = {"diverged": str(diverged).splitlines()[0], "seconds": total_seconds,
               "sweep": {"text": text, "member": diverged.member, "variant": member_variant}}
    _write(out_dir, member_variant, seed, summary)
    return [(member_variant, seed, summary)]
  seconds = total_seconds / len(members)  # the sweep's wall time per member
  written = []
  for index, (member_variant, seed) in enumerate(members):
    results = evaluate.evaluate_run(config, path, split=split, member=index)
    summary = summarize(results, seconds)
    summary["sweep"] = {"text": text, "member": index, "members": len(members),
                        "variant": member_variant, "load": os.getloadavg()[2]}
    summary["predictions"] = os.path.relpath(
        os.path.join(evaluate.eval_dir(path, split, index), report.PREDICTIONS_FILE), workdir)
    _write(out_dir, member_variant, seed, summary)
    written.append((member_variant, seed, summary))
  return written


def run_sweeps(workdir: str, out_dir: str, seeds: list[int], max_minutes: float,
                start: float, max_members: int = 0, losses: tuple[str, ...] = ()) -> int:
  """Runs `sweep_plan` until it is empty or `max_minutes` (from `start`) have passed,
  rewriting the report after each sweep; returns 0 or the preemption exit code."""
  from calib_jax.run import preemption
  from studies.lr_table1.report import write_report
  while todo := sweep_plan(out_dir, seeds, max_members, losses):
    if max_minutes and time.monotonic() - start > 60 * max_minutes:
      print(f"time budget reached; {len(todo)} sweep(s) left", flush=True)
      return 0
    variant, text = todo[0][:2]
    began = time.monotonic()
    try:
      written = run_sweep(todo[0], workdir, out_dir)
    except preemption.Preempted as e:
      print(f"{variant} [{text}]: {e}", flush=True)
      return preemption.PREEMPTED_EXIT_CODE
    for member_variant, seed, summary in written:
      text_row = summary.get("diverged") or (f"acc {summary['accuracy']:.4f} "
                                             f"ECE {summary['ece']:.4f}")
      print(f"{member_variant:<24} seed {seed}: {text_row}", flush=True)
    print(f"sweep {variant} [{text}]: {len(written)} member(s) in "
          f"{time.monotonic() - began:.0f} s; {len(todo) - 1} sweep(s) left", flush=True)
    write_report(out_dir, workdir, seeds)
  return 0
