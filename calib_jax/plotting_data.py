"""The numbers the reliability diagrams of `plotting` draw, computed without matplotlib.

`reliability_summary(probs, labels, num_bins)` (and `metrics.smooth_calibration_curve`, host
values already) run their device programs and return host values;
`plotting.draw_reliability_diagrams` and `plotting.draw_smooth_reliability` then only draw. Split so that a report can take these
numbers first and draw (matplotlib's import and rendering, host work) while its device is busy
with other programs, e.g. `evaluation.predictions`' bootstrap intervals: a program dispatched
after those would wait for them.
"""
import functools
from typing import Any

import jax
import numpy as np

from calib_jax import arrays, metrics, program_store


@functools.partial(program_store.jit, static_argnames="num_bins")
def _reliability_numbers(probs, labels, mask, num_bins: int) -> dict[str, Any]:
  """The metrics of `reliability_summary`, one compiled program (called one by one they were
  four, each with its own label check and host wait)."""
  bins = metrics.reliability_bins(probs, labels, num_bins, mask)
  return {"counts": bins.counts, "confidence": bins.confidence, "accuracy": bins.accuracy,
          "ece": metrics.ece(probs, labels, num_bins, mask),
          "average_confidence": metrics.average_confidence(probs, labels, mask),
          "accuracy_mean": metrics.accuracy(probs, labels, mask)}


def reliability_summary(probs, labels, num_bins: int = 15, mask=None) -> dict[str, Any]:
  """One reliability diagram's numbers: per equal-width bin `counts`, mean `confidence` and
  `accuracy` (`metrics.reliability_bins`, numpy `[num_bins]`), and the `ece`,
  `average_confidence` and `accuracy_mean` of all samples (Python floats)."""
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)  # the one label check
  numbers = jax.device_get(_reliability_numbers(probs, labels, mask, num_bins))
  return {"num_bins": num_bins,
          **{k: np.asarray(numbers[k]) for k in ("counts", "confidence", "accuracy")},
          **{k: float(numbers[k]) for k in ("ece", "average_confidence", "accuracy_mean")}}

