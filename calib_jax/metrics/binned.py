"""The one formula of each binned calibration metric, from per-bin sums.

The one-shot metrics (`metrics.calibration`) apply them to their bin sums on device (float32),
the streaming accumulators to their accumulated sums on the host (numpy, float64), and the
per-class reliability maps of eval.py to theirs (docs/conventions.md#calibration-metrics).
"""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.metrics import _arrays

_safe_div = _arrays.safe_div


class ReliabilityBins(NamedTuple):
  """Per-bin statistics of a reliability diagram; empty bins have confidence = accuracy = 0."""
  counts: jax.Array       # int32 [B], number of (valid) samples per bin
  confidence: jax.Array   # float32 [B], mean confidence per bin
  accuracy: jax.Array     # float32 [B], fraction correct per bin


def ece_from_bins(confidence_sum, hits, num_samples, axis: Optional[int] = -1):
  """ECE from bin sums: `Σ_b |hits_b − Σ_{i∈b} c_i| / N`, the sum over `axis` (the bins).

  This is `Σ_b |B_b|/N · |acc_b − conf_b|` written with the sums, so empty bins need no care.
  With classwise sums `[C, B]` (bins of `p_k`, hits = label k, see `classwise_bin_sums`) it
  gives the per-class ECEs `[C]`. jax inputs give float32, numpy inputs float64; 0 where
  `num_samples` is 0.

  Args:
    confidence_sum: `[..., B]` sums of the binned confidences (or of `p_k`).
    hits: `[..., B]` number of correct predictions (or of label k) in each bin.
    num_samples: N, the number of samples binned (broadcast against the result).
    axis: the bin axis; None sums over every axis.
  """
  if _arrays.on_host(confidence_sum, hits):
    confidence_sum = np.asarray(confidence_sum, np.float64)
    return _safe_div(np.sum(np.abs(np.asarray(hits, np.float64) - confidence_sum), axis=axis),
                     num_samples)
  return _safe_div(jnp.sum(jnp.abs(hits - confidence_sum), axis=axis), num_samples)


def classwise_ece_from_bins(confidence_sum, hits, num_samples):
  """Classwise ECE from classwise bin sums `[C, B]` of N samples: `mean_k ECE_k`.

  `ECE_k = ece_from_bins(confidence_sum[k], hits[k], N)`; their mean over the C classes is
  computed as `ece_from_bins` over all `C·B` bins with `N·C` samples (one rounding).
  """
  num_classes = confidence_sum.shape[0]
  return ece_from_bins(confidence_sum, hits, num_samples * num_classes, axis=None)


def mce_from_bins(counts, confidence_sum, hits):
  """MCE from bin sums: `max_b |hits_b − Σ_{i∈b} c_i| / |B_b|` over non-empty bins (0 if none)."""
  if _arrays.on_host(counts, confidence_sum, hits):
    gaps = np.abs(np.asarray(hits, np.float64) - np.asarray(confidence_sum, np.float64))
    return np.max(np.where(counts > 0, gaps / np.maximum(counts, 1), 0.0))
  gaps = jnp.abs(hits - confidence_sum) / jnp.maximum(counts, 1)
  return jnp.max(jnp.where(counts > 0, gaps, 0.0)).astype(jnp.float32)


def rms_from_bins(counts, confidence_sum, hits, num_samples) -> jax.Array:
  """`sqrt(Σ_b (hits_b − Σ_{i∈b} c_i)² / |B_b| / N)`: the ℓ2 (RMS) calibration error of bin sums,
  `sqrt(Σ_b |B_b|/N · (acc_b − conf_b)²)` (empty bins add 0)."""
  gaps = jnp.square(hits - confidence_sum)
  per_bin = _safe_div(gaps, counts)
  return jnp.sqrt(_safe_div(jnp.sum(per_bin), num_samples))


NORMS = ("l1", "l2", "max")


def calibration_error_from_bins(counts, confidence_sum, hits, num_samples, norm: str = "l1"):
  """The binned calibration error of bin sums in `norm`, each the one formula of its quantity:

  * `"l1"`: `Σ_b |B_b|/N · |acc_b − conf_b|` (`ece_from_bins`);
  * `"l2"`: `sqrt(Σ_b |B_b|/N · (acc_b − conf_b)²)` (`rms_from_bins`);
  * `"max"`: `max_b |acc_b − conf_b|` over non-empty bins (`mce_from_bins`).
  """
  if norm == "l1":
    return ece_from_bins(confidence_sum, hits, num_samples)
  if norm == "l2":
    return rms_from_bins(counts, confidence_sum, hits, num_samples)
  return mce_from_bins(counts, confidence_sum, hits)


def check_norm(norm) -> str:
  """`norm` if it is one of `NORMS`, else a one-line ValueError."""
  if not isinstance(norm, str) or norm not in NORMS:
    raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {norm!r}.")
  return norm


def reliability_from_bins(counts, confidence_sum, hits) -> "ReliabilityBins":
  """Mean confidence and accuracy per bin from the bin sums (0 for empty bins)."""
  return ReliabilityBins(counts, _safe_div(confidence_sum, counts), _safe_div(hits, counts))
