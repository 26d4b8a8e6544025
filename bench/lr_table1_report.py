"""The report of the label-relaxation Table 1 study (`bench/lr_table1.py`): reads the run
summaries, selects each tuned loss's values, and writes the tables, the claim-by-claim verdicts,
the reliability figure and the README's summary table. It trains nothing.

    .venv/bin/python bench/lr_table1.py --report_only --out_dir=docs/results --readme=README.md
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
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


@functools.cache  # The config module is read once per process, not per table row.
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


@dataclasses.dataclass(frozen=True)
class Row:
  """One final configuration and what its seeds gave on the test set."""
  key: str                 # 'ce', 'ce_ts', a loss of TUNED, 'mbls', 'acls'
  variant: str
  target: str | None       # the selection target of a tuned value ('acc', 'ece') or None
  runs: int                # seeds with a summary (finished or diverged)
  acc: tuple[float, float] | None  # mean, sample std over the finished seeds
  ece: tuple[float, float] | None  # (CE + T: after the grid temperature)
  finished: int

  @property
  def clipped(self) -> bool:
    return self.variant.endswith("clip")

  @property
  def label(self) -> str:
    loss = "ce" if self.key == "ce_ts" else self.key
    text = {"ce_ts": "CE + T opt. (grid, ECE)"}.get(self.key, DISPLAY[loss])
    if self.target:
      text += f" (opt. for {'acc.' if self.target == 'acc' else 'ECE'})"
    return text + (", clip 2" if self.clipped else "")

  @property
  def chosen(self) -> str:
    parts = self.variant.split(",")
    return parts[2] if len(parts) > 2 and parts[2] != "clip" else "–"


def rows(out_dir: str, seeds: list[int]) -> list[Row]:
  """Every final configuration known so far with its mean ± std over the finished seeds."""
  result = []
  for key, variant, target in final_rows(out_dir):
    runs = _seeds_of(out_dir, variant, seeds)
    done = [r for r in runs if "diverged" not in r]
    ece_key = "ece_post_grid" if key == "ce_ts" else "ece"
    acc = _mean_std([r["accuracy"] for r in done]) if done else None
    ece = _mean_std([r[ece_key] for r in done]) if done else None
    result.append(Row(key, variant, target, len(runs), acc, ece, len(done)))
  return result


def final_table(out_dir: str, seeds: list[int]) -> list[str]:
  lines = ["| row | chosen | seeds | acc (ours) | acc (paper) | within | ECE (ours) | "
           "ECE (paper) | within |", "|---|---|---:|---:|---:|---|---:|---:|---|"]
  for row in rows(out_dir, seeds):
    paper = PAPER.get((row.key, row.target))
    paper_acc = _fmt(*paper[:2]) if paper else "–"
    paper_ece = _fmt(*paper[2:]) if paper else "–"
    if not row.finished:
      status = "pending" if not row.runs else f"diverged on {row.runs}/{row.runs}"
      lines.append(f"| {row.label} | {row.chosen} | 0/{len(seeds)} | {status} | {paper_acc} | | "
                   f"{status} | {paper_ece} | |")
      continue
    seeds_text = f"{row.finished}/{len(seeds)}"
    if row.runs > row.finished:
      seeds_text += f" ({row.runs - row.finished} diverged)"
    lines.append(
        f"| {row.label} | {row.chosen} | {seeds_text} | {_fmt(*row.acc)} | {paper_acc} | "
        f"{_within(row.acc, paper[:2]) if paper else ''} | {_fmt(*row.ece)} | {paper_ece} | "
        f"{_within(row.ece, paper[2:]) if paper else ''} |")
  return lines


# ----------------------------------------------------------------------------- verdicts


@dataclasses.dataclass(frozen=True)
class Claim:
  """A claim of a paper about ``metric`` among ``candidates`` (row key, selection target;
  unclipped rows): ``expected`` is the best (kind 'best') or no worse than any other beyond
  the seed spread (kind 'not_worse')."""
  text: str
  metric: str  # 'acc' (higher is better) or 'ece' (lower is better)
  candidates: tuple[tuple[str, str | None], ...]
  expected: tuple[str, str | None]
  kind: str = "best"


_ACC_TUNED = (("ce", None), ("ls", "acc"), ("ecp", "acc"), ("focal", "acc"), ("lr", "acc"))
_ECE_TUNED = (("ce", None), ("ls", "ece"), ("ecp", "ece"), ("focal", "ece"), ("lr", "ece"))
CLAIMS = (
    Claim("LR paper: LR has the lowest ECE of the losses tuned for accuracy", "ece",
          _ACC_TUNED, ("lr", "acc")),
    Claim("LR paper: LR has the lowest ECE of the losses tuned for ECE (its Table 1 has FL "
          "lower on Fashion-MNIST, the 'single exception')", "ece", _ECE_TUNED, ("lr", "ece")),
    Claim("LR paper: LS has the highest accuracy (losses tuned for accuracy)", "acc",
          _ACC_TUNED, ("ls", "acc")),
    Claim("LR paper: LR (tuned for ECE) is better calibrated than CE + temperature scaling",
          "ece", (("lr", "ece"), ("ce_ts", None)), ("lr", "ece")),
    Claim("LR paper: FL (tuned for ECE) generalises worse than LR (tuned for ECE)", "acc",
          (("lr", "ece"), ("focal", "ece")), ("lr", "ece")),
    Claim("MbLS paper: MbLS has a lower ECE than CE, LS and FL (tuned for ECE)", "ece",
          (("mbls", "ece"), ("ce", None), ("ls", "ece"), ("focal", "ece")), ("mbls", "ece")),
    Claim("ACLS paper: ACLS has a lower ECE than CE, LS and FL (tuned for ECE)", "ece",
          (("acls", None), ("ce", None), ("ls", "ece"), ("focal", "ece")), ("acls", None)),
    Claim("MbLS paper: MbLS keeps the accuracy of CE", "acc", (("mbls", "ece"), ("ce", None)),
          ("mbls", "ece"), kind="not_worse"),
    Claim("ACLS paper: ACLS keeps the accuracy of CE", "acc", (("acls", None), ("ce", None)),
          ("acls", None), kind="not_worse"),
)


def _name(row_id: tuple[str, str | None]) -> str:
  key, target = row_id
  name = "CE + T" if key == "ce_ts" else DISPLAY[key]
  return name + (f" ({'acc.' if target == 'acc' else 'ECE'})" if target else "")


def _ranked(values: dict, metric: str) -> list:
  return sorted(values, key=lambda r: values[r][0], reverse=metric == "acc")


def verdict(claim: Claim, stats: dict[tuple[str, str | None], tuple[float, float, int]]
            ) -> tuple[str, str]:
  """(ours, verdict) of one claim from ``stats``: row id -> (mean, std, finished seeds).

  Two rows differ when their means are more than 2 sample std (the larger) apart with at least
  two seeds each; otherwise the order is within the seed spread."""
  missing = [_name(r) for r in claim.candidates if r not in stats]
  if missing:
    return "–", f"pending ({', '.join(missing)})"
  order = _ranked({r: stats[r] for r in claim.candidates}, claim.metric)
  ours = ", ".join(f"{_name(r)} {stats[r][0]:.3f} ± {stats[r][1]:.3f}" for r in order[:2])

  def apart(a, b) -> bool | None:
    """Whether a and b differ beyond the seed spread (None: a single seed has no spread)."""
    (ma, sa, na), (mb, sb, nb) = stats[a], stats[b]
    return None if min(na, nb) < 2 else abs(ma - mb) > 2 * max(sa, sb)

  best, expected = order[0], claim.expected
  if best == expected:
    differs = apart(best, order[1])
    if differs is None:
      return ours, "holds on one seed (no spread yet)"
    return ours, ("holds" if differs else
                  f"holds, but {_name(order[1])} is within the seed spread")
  differs = apart(best, expected)
  if differs is None:
    return ours, f"does not hold on one seed: {_name(best)} is better"
  if differs:
    return ours, f"does not hold: {_name(best)} is better"
  if claim.kind == "not_worse":
    return ours, f"holds: {_name(best)} is better within the seed spread"
  return ours, f"undecided: {_name(best)} and {_name(expected)} within the seed spread"


def verdict_table(out_dir: str, seeds: list[int]) -> list[str]:
  """The claims, what the paper's Table 1 gives (where it has the rows) and what we measure."""
  stats = {}
  for row in rows(out_dir, seeds):
    if row.finished and not row.clipped:
      stats[("acc", row.key, row.target)] = (*row.acc, row.finished)
      stats[("ece", row.key, row.target)] = (*row.ece, row.finished)
  lines = ["| claim | paper's Table 1 (Fashion-MNIST) | ours (best, next) | verdict |",
           "|---|---|---|---|"]
  for claim in CLAIMS:
    index = 0 if claim.metric == "acc" else 2
    paper = {r: (PAPER[r][index], PAPER[r][index + 1], 10) for r in claim.candidates
             if r in PAPER}
    if len(paper) == len(claim.candidates):
      best = _ranked(paper, claim.metric)[0]
      paper_text = f"{_name(best)} {paper[best][0]:.3f}"
    else:
      paper_text = "not in this table"
    ours, text = verdict(claim, {r: stats[(claim.metric, *r)] for r in claim.candidates
                                 if (claim.metric, *r) in stats})
    lines.append(f"| {claim.text} | {paper_text} | {ours} | {text} |")
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
  grids = _study().GRIDS
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
  """The protocol note on the test split, from the `pooled,ce,<k>` runs there are."""
  study = _study()
  folds = [s for k in range(study.POOLED_FOLDS)
           if (s := load_summary(out_dir, f"pooled,ce,{k}", k)) and "diverged" not in s]
  original = [r for r in _seeds_of(out_dir, "final,ce", seeds) if "diverged" not in r]
  paper = PAPER[("ce", None)]
  text = ("- The test split: the paper tests on a random 1/7 of the pooled 70k images per seed, "
          "we on the original 10k test images. Check (`pooled,ce,<k>`, "
          f"{study.POOLED_FOLDS} runs after the table's): CE trained on the other 50k training "
          "images plus the 10k test images and tested on training images 10k·k..10k·(k+1).")
  if not folds or not original:
    return text + " Pending."
  acc = _mean_std([r["accuracy"] for r in folds])
  ece = _mean_std([r["ece"] for r in folds])
  ours = _mean_std([r["accuracy"] for r in original])
  return text + (
      f" On {len(folds)} fold(s): accuracy {_fmt(*acc)} (ECE {_fmt(*ece)}), against "
      f"{_fmt(*ours)} on the original test set ({len(original)} seed(s)) and the paper's "
      f"{_fmt(*paper[:2])} ("
      f"{'inside' if _within(acc, paper[:2]) == 'yes' else 'outside'} its mean ± 2 std). The "
      "rest of the table is measured on the original split.")


README_BEGIN = "<!-- lr_table1 table: begin (written by bench/lr_table1.py --readme) -->"
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
  lines = ["# Label relaxation Table 1 (Fashion-MNIST), reproduced", "",
           "Produced by `python bench/lr_table1.py --out_dir=docs/results --readme=README.md` "
           "(configs: `configs/lr_table1.py`; `--report_only` rewrites it from the summaries "
           "without training). Paper: mean ± std of 10 seeds with the train/test "
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
            "- Inputs are standardised, `(x/255 - mean) / std`; the official Keras code only "
            "subtracts the training mean. One check run of `final,ce` seed 0 with "
            "`--config.data.options.normalize=center` (the official preprocessing) gave test "
            "accuracy 0.9045 and ECE 0.0754 against 0.9043 and 0.0771 standardised: the input "
            "scaling does not move these numbers.",
            split_check(out_dir, seeds),
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


