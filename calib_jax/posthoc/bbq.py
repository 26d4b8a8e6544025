"""Bayesian Binning into Quantiles (BBQ; M. P. Naeini, G. F. Cooper and M. Hauskrecht, "Obtaining
well calibrated probabilities using Bayesian binning", AAAI 2015), top-label.

BBQ averages many histogram-binning models instead of choosing one. Model `M_B` cuts `[0, 1]`
into `B` equal-frequency bins of the held-out scores (edges at the `k/B` quantiles,
`np.quantile`'s linear rule, outer edges moved to 0 and 1), and maps a score in bin `b` to the
held-out frequency of positives there, `θ_b = m_b / N_b` (an empty bin keeps its midpoint
`p_b`). Bins are `(lo, hi]` like the ECE's, a score at 0 falls in the first. The models run
over `B = ⌊N^{1/3} / C⌋ … min(⌈N/5⌉, ⌈C · N^{1/3}⌉)` (at least 1), the paper's range with
`C = 10` (`bin_factor`). Each is weighted by its posterior under a uniform prior,
`w_B ∝ P(D | M_B)`, with the BDeu marginal likelihood of the paper's Eq. 2:

    P(D | M) = Π_b  Γ(N'/B) / Γ(N_b + N'/B) · Γ(m_b + α_b) / Γ(α_b) · Γ(n_b + β_b) / Γ(β_b),
    α_b = (N'/B) p_b,  β_b = (N'/B)(1 − p_b),

`N_b = m_b + n_b` the samples of bin `b` (`m_b` positives, `n_b` negatives), `p_b` the midpoint
of its interval and `N' = 2` the equivalent sample size (`equivalent_sample_size`). The
calibrated score is `Σ_B w_B θ_{B, b_B(s)}`.

Top-label: the score is the confidence `c = max_k p_k`, the positives are the correct
predictions; the top class gets the calibrated confidence and the others share the rest in
their old proportions, as the top-label `isotonic` and `histogram` calibrators do
(`_fitting.replace_top_label`: the prediction is kept).

The fit runs on the host in float64 (numpy/scipy: a sort and prefix sums, then O(B) per model);
models whose weight is below `MIN_MODEL_WEIGHT` are dropped (the rest renormalised), so the
apply, a jit-able function of the padded `[T, B + 1]` edge and `[T, B]` value tables, reads the
few models that carry the posterior.
"""
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from calib_jax.posthoc import _fitting

ArrayLike = jax.typing.ArrayLike

DEFAULT_BIN_FACTOR = 10.0  # the paper's C
DEFAULT_EQUIVALENT_SAMPLE_SIZE = 2.0  # the paper's N'
# Models lighter than this are dropped from the apply (their total weight moves a calibrated
# confidence by at most the number of models times this).
MIN_MODEL_WEIGHT = 1e-9


def bin_range(num_samples: int, bin_factor: float = DEFAULT_BIN_FACTOR) -> tuple[int, int]:
  """The paper's model range: `B` from `max(1, ⌊N^{1/3}/C⌋)` to `min(⌈N/5⌉, ⌈C N^{1/3}⌉)`."""
  root = num_samples ** (1.0 / 3.0)
  low = int(max(1, np.floor(root / bin_factor)))
  high = int(max(low, min(np.ceil(num_samples / 5.0), np.ceil(root * bin_factor))))
  return low, high


def quantile_edges(sorted_scores: np.ndarray, num_bins: int) -> np.ndarray:
  """`B + 1` non-decreasing edges: the `k/B` quantiles of ascending `sorted_scores` (linear
  interpolation, `np.quantile`'s default rule, O(B)), the outer ones 0 and 1."""
  sorted_scores = np.asarray(sorted_scores, np.float64)
  position = (len(sorted_scores) - 1) * np.linspace(0.0, 1.0, num_bins + 1)
  below = np.floor(position).astype(np.int64)
  above = np.minimum(below + 1, len(sorted_scores) - 1)
  low, high = sorted_scores[below], sorted_scores[above]
  edges = low + (high - low) * (position - below)
  edges[0], edges[-1] = 0.0, 1.0
  return np.maximum.accumulate(np.clip(edges, 0.0, 1.0))


def bin_counts(sorted_scores: np.ndarray, positives_before: np.ndarray, edges: np.ndarray):
  """Samples `N_b` and positives `m_b` per `(lo, hi]` bin (a score of 0 in the first bin).

  Args:
    sorted_scores: `[N]` ascending scores.
    positives_before: `[N + 1]` prefix sums of the targets in that order.
    edges: `[B + 1]` edges.
  """
  below = np.searchsorted(sorted_scores, edges, side="right")  # scores <= each edge
  below[0] = 0
  return np.diff(below), np.diff(positives_before[below])


def log_marginal_likelihood(counts: np.ndarray, positives: np.ndarray, edges: np.ndarray,
                            equivalent_sample_size: float = DEFAULT_EQUIVALENT_SAMPLE_SIZE):
  """`log P(D | M)`, the BDeu score of one binning model (module docstring); empty bins add 0."""
  num_bins = len(counts)
  prior = equivalent_sample_size / num_bins
  midpoint = (edges[:-1] + edges[1:]) / 2.0
  tiny = np.finfo(np.float64).tiny  # a zero-width bin at 0 or 1 (empty, so it adds 0 anyway)
  alpha = np.maximum(prior * midpoint, tiny)
  beta = np.maximum(prior * (1.0 - midpoint), tiny)
  negatives = counts - positives
  per_bin = (special.gammaln(prior) - special.gammaln(counts + prior)
             + special.gammaln(positives + alpha) - special.gammaln(alpha)
             + special.gammaln(negatives + beta) - special.gammaln(beta))
  return float(np.sum(per_bin))


def binning_models(scores: ArrayLike, targets: ArrayLike, *,
                   bin_factor: float = DEFAULT_BIN_FACTOR,
                   equivalent_sample_size: float = DEFAULT_EQUIVALENT_SAMPLE_SIZE) -> dict:
  """Every model of BBQ's range on binary `targets [N]` and `scores [N]` in `[0, 1]` (host).

  Returns:
    `{"num_bins": [T] int, "edges": list of [B + 1], "bin_values": list of [B],
    "log_scores": [T], "weights": [T]}`: the weights are the posterior `softmax(log_scores)`
    (uniform model prior), before any pruning.
  """
  scores = np.asarray(scores, np.float64)
  targets = np.asarray(targets, np.float64)
  order = np.argsort(scores, kind="stable")
  sorted_scores = scores[order]
  positives_before = np.concatenate([[0.0], np.cumsum(targets[order])])
  low, high = bin_range(len(scores), bin_factor)
  out = {"num_bins": np.arange(low, high + 1), "edges": [], "bin_values": [], "log_scores": []}
  for num_bins in out["num_bins"]:
    # In float32, as the apply compares them: a sample is counted in the bin it is applied in.
    edges = quantile_edges(sorted_scores, int(num_bins)).astype(np.float32).astype(np.float64)
    counts, positives = bin_counts(sorted_scores, positives_before, edges)
    midpoint = (edges[:-1] + edges[1:]) / 2.0
    out["edges"].append(edges)
    out["bin_values"].append(np.where(counts > 0, positives / np.maximum(counts, 1), midpoint))
    out["log_scores"].append(log_marginal_likelihood(counts, positives, edges,
                                                     equivalent_sample_size))
  out["log_scores"] = np.asarray(out["log_scores"])
  out["weights"] = np.exp(out["log_scores"] - special.logsumexp(out["log_scores"]))
  return out


def _check_positive(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or \
      not np.isfinite(value) or value <= 0:
    raise ValueError(f"{name} must be a positive finite number, got {value!r}.")
  return float(value)


def fit_bbq(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None, *,
            bin_factor: float = DEFAULT_BIN_FACTOR,
            equivalent_sample_size: float = DEFAULT_EQUIVALENT_SAMPLE_SIZE) -> dict:
  """Top-label BBQ fitted on held-out logits (host, float64).

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    bin_factor: the paper's `C`, the width of the range of bin counts (default 10).
    equivalent_sample_size: the BDeu prior's `N'` (default 2, the paper's).

  Returns:
    `{"edges": [T, B + 1], "bin_values": [T, B], "model_weights": [T], "num_bins": [T] int32,
    "num_models": int32}` for the `T` models kept (weight ≥ `MIN_MODEL_WEIGHT`), padded to the
    largest `B` (edges with 1, values with the last value); `num_models` counts all models
    scored. Pass them to `apply_bbq`.
  """
  bin_factor = _check_positive("bin_factor", bin_factor)
  equivalent_sample_size = _check_positive("equivalent_sample_size", equivalent_sample_size)
  conf, correct = _fitting.top_label_targets(logits, labels, mask, "BBQ")
  models = binning_models(conf, correct, bin_factor=bin_factor,
                          equivalent_sample_size=equivalent_sample_size)
  keep = np.flatnonzero(models["weights"] >= MIN_MODEL_WEIGHT)
  weights = models["weights"][keep] / np.sum(models["weights"][keep])
  width = int(max(models["num_bins"][keep]))
  edges = np.ones((len(keep), width + 1))
  values = np.zeros((len(keep), width))
  for row, index in enumerate(keep):
    model_edges, model_values = models["edges"][index], models["bin_values"][index]
    edges[row, :len(model_edges)] = model_edges
    values[row, :len(model_values)] = model_values
    values[row, len(model_values):] = model_values[-1]
  return {"edges": jnp.asarray(edges, jnp.float32),
          "bin_values": jnp.asarray(values, jnp.float32),
          "model_weights": jnp.asarray(weights, jnp.float32),
          "num_bins": jnp.asarray(models["num_bins"][keep], jnp.int32),
          "num_models": jnp.int32(len(models["num_bins"]))}


def bbq_confidence(confidence: jax.Array, edges: jax.Array, bin_values: jax.Array,
                   model_weights: jax.Array, num_bins: jax.Array) -> jax.Array:
  """`Σ_T w_T θ_{T, b_T(c)}` for confidences `[N]` (jit-able); bins `(lo, hi]`."""
  def one_model(model_edges, values, bins):
    index = jnp.searchsorted(model_edges, confidence, side="left") - 1
    return values[jnp.clip(index, 0, bins - 1)]
  per_model = jax.vmap(one_model)(edges, bin_values, num_bins)  # [T, N]
  # Full float32 precision: a GPU's or TPU's default would round the operands (TF32, bfloat16).
  return jnp.clip(jnp.tensordot(model_weights, per_model, axes=1,
                                precision=jax.lax.Precision.HIGHEST), 0.0, 1.0)


def apply_bbq(logits: ArrayLike, edges: ArrayLike, bin_values: ArrayLike,
              model_weights: ArrayLike, num_bins: ArrayLike) -> jax.Array:
  """Top-label BBQ probabilities `[N, C]` from a fit (jit-able)."""
  probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  new_top = bbq_confidence(jnp.max(probs, axis=-1), jnp.asarray(edges, jnp.float32),
                           jnp.asarray(bin_values, jnp.float32),
                           jnp.asarray(model_weights, jnp.float32), jnp.asarray(num_bins))
  return _fitting.replace_top_label(probs, new_top)
