"""The label-relaxation study run as sweeps, against its sequential runs: each sweep's wall
time beside the sequential study's runs of the same variants and seeds, the whole 10-seed
protocol at each way's median minutes per member-run, why some members differ from their
sequential runs, and whether each tuned loss selects the same value (`sweep_notes`, a section
of the study's report, `studies.lr_table1.report`).
"""
from __future__ import annotations

import json
import os
import statistics

from studies.lr_table1 import config as study_config
from studies.lr_table1.summaries import (DISPLAY, GRID_LOSSES, SUMMARY_FOLDER, Summary, final_rows,
                                         load_summary, select, tuning_scores)


# The sequential study's out_dir (its summaries under `lr_table1/`), which the sweeps' report
# compares with: the repository's docs/results.
SEQUENTIAL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "results")


def _stored_summaries(out_dir: str):
  """Every summary file under `out_dir`: `(folder, seed, summary)`, the folder being the
  variant with "," written "_" (`summaries.summary_path`)."""
  folder = os.path.join(out_dir, SUMMARY_FOLDER)
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    for file in sorted(os.listdir(os.path.join(folder, name))):
      with open(os.path.join(folder, name, file)) as f:
        yield name, int(file.removeprefix("seed").removesuffix(".json")), json.load(f)


def _sweeps_of(out_dir: str) -> dict[tuple[str, str], list[tuple[str, int, Summary]]]:
  """The summaries written by sweeps, grouped by sweep: `(first variant, text)` -> members."""
  found: dict[tuple[str, str], list[tuple[str, int, Summary]]] = {}
  for _, seed, summary in _stored_summaries(out_dir):
    if "sweep" not in summary or "diverged" in summary:
      continue
    variant = summary["sweep"]["variant"]
    row = ",".join(variant.split(",")[:2]) if variant.startswith("tune,") else variant
    found.setdefault((row, summary["sweep"]["text"]), []).append((variant, seed, summary))
  return found


def _phase(variant: str) -> str | None:
  """'tuning' or 'final' for a table run's variant; None for a check (pooled, keras_init)."""
  head = variant.split(",")[0]
  return {"tune": "tuning", "final": "final", "final_ts": "final"}.get(head)


def _sequential_minutes(sequential_dir: str) -> dict[str, list[float]]:
  """Each phase's run times (minutes) in the sequential study's summaries."""
  found: dict[str, list[float]] = {"tuning": [], "final": []}
  for name, _, summary in _stored_summaries(sequential_dir):
    phase = _phase(name.replace("_", ",", 1))  # only the first "_" matters to the phase
    if phase and "diverged" not in summary and "seconds" in summary:
      found[phase].append(summary["seconds"] / 60)
  return found


def per_run_note(groups: dict, out_dir: str, sequential_dir: str, num_seeds: int) -> list[str]:
  """The whole protocol's time (every grid value, every final row of `out_dir`'s tuning on
  `num_seeds` seeds: the losses added since the sequential study too) at each phase's median
  minutes per member-run, sweeps against sequential runs: the median, as both ran beside other
  work (one sweep holds a 51-minute pause) that a mean would carry along."""
  ours: dict[str, list[float]] = {"tuning": [], "final": []}
  for members in groups.values():
    for variant, _, summary in members:
      ours[_phase(variant)].append(summary["seconds"] / 60)
  theirs = _sequential_minutes(sequential_dir)
  counts = {"tuning": sum(len(grid) for _, grid in study_config.GRIDS.values()),
            "final": len({variant for _, variant, _ in final_rows(out_dir)}) * num_seeds}
  cells, whole_ours, whole_theirs = [], 0.0, 0.0
  for phase in ("tuning", "final"):
    if not ours[phase] or not theirs[phase]:
      return []
    a, b = statistics.median(ours[phase]), statistics.median(theirs[phase])
    cells.append(f"{phase} {a:.1f} min per member-run ({len(ours[phase])} so far) against "
                 f"{b:.1f} min per run ({len(theirs[phase])} runs), {b / a:.2f}x")
    whole_ours, whole_theirs = whole_ours + counts[phase] * a, whole_theirs + counts[phase] * b
  total = sum(counts.values())
  return ["", f"Median per member-run, every sweep so far against every sequential run "
              f"(both under the loads of their sessions): "
              f"{'; '.join(cells)}. The whole protocol with {num_seeds} seeds ({total} "
              f"member-runs: {counts['tuning']} tuning, {counts['final']} final) at these "
              f"rates: {whole_ours / 60:.1f} h as sweeps against {whole_theirs / 60:.1f} h as "
              f"sequential runs ({whole_theirs / whole_ours:.2f}x)."]


# Measured with scratch scripts on this recipe (docs/training.md, "Each member is ...").
DRIFT_NOTE = (
    "Why the FL and LS grids' members differ from their sequential runs: those runs were "
    "trained when a single run's loss hyper-parameter was a Python constant that XLA "
    "specialised the compiled step on (e.g. `p ** 2.0` -> `p * p`), while a grid's sweep traces "
    "it, so the arithmetic differed in the last bit (a final row's sweep varies only the seed "
    "and, with this study's code, compiles the value in as the single runs did: those members "
    "equal the sequential runs exactly). SGD amplifies that: FL, gamma 2, largest parameter "
    "difference 7e-9 after 1 step, 1.2e-7 after 150, then 1.7e-3 after 175 and 8e-3 after 200 "
    "(as a ReLU unit near zero switching sign would do). After some 40,000 steps the two agree "
    "only as two runs that differ in the last bit do, about the seed-to-seed spread (LS: "
    "accuracy 2e-3, ECE 3e-3; FL: 4e-3, 4e-3), while LR's, CP's and MbLS's members equal their "
    "sequential runs exactly. A selection can then change where grid values are that close (LS "
    "for accuracy: 0.1-0.4 lie within 0.003 of each other in both studies; FL: gamma 2 against "
    "0.5 for accuracy within 0.006, 3.5 against 5 for ECE within 0.0013), and FL's decides two "
    "claims. With gamma 2, FL (acc.) has a lower test ECE than LR (acc.); the sequential "
    "study's gamma 0.5 had 0.072 ± 0.001 (3 seeds), above LR's. With gamma 3.5, FL (ECE) has "
    "about twice the test ECE of the sequential study's gamma 5 (0.012 ± 0.001), so LR (ECE) is "
    "lowest, where that study found the two within the seed spread and the paper has FL lower. "
    "Since then a single run's hyper-parameters reach its step as opaque scalars "
    "(`losses.traced`), and a member equals its single run bit for bit (200 steps of this "
    "recipe with FL gamma 2 and 5, LS epsilon 0.05 and 0.2, LR alpha 0.1 and 0.3: largest "
    "parameter difference 0.0). This study's sweeps all run code from before that change (its "
    "last ones at commit 31b5a2a), so a row's seeds are one program's; the sequential runs stay "
    "as made.")


def sweep_notes(out_dir: str, sequential_dir: str = SEQUENTIAL_DIR,
                num_seeds: int = 10) -> list[str]:
  """For a study run as sweeps: each sweep's wall time against the sequential study's runs of
  the same variants and seeds (their summaries' `seconds`), and whether each tuned loss selects
  the values the sequential study selected. Empty when no summary comes from a sweep."""
  groups = _sweeps_of(out_dir)
  if not groups:
    return []
  lines = ["", "## Sweeps against the sequential runs", "",
           "Wall time of each finished sweep (its members' `seconds`, each the sweep's wall "
           "time over its members, added up) against the sequential study's single runs of "
           "the same variants and seeds where it has them (`docs/results/lr_table1/`; those "
           "ran one at a time in earlier sessions, on the same kind of 2-core machine, under "
           "whatever else ran beside them). The load is the machine's 15-minute load average "
           "when the sweep finished (2 cores: above 2, other work shared them).", "",
           "| sweep | members | sweep wall (min) | machine load | sequential runs (min) | "
           "ratio | largest difference from the sequential runs (those it has): accuracy, ECE |",
           "|---|---:|---:|---:|---:|---:|---|"]
  total_sweep = total_sequential = 0.0
  for (name, text), members in groups.items():
    wall = sum(s["seconds"] for _, _, s in members)
    load = members[0][2]["sweep"].get("load")
    pairs = [(m[2], load_summary(sequential_dir, m[0], m[1])) for m in members]
    pairs = [(ours, theirs) for ours, theirs in pairs if theirs and "diverged" not in theirs]
    # The members the sequential study also ran are compared even when it ran only some.
    gaps = ", ".join(f"{max(abs(a[key] - b[key]) for a, b in pairs):.1e}"
                     for key in ("accuracy", "ece")) if pairs else "–"
    if len(pairs) == len(members):
      sequential = sum(theirs["seconds"] for _, theirs in pairs)
      total_sweep, total_sequential = total_sweep + wall, total_sequential + sequential
      cells = f"{sequential / 60:.1f} | {sequential / wall:.2f}x | {gaps}"
    else:
      cells = f"{len(pairs)} of {len(members)} run | – | {gaps}"
    load_text = "–" if load is None else f"{load:.1f}"
    lines.append(f"| `{name}` [{text}] | {len(members)} | {wall / 60:.1f} | {load_text} | "
                 f"{cells} |")
  if total_sweep:
    lines += ["", f"Where both exist: {total_sweep / 3600:.2f} h as sweeps against "
                  f"{total_sequential / 3600:.2f} h as sequential runs "
                  f"({total_sequential / total_sweep:.2f}x)."]
  lines += per_run_note(groups, out_dir, sequential_dir, num_seeds)
  lines += ["", DRIFT_NOTE,
                "", "Selections (seed 0 tuning) against the sequential study's:", ""]
  for loss in GRID_LOSSES:
    ours, theirs = tuning_scores(out_dir, loss), tuning_scores(sequential_dir, loss)
    if ours is None or theirs is None:
      continue
    picks = [(target, select(ours, target), select(theirs, target)) for target in ("acc", "ece")]
    lines.append(f"- {DISPLAY[loss]}: " + "; ".join(
        f"{target} {a:g}" + (" (the same)" if a == b else f" (sequential: {b:g})")
        for target, a, b in picks) + ".")
  return lines
