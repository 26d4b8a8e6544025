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
from jax import lax

from calib_jax import program_store
from calib_jax import conformal

CONFORMAL_SETS = ("thr", "aps", "raps", "saps")  # each marginal and class-conditional ("-class")


def conformal_keys(alphas: tuple, class_alphas: tuple) -> list[tuple[str, str, Any, float]]:
  """`(key, method, conditional, alpha)` of every reported set, in the report's order."""
  return [(f"{name}{'-class' if conditional else ''}@{alpha:g}", name, conditional, alpha)
          for name in CONFORMAL_SETS
          for conditional, levels in ((None, alphas), ("class", class_alphas))
          for alpha in levels]


# Test rows per block: the sets' statistics are taken block by block, so no `[N, C]` scores
# or set masks are kept (four methods' would be ~400 MB each at 25,000 x 1,000).
_BLOCK_ROWS = 2048


@functools.partial(program_store.jit, static_argnames=("alphas", "class_alphas"))
def _conformal_sets(val_probs, val_labels, test_probs, test_labels, alphas: tuple,
                    class_alphas: tuple) -> dict[str, jax.Array]:
  """`[coverage, mean set size, worst class's coverage]` of every set: one compiled program per
  report, shared by the calibrators. The statistics are `conformal.coverage`,
  `mean_set_size` and `class_conditional_coverage(...).worst` of the sets, from each row's
  coverage and size (sums of integers: the same values)."""
  n, num_classes = test_probs.shape
  keys = conformal_keys(alphas, class_alphas)
  val_scores = conformal.method_scores(val_probs, CONFORMAL_SETS, calibration=True,
                                       labels=val_labels, from_logits=False)
  qhats = {key: conformal.threshold(val_scores[name], val_labels, num_classes, alpha,
                                    conditional)
           for key, name, conditional, alpha in keys}
  blocks = -(-n // _BLOCK_ROWS)
  pad = blocks * _BLOCK_ROWS - n

  def block_stats(args):
    # Each set compared in the sorting methods' own order (`conformal.sorted_method_scores`):
    # a set's size and whether it holds the label (at the label's rank) need no class order,
    # so no [block, C] scatter back per method; the same comparisons of the same values.
    probs, labels, uniforms = args
    scores, order = conformal.sorted_method_scores(probs, CONFORMAL_SETS, uniforms)
    rank = conformal.rank_of(order, labels)
    out = {}
    for key, name, conditional, _ in keys:
      qhat = qhats[key]
      if name != "thr" and conditional == "class":
        qhat = qhat[order]  # each sorted position's class's threshold
      sets = scores[name] <= qhat
      at = labels if name == "thr" else rank
      covered = jnp.take_along_axis(sets, at[:, None], axis=-1)[:, 0].astype(jnp.float32)
      out[key] = (covered, jnp.sum(sets, axis=-1, dtype=jnp.float32))
    return out

  def rows(a):
    a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
    return a.reshape((blocks, _BLOCK_ROWS) + a.shape[1:])

  uniforms = conformal.method_uniforms(n, calibration=False)
  per_row = lax.map(block_stats, (rows(test_probs), rows(test_labels), rows(uniforms)))
  ones = jnp.ones(n, jnp.float32)
  count = jax.ops.segment_sum(ones, test_labels, num_segments=num_classes)
  out = {}
  for key in qhats:
    covered, size = (a.reshape(-1)[:n] for a in per_row[key])
    hits = jax.ops.segment_sum(covered, test_labels, num_segments=num_classes)
    worst = jnp.min(jnp.where(count > 0, hits / jnp.maximum(count, 1.0), jnp.inf))
    out[key] = jnp.stack([jnp.sum(covered) / jnp.sum(ones), jnp.sum(size) / jnp.sum(ones),
                          worst])
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
