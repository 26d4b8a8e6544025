"""The conformal part of the predictions report: split-conformal THR, APS, RAPS and SAPS sets,
marginal and class-conditional (Mondrian, `<name>-class`), at each alpha, with their test
coverage, mean set size and worst class's coverage (`predictions.evaluate_predictions`).

Every set is the one `conformal.fit(name, val_probs, val_labels, alpha,
conditional=..., from_logits=False)` gives (the library's defaults: APS, RAPS and SAPS
randomised, RAPS with λ = 0.01, k_reg = 5), computed for all of them in one compiled program
per report (shared by the calibrators): each split is scored once for every method, the sorting
ones from one sort of each row (`conformal.method_scores`), and every fit's threshold
(`conformal.threshold`) is compared with the same test scores.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from calib_jax import conformal

CONFORMAL_SETS = ("thr", "aps", "raps", "saps")  # each marginal and class-conditional ("-class")


def conformal_keys(alphas: tuple, class_alphas: tuple) -> list[tuple[str, str, Any, float]]:
  """`(key, method, conditional, alpha)` of every reported set, in the report's order."""
  return [(f"{name}{'-class' if conditional else ''}@{alpha:g}", name, conditional, alpha)
          for name in CONFORMAL_SETS
          for conditional, levels in ((None, alphas), ("class", class_alphas))
          for alpha in levels]


@functools.partial(jax.jit, static_argnames=("alphas", "class_alphas"))
def _conformal_sets(val_probs, val_labels, test_probs, test_labels, alphas: tuple,
                    class_alphas: tuple) -> dict[str, jax.Array]:
  """`[coverage, mean set size, worst class's coverage]` of every set: one compiled program per
  report, shared by the calibrators."""
  num_classes = val_probs.shape[-1]
  val_scores = conformal.method_scores(val_probs, CONFORMAL_SETS, calibration=True,
                                       labels=val_labels, from_logits=False)
  test_scores = conformal.method_scores(test_probs, CONFORMAL_SETS, calibration=False,
                                        from_logits=False)
  out = {}
  for key, name, conditional, alpha in conformal_keys(alphas, class_alphas):
    qhat = conformal.threshold(val_scores[name], val_labels, num_classes, alpha, conditional)
    sets = test_scores[name] <= qhat
    out[key] = jnp.stack([conformal.coverage(sets, test_labels), conformal.mean_set_size(sets),
                          conformal.class_conditional_coverage(sets, test_labels).worst])
  return out


def conformal_report(val_probs, val_labels, test_probs, test_labels, alphas: Sequence[float],
                     class_alphas: Sequence[float]) -> dict[str, dict[str, float]]:
  """The report's `conformal` entry of one calibrator's probabilities: per set key
  (`thr@0.1`, `aps-class@0.05`, ...) its `alpha`, `coverage`, `mean_set_size` and
  `worst_class_coverage`; class-conditional sets only at `class_alphas`."""
  alphas, class_alphas = tuple(alphas), tuple(class_alphas)
  stats = jax.device_get(_conformal_sets(val_probs, val_labels, test_probs, test_labels, alphas,
                                         class_alphas))
  out = {}
  for key, _, _, alpha in conformal_keys(alphas, class_alphas):
    coverage, size, worst = (float(v) for v in stats[key])
    out[key] = {"alpha": float(alpha), "coverage": coverage, "mean_set_size": size,
                "worst_class_coverage": worst}
  return out


def format_lines(results: dict[str, Any]) -> list[str]:
  """The conformal table: a row per calibrator and set, `coverage  size  worst class` per α."""
  entries = {name: entry["conformal"] for name, entry in results["calibrators"].items()}
  keys = list(next(iter(entries.values())))
  alphas = list(dict.fromkeys(key.rsplit("@", 1)[1] for key in keys))
  sets = list(dict.fromkeys(key.rsplit("@", 1)[0] for key in keys))
  lines = ["", f"{'conformal sets':<25}" + "".join(f"{'alpha=' + a:>21}" for a in alphas)]
  for name, conformal_entry in entries.items():
    for method in sets:
      cells = []
      for a in alphas:
        c = conformal_entry.get(f"{method}@{a}")
        cells.append(f"{'-':>21}" if c is None else f"{c['coverage']:>8.3f}"
                     f"{c['mean_set_size']:>7.2f}{c['worst_class_coverage']:>6.2f}")
      lines.append(f"{name:<14}{method:<11}" + "".join(cells))
  lines.append("(coverage, mean set size, worst class's coverage; -class: a threshold per class)")
  return lines
