"""The numbers the reliability diagrams of `plotting` draw, computed without matplotlib.

`reliability_summary(probs, labels, num_bins)` (and `metrics.smooth_calibration_curve`, host
values already) run their device programs and return host values;
`plotting.draw_reliability_diagrams` and `plotting.draw_smooth_reliability` then only draw. Split so that a report can take these
numbers first and draw (matplotlib's import and rendering, host work) while its device is busy
with other programs, e.g. `evaluation.predictions`' bootstrap intervals: a program dispatched
after those would wait for them.
"""
from typing import Any

import numpy as np

from calib_jax import metrics


def reliability_summary(probs, labels, num_bins: int = 15, mask=None) -> dict[str, Any]:
  """One reliability diagram's numbers: per equal-width bin `counts`, mean `confidence` and
  `accuracy` (`metrics.reliability_bins`, numpy `[num_bins]`), and the `ece`,
  `average_confidence` and `accuracy_mean` of all samples (Python floats)."""
  bins = metrics.reliability_bins(probs, labels, num_bins, mask)
  return {"num_bins": num_bins, "counts": np.asarray(bins.counts),
          "confidence": np.asarray(bins.confidence), "accuracy": np.asarray(bins.accuracy),
          "ece": float(metrics.ece(probs, labels, num_bins, mask)),
          "average_confidence": float(metrics.average_confidence(probs, labels, mask)),
          "accuracy_mean": float(metrics.accuracy(probs, labels, mask))}

