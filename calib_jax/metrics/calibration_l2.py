"""ℓ2 calibration errors: the binned RMS calibration error and Kumar et al.'s debiased estimate.

Top-label, like `ece`: confidence `c = max_k p_k`, outcome `1[argmax p = y]`.

* `rms_calibration_error`: `sqrt(Σ_b |B_b|/N · (acc_b − conf_b)²)` over `ece`'s equal-width
  bins (`b = clip(ceil(c·B) − 1, 0, B − 1)`, bins `(lo, hi]`).
* `debiased_ece`: the debiased ℓ2 estimator of A. Kumar, P. Liang and T. Ma, "Verified
  uncertainty calibration", NeurIPS 2019 (their `calibration` package,
  `get_top_calibration_error(probs, labels, p=2, debias=True)` on continuous outputs, i.e.
  `lower_bound_scaling_ce` with `num_bins=15` and `get_equal_bins`):

      CE² ≈ Σ_b |B_b|/N · [(conf_b − acc_b)² − acc_b (1 − acc_b)/(|B_b| − 1)],   |B_b| ≥ 2
      debiased_ece = sqrt(max(CE², 0))

  The plug-in squared gap over-estimates `(E[c] − E[y])²` by the variance of the bin's mean
  outcome; the subtracted term is its unbiased estimate. Bins with fewer than 2 samples count
  0. Bins are theirs: sort the confidences, cut them into `B` groups with `np.array_split`
  sizes, put a boundary at the midpoint between the last confidence of a group and the first
  of the next, and the top boundary at 1; a sample goes to the first bin whose upper boundary
  is `≥ c` (`bisect_left`), so a tie run straddling a cut lands whole in the lower bin. With
  fewer valid samples than bins there are as many bins as samples, as theirs.
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from calib_jax.metrics import _arrays
from calib_jax import arrays
from calib_jax.metrics import _segments
from calib_jax.metrics import calibration

ArrayLike = jax.typing.ArrayLike


rms_from_bins = calibration.rms_from_bins  # the one formula, shared with `aece(norm="l2")`


@functools.partial(jax.jit, static_argnames="num_bins")
def _rms(probs, labels, mask, num_bins):
  conf, correct = calibration.confidence_and_correct(probs, labels)
  counts, conf_sum, hits = calibration.bin_sums(conf, correct, mask, num_bins)
  return calibration.rms_from_bins(counts, conf_sum, hits, jnp.sum(counts).astype(jnp.float32))


def equal_mass_bin_index(conf: jax.Array, mask: Optional[jax.Array], num_bins: int):
  """Kumar et al.'s equal-mass bin of each confidence (see the module docstring)."""
  total = conf.shape[0]
  valid = jnp.ones(total, bool) if mask is None else mask
  n = jnp.sum(valid, dtype=jnp.int32)
  ordered = jnp.sort(jnp.where(valid, conf, jnp.inf))     # masked entries sort last
  groups = jnp.minimum(n, num_bins)
  g = jnp.arange(1, num_bins, dtype=jnp.int32)            # cut after group g − 1
  q, r = n // groups, n % groups
  cut = jnp.where(g <= r, g * (q + 1), r * (q + 1) + (g - r) * q)
  inside = g < groups
  safe = jnp.clip(cut, 1, total - 1)
  boundary = jnp.where(inside, (ordered[safe - 1] + ordered[safe]) / 2, 1.0)
  bounds = jnp.sort(jnp.concatenate([boundary, jnp.ones(1, conf.dtype)]))
  return jnp.minimum(jnp.searchsorted(bounds, conf, side="left"), num_bins - 1)


@functools.partial(jax.jit, static_argnames="num_bins")
def _debiased(probs, labels, mask, num_bins):
  conf, correct = calibration.confidence_and_correct(probs, labels)
  b = equal_mass_bin_index(conf, mask, num_bins)
  b = b if mask is None else jnp.where(mask, b, num_bins)
  counts = jax.ops.segment_sum(jnp.ones_like(b), b, num_bins + 1)[:num_bins]
  conf_sum = _segments.segment_sum_f32(conf, b, num_bins + 1)[:num_bins]
  hits = jax.ops.segment_sum(correct.astype(jnp.int32), b, num_bins + 1)[:num_bins]
  size = counts.astype(jnp.float32)
  acc = _arrays.safe_div(hits, counts)
  gap = _arrays.safe_div(conf_sum, counts) - acc
  per_bin = jnp.where(counts >= 2,
                      jnp.square(gap) - acc * (1.0 - acc) / jnp.maximum(size - 1.0, 1.0), 0.0)
  n = jnp.sum(size)
  return jnp.sqrt(jnp.maximum(jnp.sum(size * per_bin) / n, 0.0))


def rms_calibration_error(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
                          mask: Optional[ArrayLike] = None) -> jax.Array:
  """RMS (ℓ2) calibration error: `sqrt(Σ_b |B_b|/N · (acc_b − conf_b)²)`, `ece`'s bins.

  Args:
    probs: `[..., C]` probabilities.
    labels: `[...]` integer labels.
    num_bins: number of equal-width confidence bins (static under jit).
    mask: optional bool `[...]`, True for entries that count.

  Returns:
    float32 scalar in [0, 1]; always ≥ `ece` with the same bins.
  """
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _rms(probs, labels, mask, num_bins)


def debiased_ece(probs: ArrayLike, labels: ArrayLike, num_bins: int = 15,
                 mask: Optional[ArrayLike] = None) -> jax.Array:
  """Debiased ℓ2 calibration error of Kumar, Liang & Ma (2019), equal-mass bins.

  `sqrt(max(0, Σ_b |B_b|/N · [(conf_b − acc_b)² − acc_b(1 − acc_b)/(|B_b| − 1)]))`; see the
  module docstring for the bins. Unlike the plug-in estimate it is ~0 for calibrated
  predictions at any N (and can be exactly 0).

  Args:
    probs: `[..., C]` probabilities.
    labels: `[...]` integer labels.
    num_bins: number of equal-mass bins (static under jit); default 15 as theirs.
    mask: optional bool `[...]`, True for entries that count.

  Returns:
    float32 scalar in [0, 1].
  """
  num_bins = arrays.check_num_bins(num_bins)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  return _debiased(probs, labels, mask, num_bins)
