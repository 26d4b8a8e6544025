"""Pictures of calibration under distribution shift, from `eval.py --shift`'s results
(matplotlib, Agg backend, PNG files).

* `shift_boxplots`: Ovadia et al., "Can You Trust Your Model's Uncertainty? Evaluating
  Predictive Uncertainty Under Dataset Shift" (NeurIPS 2019), Fig. 2: one panel per metric, the
  shift intensity on the x axis (the clean test set, then severities 1..5), and at each intensity
  one box per run over the corruptions' values (whiskers at 1.5 IQR, as matplotlib draws them);
  the clean test set has one value per run, drawn as a short thick line.
* `rotation_curves`: a metric against the rotation angle (rotated MNIST), one line per run.

Both take `runs`, `{label: results["shift"]}`: the `"shift"` entry of several runs'
metrics.json, of kind "corruptions" (boxes) or "rotate" (curves). The dict's layout:

    {"table": str, "kind": "corruptions" | "rotate",
     "clean": {METHOD: {METRIC: float}},
     "corruptions": {NAME: {"1": {METHOD: {METRIC: float}}, ..., "5": ...}},
     "summary": {METHOD: {"1": {METRIC: float}, ...}},
     "rotate": {"0": {METHOD: {METRIC: float}}, "15": ..., ...}}

METHOD is "pre_temperature", "post_temperature" or a calibrator's name. Matplotlib is imported
inside the functions, so importing this module costs nothing.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

# Each metric's axis label and the factor its values are drawn with (fractions as %, AURC in ‰,
# as the reliability diagrams and risk–coverage plots print them).
METRICS: dict[str, tuple[str, float]] = {
    "accuracy": ("accuracy (%)", 100.0),
    "ece": ("ECE (%)", 100.0),
    "aece": ("adaptive ECE (%)", 100.0),
    "nll": ("NLL", 1.0),
    "brier": ("Brier score", 1.0),
    "aurc": ("AURC (‰)", 1000.0),
}
MAX_WIDTH = 16.0  # inches of one row of panels; more panels go on further rows
CLEAN_LABEL = "test"  # Ovadia et al.'s name for the unshifted test set on the intensity axis


def method_title(method: str) -> str:
  """How a figure names `method`: 'before temperature scaling', 'after isotonic', ..."""
  return {"pre_temperature": "before temperature scaling",
          "post_temperature": "after temperature scaling"}.get(method, f"after {method}")


def _check_metrics(metrics: Sequence[str]) -> None:
  if isinstance(metrics, str) or not metrics:
    raise ValueError(f"metrics must be a non-empty sequence of names from {list(METRICS)}, got "
                     f"{metrics!r}.")
  unknown = [m for m in metrics if m not in METRICS]
  if unknown:
    raise ValueError(f"unknown metric(s) {unknown}; valid metrics: {', '.join(METRICS)}.")


def _check_runs(runs: Mapping[str, Any], kind: str, key: str) -> None:
  """Each run a `results["shift"]` dict of `kind` with a non-empty `key` entry."""
  other = {"corruptions": "rotation_curves", "rotate": "shift_boxplots"}[kind]
  if not isinstance(runs, Mapping) or not runs:
    raise ValueError("runs must map at least one label to a results['shift'] dict.")
  for label, run in runs.items():
    if not isinstance(run, Mapping) or "kind" not in run:
      raise ValueError(f"run {label!r} is not a results['shift'] dict (no 'kind' key).")
    if run["kind"] != kind:
      raise ValueError(f"run {label!r} holds a {run['kind']!r} shift, not {kind!r}; draw it with "
                       f"plotting_shift.{other}.")
    if not isinstance(run.get(key), Mapping) or not run[key]:
      raise ValueError(f"run {label!r} has no {key!r} results.")


def _value(cell: Mapping[str, Any], label: str, where: str, method: str, metric: str) -> float:
  """`cell[method][metric]` as a float (NaN when the metric is missing), one line if `method`
  is missing."""
  if method not in cell:
    raise ValueError(f"run {label!r} has no method {method!r} at {where}; its methods: "
                     f"{', '.join(cell)}.")
  value = cell[method].get(metric)
  return math.nan if value is None else float(value)


def _corruption_values(runs, metrics, method):
  """`{metric: {run label: {intensity: [values over corruptions]}}}`, intensities
  `CLEAN_LABEL` then the severities the runs hold, in order."""
  severities = sorted({s for run in runs.values() for by_severity in run["corruptions"].values()
                       for s in by_severity}, key=int)
  table = {}
  for metric in metrics:
    per_run = table.setdefault(metric, {})
    for label, run in runs.items():
      column = {CLEAN_LABEL: ([_value(run["clean"], label, "the clean test set", method, metric)]
                              if isinstance(run.get("clean"), Mapping) else [])}
      for severity in severities:
        column[severity] = [_value(by_severity[severity], label,
                                   f"{name} severity {severity}", method, metric)
                            for name, by_severity in sorted(run["corruptions"].items())
                            if severity in by_severity]
      per_run[label] = {k: [v for v in vs if np.isfinite(v)] for k, vs in column.items()}
  return [CLEAN_LABEL] + severities, table


def _legend_below(fig, handles, labels) -> float:
  """A legend under the panels; returns the figure fraction it takes."""
  columns = min(len(labels), 5)
  rows = math.ceil(len(labels) / columns)
  fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize="small",
             frameon=False)
  return (0.1 + 0.22 * rows) / fig.get_figheight()


def _panels(plt, count: int, panel_width: float, panel_height: float):
  """A figure of `count` panels, in rows of at most `MAX_WIDTH` inches; unused axes hidden."""
  columns = max(1, min(count, int(MAX_WIDTH // panel_width)))
  rows = math.ceil(count / columns)
  fig, axes = plt.subplots(rows, columns, figsize=(panel_width * columns,
                                                   panel_height * rows + 0.6), squeeze=False)
  for ax in axes.flat[count:]:
    ax.set_visible(False)
  return fig, list(axes.flat[:count])


def shift_boxplots(runs: Mapping[str, Mapping[str, Any]], path: str, *,
                   metrics: Sequence[str] = ("accuracy", "ece"),
                   method: str = "pre_temperature", title: Optional[str] = None) -> str:
  """Saves Ovadia et al.'s Fig. 2 of several runs' corruption results as a PNG.

  Args:
    runs: `{label: results["shift"]}` of kind "corruptions", in legend order.
    path: output PNG file (directories are created).
    metrics: one panel each, names of `METRICS`.
    method: whose predictions: "pre_temperature", "post_temperature" or a calibrator's name.
    title: figure title (default: the method and the parameter table).

  Returns:
    `path`.

  Raises:
    ValueError: no runs, a run of kind "rotate" or not a shift dict, an unknown metric, a method
      a run lacks (one line each).
  """
  _check_metrics(metrics)
  _check_runs(runs, "corruptions", "corruptions")
  intensities, table = _corruption_values(runs, metrics, method)
  from calib_jax import plotting  # Deferred: matplotlib (selects the Agg backend first).
  import matplotlib.pyplot as plt  # Deferred: matplotlib.
  from matplotlib import patches  # Deferred: matplotlib.

  num_runs = len(runs)
  colours = [plt.get_cmap("tab10")(k % 10) for k in range(num_runs)]
  group = 0.8  # width of one intensity's boxes together, in x units
  width = group / num_runs
  # Wider panels for more boxes, up to half a row: then the boxes narrow instead.
  panel_width = min(MAX_WIDTH / 2, max(4.2, 1.5 + 0.25 * len(intensities) * num_runs))
  fig, axes = _panels(plt, len(metrics), panel_width, 3.8)
  for ax, metric in zip(axes, metrics):
    axis_label, scale = METRICS[metric]
    for k, (label, column) in enumerate(table[metric].items()):
      offset = (k - (num_runs - 1) / 2) * width
      clean = column[CLEAN_LABEL]
      if clean:  # one value: a short thick line where a box would be
        ax.hlines(scale * clean[0], offset - 0.4 * width, offset + 0.4 * width,
                  colors=[colours[k]], linewidth=3)
      boxes = [(i, column[s]) for i, s in enumerate(intensities) if s != CLEAN_LABEL and column[s]]
      if boxes:
        ax.boxplot([scale * np.asarray(v) for _, v in boxes],
                   positions=[i + offset for i, _ in boxes], widths=0.8 * width,
                   patch_artist=True, manage_ticks=False,
                   boxprops={"facecolor": colours[k], "alpha": 0.75},
                   medianprops={"color": "black"},
                   flierprops={"markersize": 3, "markeredgecolor": colours[k]})
    ax.set_xticks(range(len(intensities)))
    ax.set_xticklabels(intensities)
    ax.set_xlim(-0.6, len(intensities) - 0.4)
    ax.set_xlabel("shift intensity (corruption severity)")
    ax.set_ylabel(axis_label)
    ax.grid(axis="y", alpha=0.3)
  table_name = next(iter(runs.values())).get("table")
  fig.suptitle(title or method_title(method) + (f" (corruption table: {table_name})"
                                                if table_name else ""))
  handles = [patches.Patch(facecolor=c, alpha=0.75, edgecolor="black") for c in colours]
  bottom = _legend_below(fig, handles, list(runs))
  fig.tight_layout(rect=(0, bottom, 1, 1))
  return plotting.save_png(fig, path)


def rotation_curves(runs: Mapping[str, Mapping[str, Any]], path: str, *,
                    metrics: Sequence[str] = ("accuracy", "ece", "nll"),
                    method: str = "pre_temperature", title: Optional[str] = None) -> str:
  """Saves each metric against the rotation angle, one line per run, as a PNG (Ovadia et al.'s
  rotated-MNIST figures).

  Args:
    runs: `{label: results["shift"]}` of kind "rotate", in legend order.
    path: output PNG file (directories are created).
    metrics: one panel each, names of `METRICS`.
    method: whose predictions: "pre_temperature", "post_temperature" or a calibrator's name.
    title: figure title (default: the method).

  Returns:
    `path`.

  Raises:
    ValueError: no runs, a run of kind "corruptions" or not a shift dict, an unknown metric, a
      method a run lacks (one line each).
  """
  _check_metrics(metrics)
  _check_runs(runs, "rotate", "rotate")
  curves = {}
  for label, run in runs.items():
    angles = sorted(run["rotate"], key=float)
    curves[label] = (np.array([float(a) for a in angles]),
                     {m: np.array([_value(run["rotate"][a], label, f"{a}°", method, m)
                                   for a in angles]) for m in metrics})
  from calib_jax import plotting  # Deferred: matplotlib (selects the Agg backend first).
  import matplotlib.pyplot as plt  # Deferred: matplotlib.

  fig, axes = _panels(plt, len(metrics), 4.2, 3.4)
  lines = []
  for ax, metric in zip(axes, metrics):
    axis_label, scale = METRICS[metric]
    lines = [ax.plot(angles, scale * values[metric], marker="o", markersize=3)[0]
             for angles, values in curves.values()]
    top = max(float(angles.max()) for angles, _ in curves.values())
    ax.set_xticks(np.arange(0, top + 1, 30 if top > 90 else 15))
    ax.set_xlabel("rotation angle (°)")
    ax.set_ylabel(axis_label)
    ax.grid(alpha=0.3)
  fig.suptitle(title or method_title(method))
  bottom = _legend_below(fig, lines, list(curves))
  fig.tight_layout(rect=(0, bottom, 1, 1))
  return plotting.save_png(fig, path)
