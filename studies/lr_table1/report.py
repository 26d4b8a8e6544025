"""The report of the label-relaxation Table 1 study (`python -m studies.lr_table1`): writes the
tables, the claim-by-claim verdicts (`studies.lr_table1.claims`), the reliability figure and the
README's summary table from the run summaries (`studies.lr_table1.summaries`). It trains nothing.

    .venv/bin/python -m studies.lr_table1 --report_only --out_dir=docs/results --readme=README.md
"""
from __future__ import annotations

import json
import os
import statistics

from studies.lr_table1 import config as study_config
from studies.lr_table1.claims import verdict_table
from studies.lr_table1.summaries import (DISPLAY, PAPER, SPLIT_CHECKS, SUMMARY_FOLDER, TUNED,
                                         Summary, final_rows, fmt_mean_std, load_summary,
                                         mean_std, row_label, rows, seed_summaries, select,
                                         split_check_rows, tuning_scores, within_spread)


def tuning_table(out_dir: str) -> list[str]:
  lines = ["| loss | parameter | value | val acc | val ECE |", "|---|---|---|---:|---:|"]
  for loss in (*TUNED, "mbls"):
    name, grid = study_config.GRIDS[loss]
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
  for row in rows(out_dir, seeds):
    paper = PAPER.get((row.key, row.target))
    paper_acc = fmt_mean_std(*paper[:2]) if paper else "–"
    paper_ece = fmt_mean_std(*paper[2:]) if paper else "–"
    if not row.finished:
      status = "pending" if not row.runs else f"diverged on {row.runs}/{row.runs}"
      lines.append(f"| {row.label} | {row.chosen} | 0/{len(seeds)} | {status} | {paper_acc} | | "
                   f"{status} | {paper_ece} | |")
      continue
    seeds_text = f"{row.finished}/{len(seeds)}"
    if row.runs > row.finished:
      seeds_text += f" ({row.runs - row.finished} diverged)"
    lines.append(
        f"| {row.label} | {row.chosen} | {seeds_text} | {fmt_mean_std(*row.acc)} | "
        f"{paper_acc} | {within_spread(row.acc, paper[:2]) if paper else ''} | "
        f"{fmt_mean_std(*row.ece)} | {paper_ece} | "
        f"{within_spread(row.ece, paper[2:]) if paper else ''} |")
  return lines


def ts_details(out_dir: str, seeds: list[int]) -> list[str]:
  runs = [r for r in seed_summaries(out_dir, "final_ts,ce", seeds) if "diverged" not in r]
  if not runs:
    return []
  grid = ", ".join(f"{r['temperature_grid']:g}" for r in runs)
  fit = ", ".join(f"{r['temperature']:.2f}" for r in runs)
  ece = lambda key: fmt_mean_std(*mean_std([r[key] for r in runs]))
  return ["", f"CE + T: grid T (hold-out ECE) per seed {grid}, test ECE "
              f"{ece('ece_post_grid')}; our continuous NLL fit T = {fit}, test ECE "
              f"{ece('ece_post')}; before scaling {ece('ece')}."]


def reliability_figure(out_dir: str, workdir: str, seeds: list[int]) -> str | None:
  """CE, LS, LR, MbLS and ACLS (ECE-selected where tuned) on the first seed, side by side."""
  import numpy as np

  from calib_jax import plotting
  wanted = {"ce": None, "ls": "ece", "lr": "ece", "mbls": "ece", "acls": None}
  grids = study_config.GRIDS
  models = {}
  for key, variant, target in final_rows(out_dir):
    if key in wanted and wanted[key] == target and not variant.endswith("clip"):
      s = load_summary(out_dir, variant, seeds[0])
      path = os.path.join(workdir, s["predictions"]) if s and "predictions" in s else ""
      if os.path.exists(path):
        saved = np.load(path)
        name = DISPLAY[key]
        if key in grids:
          name += f" ({grids[key][0]} = {variant.split(',')[2]})"
        models[name] = (saved["probs_pre"], saved["labels"])
  png = os.path.join(out_dir, "lr_table1_reliability.png")
  if not models:  # No predictions here (a clone without the workdir): keep the committed one.
    return png if os.path.exists(png) else None
  return plotting.reliability_diagrams(
      models, png,
      title=f"Fashion-MNIST test, seed {seeds[0]}, before temperature scaling")


def split_check(out_dir: str, seeds: list[int]) -> str:
  """The protocol note on the test split, from the `pooled,<final>,<k>` runs there are."""
  checked = " and ".join(row_label(key, target) for key, target in SPLIT_CHECKS)
  text = ("- The test split: the paper tests on a random 1/7 of the pooled 70k images per seed, "
          f"we on the original 10k test images. Check (`pooled,<final>,<k>` for {checked}, "
          f"{study_config.POOLED_FOLDS} folds after the table's runs): the final row trained on "
          "the other 50k training images plus the 10k test images and tested on training images "
          "10k·k..10k·(k+1), seed k.")
  original = {row.variant: row for row in rows(out_dir, seeds)}
  inside = lambda ours, theirs: "inside" if within_spread(ours, theirs) == "yes" else "outside"
  found = []
  for key, target, variant in split_check_rows(out_dir):
    folds = [s for k in range(study_config.POOLED_FOLDS)
             if (s := load_summary(out_dir, study_config.pooled_variant(variant, k), k))
             and "diverged" not in s]
    row = original[variant]
    if not folds or not row.finished:
      continue
    acc = mean_std([r["accuracy"] for r in folds])
    ece = mean_std([r["ece"] for r in folds])
    paper = PAPER[(key, target)]
    found.append(
        f" {row.label} on {len(folds)} fold(s): accuracy {fmt_mean_std(*acc)}, ECE "
        f"{fmt_mean_std(*ece)}, against {fmt_mean_std(*row.acc)} and {fmt_mean_std(*row.ece)} "
        f"on the original test set ({row.finished} seed(s)) and the paper's "
        f"{fmt_mean_std(*paper[:2])} ({inside(acc, paper[:2])} its mean ± 2 std) and "
        f"{fmt_mean_std(*paper[2:])} ({inside(ece, paper[2:])}).")
  if not found:
    return text + " Pending."
  return text + "".join(found) + " The rest of the table is measured on the original split."


ARCHIVE_55K = "lr_table1_train55k"  # final runs of a library bug: trained on train[:55000]


def train_size_note(out_dir: str) -> str:
  """The protocol note on the final rows first trained on 55,000 images, from the archived
  summaries beside the reruns on all 60,000 (seed 0)."""
  text = ("- Training set of the final rows: the first final runs read "
          "`data.splits.train='train'` as the library's registered Fashion-MNIST split "
          "`train[:55000]` (a bug, fixed: a configured split is read as tfds reads it) and were "
          f"rerun on all 60,000 images; the first runs' summaries are kept in `{ARCHIVE_55K}/`.")
  pairs = []
  for _, variant, _ in final_rows(out_dir):
    first = load_summary(out_dir, variant, 0, folder=ARCHIVE_55K)
    rerun = load_summary(out_dir, variant, 0)
    if first and rerun and "diverged" not in rerun:
      pairs.append((variant, first["accuracy"], rerun["accuracy"]))
  if not pairs:
    return text + " Seed 0 on 60,000: pending."
  change = mean_std([(new - old) * 100 for _, old, new in pairs])
  rows_text = "; ".join(f"`{v}` {old:.4f} → {new:.4f}" for v, old, new in pairs)
  return text + (f" Seed 0 test accuracy, 55,000 → 60,000 images ({len(pairs)} rows): "
                 f"{rows_text}; change {change[0]:+.2f} ± {change[1]:.2f} points.")


def init_check(out_dir: str, seeds: list[int]) -> str:
  """The protocol note on the initialisation, from the `keras_init,ce` run."""
  text = ("- Initialisation: our Dense kernels start from Flax's LeCun normal, the official "
          "Keras MLP's from Glorot uniform (both with zero biases). Check (`keras_init,ce`, "
          "seed 0, after the table's runs): `final,ce` with Glorot-uniform kernels.")
  check = load_summary(out_dir, "keras_init,ce", 0)
  original = [r for r in seed_summaries(out_dir, "final,ce", seeds) if "diverged" not in r]
  if check is None or not original:
    return text + " Pending."
  if "diverged" in check:
    return text + f" It diverged: {check['diverged']}."
  acc = mean_std([r["accuracy"] for r in original])
  ece = mean_std([r["ece"] for r in original])
  paper_acc = PAPER[("ce", None)][0]
  return text + (
      f" Test accuracy {check['accuracy']:.4f} and ECE {check['ece']:.4f}, against "
      f"{fmt_mean_std(*acc)} and {fmt_mean_std(*ece)} with ours ({len(original)} seed(s)): "
      f"{(check['accuracy'] - acc[0]) * 100:+.2f} points of accuracy, beside the "
      f"{(paper_acc - acc[0]) * 100:.2f}-point gap to the paper's {paper_acc:.3f}.")


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


def per_run_note(groups: dict, sequential_dir: str, num_seeds: int) -> list[str]:
  """The whole protocol's time (every grid value, every final row on `num_seeds` seeds) at each
  phase's median minutes per member-run, sweeps against sequential runs: the median, as both
  ran beside other work (one sweep holds a 51-minute pause) that a mean would carry along."""
  ours: dict[str, list[float]] = {"tuning": [], "final": []}
  for members in groups.values():
    for variant, _, summary in members:
      ours[_phase(variant)].append(summary["seconds"] / 60)
  theirs = _sequential_minutes(sequential_dir)
  counts = {"tuning": sum(len(grid) for _, grid in study_config.GRIDS.values()),
            "final": len(final_rows(sequential_dir)) * num_seeds}
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
    "Why FL and LS members differ from their sequential runs: those runs were trained when a "
    "single run's loss hyper-parameter was a Python constant that XLA specialised the compiled "
    "step on (e.g. `p ** 2.0` -> `p * p`), while a sweep traces it, so the arithmetic differed in "
    "the last bit. SGD amplifies that: FL, gamma 2, largest parameter difference 7e-9 after 1 "
    "step, 1.2e-7 after 150, then 1.7e-3 after 175 and 8e-3 after 200 (as a ReLU unit near zero "
    "switching sign would do). After some 40,000 steps the two agree only as two runs that differ "
    "in the last bit do, about the seed-to-seed spread (LS: accuracy 2e-3, ECE 3e-3; FL: 4e-3, "
    "4e-3), while LR's, CP's and MbLS's members equal their sequential runs exactly. A selection "
    "can then change where grid values are that close (LS for accuracy: 0.1-0.4 lie within 0.003 "
    "of each other in both studies; FL: gamma 2 against 0.5 for accuracy within 0.006, 3.5 "
    "against 5 for ECE within 0.0013), and FL's decides two claims. With gamma 2, FL (acc.) has "
    "a lower test ECE than LR (acc.); the sequential study's gamma 0.5 had 0.072 ± 0.001 (3 "
    "seeds), above LR's. With gamma 3.5, FL (ECE) has about twice the test ECE of the sequential "
    "study's gamma 5 (0.012 ± 0.001), so LR (ECE) is lowest, where that study found the two "
    "within the seed spread and the paper has FL lower. Since then a single run's hyper-parameters reach its step as opaque scalars "
    "(`losses.traced`), and a member equals its single run bit for bit (200 steps of this recipe "
    "with FL gamma 2 and 5, LS epsilon 0.05 and 0.2, LR alpha 0.1 and 0.3: largest parameter "
    "difference 0.0). This study's sweeps all run code from before that change (its last ones "
    "at commit 31b5a2a), so a row's seeds are one program's; the sequential runs stay as made.")


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
  lines += per_run_note(groups, sequential_dir, num_seeds)
  lines += ["", DRIFT_NOTE,
                "", "Selections (seed 0 tuning) against the sequential study's:", ""]
  for loss in (*TUNED, "mbls"):
    ours, theirs = tuning_scores(out_dir, loss), tuning_scores(sequential_dir, loss)
    if ours is None or theirs is None:
      continue
    picks = [(target, select(ours, target), select(theirs, target)) for target in ("acc", "ece")]
    lines.append(f"- {DISPLAY[loss]}: " + "; ".join(
        f"{target} {a:g}" + (" (the same)" if a == b else f" (sequential: {b:g})")
        for target, a, b in picks) + ".")
  return lines


README_BEGIN = "<!-- lr_table1 table: begin (written by python -m studies.lr_table1 --readme) -->"
README_END = "<!-- lr_table1 table: end -->"


def readme_block(out_dir: str, seeds: list[int]) -> str:
  """The README's summary: the final table and the claims, between the markers."""
  lines = [README_BEGIN, ""] + final_table(out_dir, seeds)
  lines += ["", "Claims (rule and details in the report):", ""] + verdict_table(out_dir, seeds)
  return "\n".join(lines + ["", README_END])


def update_readme(path: str, out_dir: str, seeds: list[int]) -> None:
  """Replaces the text between the markers in ``path`` with `readme_block`."""
  with open(path) as f:
    text = f.read()
  if README_BEGIN not in text or README_END not in text:
    raise SystemExit(f"{path}: no '{README_BEGIN}' ... '{README_END}' markers to write between.")
  head, rest = text.split(README_BEGIN, 1)
  tail = rest.split(README_END, 1)[1]
  with open(path, "w") as f:
    f.write(head + readme_block(out_dir, seeds) + tail)


def write_report(out_dir: str, workdir: str, seeds: list[int]) -> str:
  # Empty unless the summaries come from sweeps.
  sweeps = sweep_notes(out_dir, num_seeds=len(seeds))
  command = ("python -m studies.lr_table1 --sweeps --seeds=0,1,2,3,4,5,6,7,8,9 "
             "--out_dir=docs/results/lr_table1_sweeps --max_members=5" if sweeps
             else "python -m studies.lr_table1 --out_dir=docs/results --readme=README.md")
  lines = ["# Label relaxation Table 1 (Fashion-MNIST), reproduced", "",
           f"Produced by `{command}` "
           "(configs: `studies/lr_table1/config.py`; `--report_only` rewrites it from the "
           "summaries without training). Paper: mean ± std of 10 seeds with the train/test "
           "pool resampled per seed; ours: mean ± sample std over seeds on the original split, "
           "tuning once on seed 0. 'within' = our mean inside the paper's mean ± 2 std.", "",
           "## Final runs (test split)", ""]
  lines += final_table(out_dir, seeds)
  lines += ts_details(out_dir, seeds)
  lines += ["", "## The papers' claims", "",
            "Best on the claim's metric among its rows (unclipped), ours against the paper's "
            "Table 1 where it has the rows. Two rows differ when their means are more than 2 "
            "sample std (the larger) apart with at least two seeds each; otherwise the order "
            "is 'within the seed spread'.", ""]
  lines += verdict_table(out_dir, seeds)
  lines += ["", "## Protocol notes", "",
            "- Splits: the original 60k/10k split, not resampled per seed as the paper does "
            "(the official `get_dataset_by_type` pools the 70k images and draws a random 1/7 "
            "test set per seed); the tuning hold-out is the last 1/6 of the training set as the "
            "paper says (the official code's `train_test_split` holds out 25 % at random).",
            "- Inputs are standardised, `(x/255 - mean) / std` with the dataset's scalar mean "
            "and std; the official Keras code only subtracts the per-pixel training mean image. "
            "One check run of `final,ce` seed 0 with `--config.data.options.normalize=center` "
            "(the scalar mean subtracted, no division) gave test accuracy 0.9045 and ECE 0.0754 "
            "against 0.9043 and 0.0771 standardised (both trained on `train[:55000]`, below): "
            "the input scaling does not move these numbers. (A per-pixel mean is a constant "
            "shift of the input that the first layer's bias can absorb.)",
            train_size_note(out_dir),
            split_check(out_dir, seeds),
            init_check(out_dir, seeds),
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
  lines += sweeps
  figure = reliability_figure(out_dir, workdir, seeds)
  if figure:
    lines += ["", f"![reliability]({os.path.basename(figure)})"]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out_dir, "label_relaxation_table1.md"), "w") as f:
    f.write(text)
  return text
