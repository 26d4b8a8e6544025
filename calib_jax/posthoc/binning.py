"""Histogram binning (Zadrozny & Elkan 2001, "Obtaining calibrated probability estimates from
decision trees and naive Bayesian classifiers", ICML): the score axis `[0, 1]` is cut into
`B` equal-width bins, `(lo, hi]` as the ECE's bins (`metrics.bin_index`), and a score in bin
`b` is mapped to the held-out frequency of positives in that bin,
`θ_b = Σ_{i ∈ b} y_i / |b|`. An empty bin keeps its centre `(b + ½) / B`.

Two multi-class reductions, as for isotonic regression (`calib_jax.posthoc.isotonic`):
* top-label (`mode="top_label"`, the default): bins of the top probability `c`, targets
  `1[argmax = y]`; the other classes are rescaled to fill `1 − θ_b`;
* one-vs-rest (`mode="ovr"`): `B` bins per class on `(p_k, 1[y = k])`, then
  `q_k = θ_{k, b(p_k)} / Σ_j θ_{j, b(p_j)}` (uniform when all are 0).
The default `B = 10` is Zadrozny & Elkan's.
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from calib_jax import arrays
from calib_jax.metrics.calibration import bin_index
from calib_jax.posthoc import _fitting
from calib_jax.posthoc.isotonic import normalise_ovr

ArrayLike = jax.typing.ArrayLike

DEFAULT_NUM_BINS = 10
MODES = ("top_label", "ovr")


def _bin_frequencies(scores, targets, weights, num_bins: int):
  """Per bin: the weighted frequency of `targets`, or the bin centre where the bin is empty."""
  bins = bin_index(scores, num_bins)
  count = jax.ops.segment_sum(weights, bins, num_segments=num_bins)
  hits = jax.ops.segment_sum(weights * targets, bins, num_segments=num_bins)
  centre = (jnp.arange(num_bins, dtype=jnp.float32) + 0.5) / num_bins
  return jnp.where(count > 0, hits / jnp.where(count > 0, count, 1.0), centre), count


@functools.partial(jax.jit, static_argnames=("num_bins", "mode"))
def _fit(logits, labels, weights, num_bins: int, mode: str):
  probs = jax.nn.softmax(logits, axis=-1)
  if mode == "top_label":
    correct = (arrays.first_argmax(probs) == labels).astype(jnp.float32)
    return _bin_frequencies(jnp.max(probs, axis=-1), correct, weights, num_bins)
  targets = (labels[None, :] == jnp.arange(logits.shape[1])[:, None]).astype(jnp.float32)
  return jax.vmap(_bin_frequencies, in_axes=(0, 0, None, None))(probs.T, targets, weights,
                                                                  num_bins)


def fit_histogram_binning(logits: ArrayLike, labels: ArrayLike,
                          mask: Optional[ArrayLike] = None, *,
                          num_bins: int = DEFAULT_NUM_BINS, mode: str = "top_label") -> dict:
  """Histogram binning fitted on held-out logits.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    num_bins: equal-width bins on `[0, 1]` (default 10).
    mode: `"top_label"` or `"ovr"`.

  Returns:
    `{"bin_values": [B] or [C, B], "bin_counts": same shape}` (pass `bin_values` to
    `apply_histogram_binning`).
  """
  num_bins = arrays.check_num_bins(num_bins)
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  values, counts = _fit(*_fitting.fit_inputs(logits, labels, mask), num_bins, mode)
  return {"bin_values": values, "bin_counts": counts}


def apply_histogram_binning(logits: ArrayLike, bin_values: ArrayLike) -> jax.Array:
  """Probabilities `[N, C]` from fitted `bin_values`: `[B]` top-label, `[C, B]` one-vs-rest."""
  probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  bin_values = jnp.asarray(bin_values, jnp.float32)
  num_bins = bin_values.shape[-1]
  if bin_values.ndim == 1:
    new_top = bin_values[bin_index(jnp.max(probs, axis=-1), num_bins)]
    return _fitting.replace_top_label(probs, new_top)
  per_class = jnp.take_along_axis(bin_values.T, bin_index(probs, num_bins), axis=0)
  return normalise_ovr(per_class)
