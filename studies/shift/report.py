"""The shift study's report: docs/results/shift_study.md, its figures, and the README's summary.

Inputs are `results["shift"]` dicts (`eval.py --shift`'s layout, `calib_jax.plotting_shift`):
per row, one per sweep member (5 seeds), and one per deep ensemble. Numbers:

* a row's value in a cell (corruption x severity, or angle) is the mean over its members; its
  interval is the t-interval over the 5 seeds (95 %, t = 2.776 at 4 degrees of freedom);
* a severity's value is the mean over the 15 corruptions (Uncertainty Baselines' cA, cECE,
  cNLL); "CE + TS" is CE's `post_temperature` method (T fitted on the clean held-out split);
* a comparison of two rows (A - B) is paired by seed where both have seeds and by corruption
  where one is an ensemble (one model): the mean difference with its 95 % t-interval, so an
  interval that excludes 0 is a difference the seeds (or corruptions) do not explain.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any, Mapping, Sequence

from scipy import stats

from studies.readme import write_between_markers
from studies.shift import config as study_config

METRICS = ("accuracy", "ece", "nll")
ROW_LABELS = {"ce": "CE", "ce_ts": "CE + TS", "ls": "LS", "focal": "FL", "lr": "LR",
              "mbls_m6": "MbLS", "acls": "ACLS", "ens_ce": "CE ensemble (5)",
              "ens_mbls_m6": "MbLS ensemble (5)", "ens_lr": "LR ensemble (5)"}
SEVERITIES = ("1", "2", "3", "4", "5")
REPORT_FILE = "shift_study.md"  # not shift.md: docs/shift.md is the module's docs
BOXES_FILE = "shift_boxplots.png"
ROTATION_FILE = "shift_rotation.png"
README_BEGIN = "<!-- shift study: begin -->"
README_END = "<!-- shift study: end -->"
_FIGURE_TITLE = ("Fashion-MNIST MLP: each row's mean over 5 seeds, the ensembles of those seeds\n"
                 "CE + TS after temperature scaling, the others before")


def interval(values: Sequence[float]) -> tuple[float, float]:
  """Mean and the half-width of its 95 % t-interval (0 for a single value)."""
  values = [v for v in values if v is not None and not math.isnan(v)]
  if not values:
    return float("nan"), float("nan")
  mean = statistics.fmean(values)
  if len(values) < 2:
    return mean, 0.0
  half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
  return mean, float(half)


def _method_view(shift: Mapping[str, Any], method: str) -> dict[str, Any]:
  """`shift` with `method`'s numbers as "pre_temperature" (so that CE + TS is drawn as a run)."""
  def cell(c):
    return {"pre_temperature": c[method]}
  out = {"table": shift["table"], "kind": shift["kind"], "clean": cell(shift["clean"])}
  if shift["kind"] == "rotate":
    out["rotate"] = {a: cell(c) for a, c in shift["rotate"].items()}
  else:
    out["corruptions"] = {n: {s: cell(c) for s, c in by.items()}
                          for n, by in shift["corruptions"].items()}
  return out


def mean_member(shifts: Sequence[Mapping[str, Any]], method: str = "pre_temperature"
                ) -> dict[str, Any]:
  """One `results["shift"]` dict whose every number is the members' mean (method `method`,
  stored as "pre_temperature")."""
  views = [_method_view(s, method) for s in shifts]

  def average(cells):
    return {"pre_temperature": {m: statistics.fmean(c["pre_temperature"][m] for c in cells)
                                for m in cells[0]["pre_temperature"]}}

  out = {"table": views[0]["table"], "kind": views[0]["kind"],
         "clean": average([v["clean"] for v in views])}
  if out["kind"] == "rotate":
    out["rotate"] = {a: average([v["rotate"][a] for v in views]) for a in views[0]["rotate"]}
  else:
    out["corruptions"] = {n: {s: average([v["corruptions"][n][s] for v in views])
                              for s in by} for n, by in views[0]["corruptions"].items()}
  return out


def severity_values(shift: Mapping[str, Any], metric: str) -> dict[str, float]:
  """'clean' and each severity -> `metric` ("pre_temperature" view), averaged over the
  corruptions."""
  out = {"clean": shift["clean"]["pre_temperature"][metric]}
  for s in SEVERITIES:
    out[s] = statistics.fmean(by[s]["pre_temperature"][metric]
                              for by in shift["corruptions"].values() if s in by)
  return out


def corruption_values(shift: Mapping[str, Any], severity: str, metric: str) -> dict[str, float]:
  """Corruption -> `metric` at `severity`."""
  return {n: by[severity]["pre_temperature"][metric] for n, by in shift["corruptions"].items()}


def angle_values(shift: Mapping[str, Any], metric: str) -> dict[str, float]:
  return {a: c["pre_temperature"][metric] for a, c in shift["rotate"].items()}


def runs_of(loaded: Mapping[str, Mapping[str, Any]], kind: str) -> dict[str, list[dict]]:
  """Report rows -> their models' "pre_temperature" views of `kind`: the rows' members, CE's
  after temperature scaling as "ce_ts", and the ensembles (one model each)."""
  runs = {}
  for row in study_config.ROWS:
    members = loaded.get(row, {}).get(kind)
    if members:
      runs[row] = [_method_view(m, "pre_temperature") for m in members]
      if row == "ce":
        runs["ce_ts"] = [_method_view(m, "post_temperature") for m in members]
  for row in study_config.ENSEMBLE_ROWS:
    ensemble = loaded.get(f"ens_{row}", {}).get(kind)
    if ensemble:
      runs[f"ens_{row}"] = [_method_view(ensemble, "pre_temperature")]
  return runs


def compare(a: list[dict], b: list[dict], kind: str, metric: str, where: str
            ) -> tuple[float, float]:
  """Mean difference A - B of `metric` at `where` (a severity, "clean" or an angle) with its
  95 % t-interval: paired by seed when both rows have several models, else by corruption
  (against the other row's mean member)."""
  if len(a) > 1 and len(b) > 1:
    def value(shift):
      if kind == "rotate":
        return angle_values(shift, metric)[where]
      return severity_values(shift, metric)[where]
    return interval([value(x) - value(y) for x, y in zip(a, b)])
  mean_a, mean_b = mean_member(a), mean_member(b)
  if kind == "rotate" or where == "clean":
    value = (angle_values if kind == "rotate" else
             lambda s, m: {"clean": s["clean"]["pre_temperature"][m]})
    return value(mean_a, metric)[where] - value(mean_b, metric)[where], float("nan")
  va, vb = corruption_values(mean_a, where, metric), corruption_values(mean_b, where, metric)
  return interval([va[n] - vb[n] for n in va])


def _fmt(mean: float, half: float, digits: int = 3) -> str:
  if math.isnan(half):
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {half:.{digits}f}"


def _cell(values: Sequence[float]) -> str:
  """A table cell: the mean ± its interval over seeds, or the one model's value (an ensemble)."""
  mean, half = interval(values)
  return _fmt(mean, half if len(values) > 1 else float("nan"))


def severity_table(runs: Mapping[str, list[dict]], metric: str) -> list[str]:
  """Markdown: one line per row, the metric on the clean test set and at each severity."""
  lines = ["| row | test | " + " | ".join(f"severity {s}" for s in SEVERITIES) + " |",
           "|---|" + "---:|" * (len(SEVERITIES) + 1)]
  for row, models in runs.items():
    per_model = [severity_values(m, metric) for m in models]
    cells = [_cell([v[w] for v in per_model]) for w in ("clean",) + SEVERITIES]
    lines.append(f"| {ROW_LABELS[row]} | " + " | ".join(cells) + " |")
  return lines


def angle_table(runs: Mapping[str, list[dict]], metric: str) -> list[str]:
  angles = sorted(next(iter(runs.values()))[0]["rotate"], key=float)  # "105" after "15" as text
  lines = ["| row | " + " | ".join(f"{a}°" for a in angles) + " |",
           "|---|" + "---:|" * len(angles)]
  for row, models in runs.items():
    per_model = [angle_values(m, metric) for m in models]
    lines.append(f"| {ROW_LABELS[row]} | "
                 + " | ".join(f"{statistics.fmean(v[a] for v in per_model):.3f}" for a in angles)
                 + " |")
  return lines


def load(workdir: str, locate) -> dict[str, dict[str, Any]]:
  """`{row: {kind: [member shift dicts]}, ens_<row>: {kind: shift dict}}` from the metrics files
  `locate(workdir, row, kind, member)` names (member None: the row's ensemble)."""
  loaded: dict[str, dict[str, Any]] = {}
  for row in study_config.ROWS:
    for kind in ("corruptions", "rotate"):
      members = []
      for member in range(len(study_config.SEEDS)):
        path = locate(workdir, row, kind, member)
        if os.path.exists(path):
          with open(path) as f:
            members.append(json.load(f)["shift"])
      if len(members) == len(study_config.SEEDS):
        loaded.setdefault(row, {})[kind] = members
      if row in study_config.ENSEMBLE_ROWS:
        path = locate(workdir, row, kind, None)
        if os.path.exists(path):
          with open(path) as f:
            loaded.setdefault(f"ens_{row}", {})[kind] = json.load(f)["shift"]
  return loaded


def _answer_lines(corr: Mapping[str, list[dict]], rot: Mapping[str, list[dict]]) -> list[str]:
  """The issue's four questions, each with the differences (95 % intervals) it rests on."""
  lines = []

  def diff(runs, a, b, metric, where, kind="corruptions"):
    if a not in runs or b not in runs:
      return None
    return compare(runs[a], runs[b], kind, metric, where)

  def cell(d):
    return "pending" if d is None else _fmt(*d)

  def table(title, pairs, runs, wheres, kind="corruptions"):
    head = "| " + title + " | " + " | ".join(
        ("test" if w == "clean" else (f"{w}°" if kind == "rotate" else f"severity {w}"))
        for w in wheres) + " |"
    out = [head, "|---|" + "---:|" * len(wheres)]
    for a, b, metric in pairs:
      out.append(f"| {metric.upper() if metric != 'accuracy' else 'accuracy'}: "
                 f"{ROW_LABELS[a]} − {ROW_LABELS[b]} | "
                 + " | ".join(cell(diff(runs, a, b, metric, w, kind)) for w in wheres) + " |")
    return out

  wheres = ("clean",) + SEVERITIES
  losses = [r for r in ("ls", "focal", "lr", "mbls_m6", "acls") if r in corr]
  lines += ["### 1. Does training-time calibration survive shift?", "",
            "ECE of each loss minus CE's, paired by seed (negative: better calibrated than CE):",
            ""]
  lines += table("ECE difference", [(r, "ce", "ece") for r in losses], corr, wheres)
  lines += ["", "### 2. Does temperature scaling fitted on clean data help or hurt under shift?",
            "", "CE + TS minus CE (T fitted on the clean held-out split), paired by seed:", ""]
  lines += table("difference", [("ce_ts", "ce", "ece"), ("ce_ts", "ce", "nll")], corr, wheres)
  if rot:
    angles = ("0", "45", "90", "135", "180")
    lines += ["", "Under rotation:", ""]
    lines += table("difference", [("ce_ts", "ce", "ece"), ("ce_ts", "ce", "nll")], rot, angles,
                   "rotate")
  lines += ["", "### 3. Do ensembles beat the calibration losses?", "",
            "The CE ensemble minus each loss's mean member, paired by corruption (one ensemble):",
            ""]
  lines += table("difference", [("ens_ce", r, m) for r in ["ce_ts"] + losses
                                for m in ("ece", "nll")], corr, SEVERITIES)
  lines += ["", "### 4. Is an ensemble of MbLS members better than one of CE members?", "",
            "MbLS ensemble minus CE ensemble, paired by corruption:", ""]
  lines += table("difference", [("ens_mbls_m6", "ens_ce", m) for m in ("accuracy", "ece", "nll")],
                 corr, SEVERITIES)
  return lines


_UNRESOLVED = "no difference the intervals resolve"  # `_verdict`'s, which `_short_verdict` shortens


def _short_verdict(mean: float, half: float) -> str:
  """`_verdict` in a word (lower is better): the README's one line per question."""
  verdict = _verdict(mean, half)
  return "unresolved" if verdict == _UNRESOLVED else verdict


def _verdict(mean: float, half: float, lower_is_better: bool = True) -> str:
  """Words for a difference A - B with its 95 % interval."""
  if math.isnan(mean):
    return "pending"
  if math.isnan(half) or abs(mean) <= half:
    return _UNRESOLVED
  better = (mean < 0) == lower_is_better
  return "better" if better else "worse"


def readme_block(loaded: Mapping[str, Mapping[str, Any]], report_link: str) -> str:
  """The README's summary between `README_BEGIN` and `README_END`: each row's accuracy, ECE
  and NLL on the clean test set and at severities 3 and 5 (mean over the corruptions, then over
  the seeds), and the four questions' key differences at severity 5 with their intervals."""
  corr = runs_of(loaded, "corruptions")
  lines = [README_BEGIN, ""]
  if not corr:
    return "\n".join(lines + ["No row has finished its evaluation yet.", "", README_END])
  wheres = ("clean", "3", "5")
  lines += ["| row | " + " | ".join(f"{m} ({'test' if w == 'clean' else 'severity ' + w})"
                                     for w in wheres for m in ("accuracy", "ECE", "NLL")) + " |",
            "|---|" + "---:|" * (3 * len(wheres))]
  for row, models in corr.items():
    cells = []
    for where in wheres:
      for metric in METRICS:
        cells.append(_cell([severity_values(m, metric)[where] for m in models]))
    lines.append(f"| {ROW_LABELS[row]} | " + " | ".join(cells) + " |")
  lines += ["", f"At severity 5, differences A − B with 95 % intervals (details in "
            f"[the report]({report_link})):", ""]
  # One line per question, however many rows have finished (the README's length is bounded).
  questions = [("Does training-time calibration survive shift? ECE, loss − CE", "ece",
                [(r, "ce") for r in ("ls", "focal", "lr", "mbls_m6", "acls")], "{a}"),
               ("Does TS fitted on clean data help? ECE, CE + TS − CE", "ece",
                [("ce_ts", "ce")], ""),
               ("Do ensembles beat the losses? ECE, CE ensemble − loss", "ece",
                [("ens_ce", r) for r in ("ce_ts", "ls", "focal", "lr", "mbls_m6", "acls")],
                "{b}"),
               ("Is an MbLS ensemble better than a CE one? NLL, MbLS ens. − CE ens.", "nll",
                [("ens_mbls_m6", "ens_ce")], "")]
  for title, metric, pairs, label in questions:
    parts = []
    for a, b in pairs:
      if a not in corr or b not in corr:
        continue
      mean, half = compare(corr[a], corr[b], "corruptions", metric, "5")
      name = label.format(a=ROW_LABELS[a], b=ROW_LABELS[b])
      parts.append(f"{name + ' ' if name else ''}{_fmt(mean, half)} ({_short_verdict(mean, half)})")
    if parts:
      lines.append(f"- {title}: {'; '.join(parts)}")
  lines += ["", README_END]
  return "\n".join(lines)


def update_readme(path: str, block: str) -> None:
  """Replaces the text between the markers in `path` with `block`."""
  write_between_markers(path, README_BEGIN, README_END, block)


def write_report(workdir: str, out_dir: str, readme: str = "") -> str:
  """Writes `<out_dir>/shift_study.md` and its figures from the committed results
  (`<out_dir>/shift/...`, `studies.shift.run`), and with `readme` the summary between that
  file's markers; returns the report's path."""
  from calib_jax import plotting_shift  # pylint: disable=import-outside-toplevel
  from studies.shift import run  # pylint: disable=import-outside-toplevel
  del workdir  # the report reads the committed results only
  loaded = load(out_dir, lambda d, row, kind, m: run.result_path(d, row, kind, m))
  corr, rot = runs_of(loaded, "corruptions"), runs_of(loaded, "rotate")
  lines = ["# Calibration under distribution shift (Fashion-MNIST MLP)", "",
           "Produced by `python -m studies.shift` (rows: `studies/shift/config.py`; evaluation: "
           "`eval.py --shift`, `studies/shift/run.py`). Mean over the 5 seeds ± the 95 % "
           "t-interval; a severity's value is the mean over the 15 corruptions (CIFAR-10-C "
           "table, grey images corrupted as 3 equal channels).", ""]
  done = [ROW_LABELS[r] for r in corr]
  lines += [f"Rows with results: {', '.join(done) if done else 'none yet'}.", ""]
  # Each kind: its figure (the rows' mean members) and a table per metric.
  for runs, draw, figure, axis, table, title in (
      (corr, plotting_shift.shift_boxplots, BOXES_FILE, "severity", severity_table,
       "CIFAR-10-C table"),
      (rot, plotting_shift.rotation_curves, ROTATION_FILE, "angle", angle_table,
       "rotated test images")):
    if not runs:
      continue
    draw({ROW_LABELS[r]: mean_member(m) for r, m in runs.items()}, os.path.join(out_dir, figure),
         metrics=METRICS, title=f"{_FIGURE_TITLE} ({title})")
    lines += [f"![accuracy, ECE and NLL against {axis}]({figure})", ""]
    for metric in METRICS:
      name = "Accuracy" if metric == "accuracy" else metric.upper()
      lines += [f"## {name} against {axis}", ""] + table(runs, metric) + [""]
  lines += ["## The questions", ""] + _answer_lines(corr, rot) + [""]
  path = os.path.join(out_dir, REPORT_FILE)
  with open(path, "w") as f:
    f.write("\n".join(lines))
  if readme:
    link = os.path.relpath(path, os.path.dirname(os.path.abspath(readme)))
    update_readme(readme, readme_block(loaded, link))
  return path
