"""Reliability diagrams (binned and smoothed) and risk–coverage plots (matplotlib, Agg backend,
PNG files).

Figures are made with matplotlib's object API (`Figure` on an Agg canvas), not pyplot: pyplot's
import and figure registry are start-up a report does not need (~0.1–0.2 s of
`eval.py --predictions`), and a figure nobody registered needs no closing. `save_png` still
closes the figures pyplot made (`plotting_maps`, `plotting_shift`).
"""
import os
import textwrap
from typing import Mapping, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # for this package's pyplot users (`plotting_maps`, `plotting_shift`)
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from calib_jax import metrics  # noqa: E402
from calib_jax.plotting_data import reliability_summary  # noqa: E402


def _draw_reliability(ax_bars, ax_hist, summary: Mapping, title: str) -> float:
  """Draws one `plotting_data.reliability_summary`; returns its ECE."""
  num_bins, counts = summary["num_bins"], summary["counts"]
  conf, acc, ece = summary["confidence"], summary["accuracy"], summary["ece"]
  edges = np.linspace(0.0, 1.0, num_bins + 1)
  centers, width = (edges[:-1] + edges[1:]) / 2, 1.0 / num_bins
  filled = counts > 0
  ax_bars.bar(centers[filled], acc[filled], width=width, edgecolor="black",
              color="tab:blue", label="accuracy")
  # The gap between a bin's accuracy and its mean confidence is what ECE averages.
  low, high = np.minimum(acc, conf), np.maximum(acc, conf)
  ax_bars.bar(centers[filled], (high - low)[filled], bottom=low[filled], width=width,
              color="tab:red", alpha=0.35, hatch="//", edgecolor="tab:red", label="gap")
  ax_bars.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
  ax_bars.set_xlim(0, 1)
  ax_bars.set_ylim(0, 1)
  ax_bars.set_ylabel("accuracy")
  # y given: matplotlib's automatic title height measures every tick of the axes again (~1/6
  # of a diagram's drawing) only to find 1.0 here, with no ticks or labels on top.
  ax_bars.set_title(f"{title}  (ECE = {100 * ece:.2f}%)" if title else f"ECE = {100 * ece:.2f}%",
                    y=1.0)
  ax_bars.legend(loc="upper left", fontsize="small")
  total = max(int(counts.sum()), 1)
  ax_hist.bar(centers, counts / total, width=width, color="tab:gray", edgecolor="black")
  mean_conf, mean_acc = summary["average_confidence"], summary["accuracy_mean"]
  ax_hist.axvline(mean_conf, color="tab:red", linestyle="--", label="avg confidence")
  ax_hist.axvline(mean_acc, color="tab:blue", linestyle=":", label="accuracy")
  ax_hist.set_xlim(0, 1)
  ax_hist.set_xlabel("confidence")
  ax_hist.set_ylabel("fraction")
  ax_hist.legend(loc="upper left", fontsize="small")
  return ece


# The margins (inches) tight_layout finds around [0, 1] panels with axis labels and a title
# line, set directly: tight_layout renders every tick once more, ~1/3 of a diagram's cost.
_MARGINS = {"left": 0.72, "right": 0.26, "top": 0.37, "bottom": 0.59}
_COLUMN_GAP, _TITLE_LINE = 0.8, 0.32  # inches between columns; per line of a figure title


def _fixed_layout(fig, columns: int, title_lines: int = 0) -> None:
  """`tight_layout`'s result for the reliability panels, without its extra render."""
  width, height = fig.get_size_inches()
  axis_width = (width - _MARGINS["left"] - _MARGINS["right"] - _COLUMN_GAP * (columns - 1)
                ) / columns
  fig.subplots_adjust(left=_MARGINS["left"] / width, right=1 - _MARGINS["right"] / width,
                      top=1 - (_MARGINS["top"] + _TITLE_LINE * title_lines) / height,
                      bottom=_MARGINS["bottom"] / height, hspace=0.1,
                      wspace=_COLUMN_GAP / axis_width)


def new_figure(figsize: Tuple[float, float]) -> Figure:
  """A figure of `figsize` inches on its own Agg canvas, outside pyplot's registry (nothing to
  close: it is freed with its last reference)."""
  fig = Figure(figsize=figsize)
  FigureCanvasAgg(fig)
  return fig


def save_png(fig, path: str) -> str:
  """Writes `fig` to `path` as a 100-dpi PNG (creating its folder), closes it if pyplot made it
  (pyplot holds its figures until closed), returns `path`."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fig.savefig(path, dpi=100, format="png")
  if fig.canvas.manager is not None:  # a pyplot figure; pyplot is imported already then
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    plt.close(fig)
  return path


def reliability_diagram(probs, labels, path: str, num_bins: int = 15,
                        title: Optional[str] = None, mask=None) -> str:
  """Saves a reliability diagram (accuracy bars, gap shading, confidence histogram) as PNG.

  Args:
    probs: `[..., C]` probabilities; labels `[...]`; optional bool mask `[...]`.
    path: output PNG file (directories are created).
    num_bins: equal-width confidence bins.
    title: shown before the ECE in the title.

  Returns:
    `path`.
  """
  ax_bars, ax_hist = new_figure((5, 6)).subplots(
      2, 1, gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
  fig = ax_bars.figure
  _draw_reliability(ax_bars, ax_hist, reliability_summary(probs, labels, num_bins, mask),
                    title or "")
  _fixed_layout(fig, 1)
  return save_png(fig, path)


def reliability_diagrams(models: Mapping[str, Tuple[object, object]], path: str,
                         num_bins: int = 15, title: Optional[str] = None) -> str:
  """Side-by-side reliability diagrams, one column per model: `{name: (probs, labels)}`."""
  if not models:
    raise ValueError("models must contain at least one (probs, labels) entry.")
  return draw_reliability_diagrams(
      {name: reliability_summary(probs, labels, num_bins) for name, (probs, labels)
       in models.items()}, path, title)


def draw_reliability_diagrams(summaries: Mapping[str, Mapping], path: str,
                              title: Optional[str] = None) -> str:
  """`reliability_diagrams` of numbers taken already: `{name: plotting_data.reliability_summary
  (...)}` (only drawing here: no device program runs)."""
  if not summaries:
    raise ValueError("summaries must contain at least one reliability_summary.")
  cols = len(summaries)
  fig = new_figure((4.5 * cols, 6))
  axes = fig.subplots(2, cols, squeeze=False, gridspec_kw={"height_ratios": [3, 1]},
                      sharex=True)
  for col, (name, summary) in enumerate(summaries.items()):
    _draw_reliability(axes[0, col], axes[1, col], summary, name)
  lines = 0
  if title:  # wrapped to the figure's width: one column is narrower than a long title
    wrapped = textwrap.fill(title, width=int(11 * 4.5 * cols))
    fig.suptitle(wrapped)
    lines = wrapped.count("\n") + 1
  _fixed_layout(fig, cols, lines)
  return save_png(fig, path)


def risk_coverage_plot(curves: Mapping[str, Tuple[object, object]], path: str,
                       title: Optional[str] = None,
                       risk_levels: Sequence[float] = ()) -> str:
  """Tie-aware risk–coverage curves of several runs/scores on one axes, AURC in the legend.

  Args:
    curves: `{name: (scores [N], correct [N])}`, higher score = more confident.
    path: output PNG file.
    title: optional axes title.
    risk_levels: optional horizontal reference lines (e.g. `(0.05,)`).

  Returns:
    `path`.
  """
  if not curves:
    raise ValueError("curves must contain at least one (scores, correct) entry.")
  fig = new_figure((6, 4.5))
  ax = fig.subplots()
  for name, (scores, correct) in curves.items():
    coverage, risk = metrics.risk_coverage_curve(scores, correct)
    value = float(metrics.aurc(scores, correct))
    ax.plot(np.asarray(coverage), 100 * np.asarray(risk),
            label=f"{name} (AURC = {1000 * value:.1f}‰)")
  for level in risk_levels:
    ax.axhline(100 * level, color="gray", linestyle=":", linewidth=1)
  ax.set_xlim(0, 1)
  ax.set_ylim(bottom=0)
  ax.set_xlabel("coverage")
  ax.set_ylabel("risk (% error of accepted)")
  if title:
    ax.set_title(title)
  ax.legend(fontsize="small")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return save_png(fig, path)


def smooth_reliability_diagram(probs, labels, path: str, title: Optional[str] = None,
                               mask=None, bandwidth: Optional[float] = None,
                               num_points: int = 200) -> str:
  """Saves relplot's smoothed reliability diagram (Błasiok & Nakkiran, 2023) as PNG.

  Top: the kernel-smoothed accuracy `E[correct | confidence = t]` (red, its width following
  the density of confidences, as relplot draws it), the diagonal, and the gap to it shaded;
  bottom: the smoothed density of the confidences. The title gives the smooth ECE and the
  kernel bandwidth σ (relplot's automatic choice unless `bandwidth` is given); both come from
  `metrics.smooth_calibration_curve`.

  Args:
    probs: `[..., C]` probabilities; labels `[...]`; optional bool mask `[...]`.
    path: output PNG file (directories are created).
    title: shown before the smooth ECE in the title.
    bandwidth: kernel width σ in (0, 1]; None for the automatic one.
    num_points: points of the curve on [0, 1].

  Returns:
    `path`.
  """
  curve = metrics.smooth_calibration_curve(probs, labels, mask=mask, bandwidth=bandwidth,
                                           num_points=num_points)
  return draw_smooth_reliability(curve, path, title)


def draw_smooth_reliability(curve: Mapping, path: str, title: Optional[str] = None) -> str:
  """`smooth_reliability_diagram` of a curve taken already (`metrics.smooth_calibration_curve`'s
  dict; only drawing here: no device program runs)."""
  t, accuracy, density = curve["t"], curve["accuracy"], curve["density"]
  # Where almost no confidence falls the smoothed accuracy is a ratio of two near-zero sums
  # (a noise spike, not data): not drawn, as relplot's density-scaled line leaves it out.
  accuracy = np.where(density >= 1e-3 * float(np.max(density)), accuracy, np.nan)
  ax_curve, ax_density = new_figure((5, 6)).subplots(
      2, 1, gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
  fig = ax_curve.figure
  ax_curve.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
  ax_curve.fill_between(t, t, accuracy, where=np.isfinite(accuracy), color="tab:red",
                        alpha=0.15, label="gap")
  # Line width follows the density, so sparsely populated confidences draw thin.
  width = 0.5 + 4.0 * density / max(float(density.max()), 1e-12)
  points = np.stack([t, accuracy], axis=1)
  segments = np.stack([points[:-1], points[1:]], axis=1)
  from matplotlib.collections import LineCollection  # pylint: disable=import-outside-toplevel
  ax_curve.add_collection(LineCollection(segments, linewidths=(width[:-1] + width[1:]) / 2,
                                         colors="tab:red", label="smoothed accuracy"))
  ax_curve.set_xlim(0, 1)
  ax_curve.set_ylim(0, 1)
  ax_curve.set_ylabel("accuracy")
  head = f"smECE = {100 * curve['smooth_ece']:.2f}%  (σ = {curve['bandwidth']:.3f})"
  ax_curve.set_title(f"{title}  {head}" if title else head, y=1.0)  # y: see _draw_reliability
  ax_curve.legend(loc="upper left", fontsize="small")
  ax_density.fill_between(t, 0, density, color="tab:gray", alpha=0.6)
  ax_density.plot(t, density, color="black", linewidth=1)
  ax_density.set_xlim(0, 1)
  ax_density.set_ylim(bottom=0)
  ax_density.set_xlabel("confidence")
  ax_density.set_ylabel("density")
  _fixed_layout(fig, 1)
  return save_png(fig, path)
