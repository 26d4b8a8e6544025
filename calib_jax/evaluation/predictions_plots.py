"""The plots of `evaluation.predictions`' report (`reliability.png`, `smooth_reliability.png`):
their numbers taken on the device (`plot_numbers` from the logits, `plot_numbers_of` from the
confidences the report keeps), then drawn (`draw`, matplotlib).

`predictions.evaluate_and_write` takes the numbers before it dispatches the bootstrap intervals
(a program dispatched after them would wait for them) and draws while they compute.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import metrics, plotting_data, posthoc
from calib_jax.evaluation import ensembles


def plot_numbers(arrays: Mapping[str, np.ndarray], results: dict[str, Any],
                 calibrators: Mapping[str, posthoc.Calibrator] | None) -> dict[str, Any]:
  """What `predictions.plot_report` draws, taken on the device from the logits in `arrays`
  (`results` may still be pending; the best calibrator from `calibrators`, or refitted)."""
  test_x = jnp.asarray(ensembles.one_model(arrays["test_logits"]), jnp.float32)
  test_y = np.asarray(arrays["test_labels"])
  raw = jax.nn.softmax(test_x, -1)
  num_bins = results["num_bins"]
  fitted = {k: v for k, v in results["calibrators"].items() if k != "raw"}
  panels = {"raw logits": plotting_data.reliability_summary(raw, test_y, num_bins)}
  if fitted:
    best = min(fitted, key=lambda k: float(fitted[k]["test"]["ece"]))  # (or still on device)
    calibrator = (calibrators or {}).get(best) or posthoc.fit_calibrator(
        best, jnp.asarray(ensembles.one_model(arrays["val_logits"]), jnp.float32),
        jnp.asarray(arrays["val_labels"], jnp.int32))
    panels[f"after {best} (lowest ECE)"] = plotting_data.reliability_summary(
        calibrator(test_x), test_y, num_bins)
  return {"reliability": panels, "smooth": metrics.smooth_calibration_curve(raw, test_y)}


def plot_numbers_of(results: dict[str, Any],
                    resampled: Mapping[str, tuple[jax.Array, jax.Array]]) -> dict[str, Any]:
  """`plot_numbers` from each calibrator's test `(confidence, correct)` (the `resampled` of
  `predictions._dispatched`), the same numbers to the bit (every plotted number is top-label:
  `metrics.top_label_rows`), without the `[N, C]` probabilities computed again."""
  num_bins = results["num_bins"]
  fitted = {k: v for k, v in results["calibrators"].items() if k != "raw"}
  raw = metrics.top_label_rows(*resampled["raw"])
  panels = {"raw logits": plotting_data.reliability_summary(*raw, num_bins)}
  if fitted:
    best = min(fitted, key=lambda k: float(fitted[k]["test"]["ece"]))  # (or still on device)
    panels[f"after {best} (lowest ECE)"] = plotting_data.reliability_summary(
        *metrics.top_label_rows(*resampled[best]), num_bins)
  return {"reliability": panels, "smooth": metrics.smooth_calibration_curve(*raw)}


def draw(out_dir: str, numbers: dict[str, Any], reliability_file: str) -> dict[str, str]:
  """Draws `numbers` (`plot_numbers[_of]`) as `reliability_file` and `smooth_reliability.png`
  in `out_dir`; returns their paths."""
  from calib_jax import plotting  # Deferred: matplotlib.
  os.makedirs(out_dir, exist_ok=True)
  return {
      "reliability": plotting.draw_reliability_diagrams(
          numbers["reliability"], os.path.join(out_dir, reliability_file)),
      "smooth_reliability": plotting.draw_smooth_reliability(
          numbers["smooth"], os.path.join(out_dir, "smooth_reliability.png"),
          title="raw logits"),
  }

