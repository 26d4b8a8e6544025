"""Split-conformal non-conformity scores and the conformal quantile.

A score `s(x, y)` is large when label `y` looks unlikely for `x`; a prediction set is
`C(x) = {y : s(x, y) ≤ q̂}`, with `q̂` the conformal quantile of the calibration scores
`s(x_i, y_i)`. Every score function maps probabilities `[N, C]` to the scores of all classes
`[N, C]` (class order), so one function serves calibration (read the label's column) and
prediction (threshold every column).

* THR / LAC (Sadinle, Lei & Wasserman 2019): `s = 1 − p_y`.
* APS (Romano, Sesia & Candès 2020): with `p_(1) ≥ p_(2) ≥ …` the sorted probabilities and
  `r(y)` the 1-based rank of `y`, `s = Σ_{j<r(y)} p_(j) + u·p_y`; randomised: `u ~ U(0, 1)`
  (one per sample), non-randomised: `u = 1` (the mass up to and including `y`).
* RAPS (Angelopoulos, Bates, Malik & Jordan 2021): APS plus `λ·max(0, r(y) − k_reg)`.
* SAPS (Huang, Xi, Zhang, Yao, Qiu & Wei 2024): `s = u·p_(1)` for the top-ranked label, and
  `p_(1) + (r(y) − 2 + u)·λ` for a label at rank `r(y) ≥ 2`: only the largest probability and
  the rank count, not the tail's values.

`conformal_quantile` is the marginal threshold; `class_conditional_quantile` the Mondrian one,
a threshold per class from that class's calibration scores alone (Vovk et al. 2005, 2012).

Ties in `p` are ranked by class index (a stable sort), so every class gets a distinct rank.
"""
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


# From this many entries on, the CPU backend sorts in numpy (a host call): XLA:CPU's
# two-operand stable sort runs ~15x slower than `_host_descending_order` (25,000 x 1,000: ~10 s
# against ~0.7 s), far more than the call costs. Smaller arrays stay in XLA, whose programs the
# compilation cache can keep (one with a host call is compiled in every process).
_HOST_SORT_MIN_ENTRIES = 1 << 18

_SIGN = np.uint32(0x80000000)


def _lax_sorted_descending(probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  classes = lax.broadcasted_iota(jnp.int32, probs.shape, probs.ndim - 1)
  neg_sorted, order = lax.sort((-probs, classes), dimension=probs.ndim - 1, num_keys=1,
                               is_stable=True)
  return -neg_sorted, order


def _host_descending_order(probs: np.ndarray) -> np.ndarray:
  """The class at each position of each row sorted by descending probability, ties by class
  index: `np.argsort(-probs, axis=-1, kind="stable")` (int32), for finite values (−0.0 and
  0.0 equal, as there).

  Computed as one sort of unique 64-bit integers: each entry's order-reversing key of its
  float32 bits above its class index. No two keys are equal, so numpy's (SIMD, unstable)
  integer sort gives the one permutation a stable sort gives, ~3x faster than the stable
  argsort of the floats (25,000 x 1,000: ~0.7 s against ~2 s of CPU).
  """
  probs = np.asarray(probs, np.float32)
  num_classes = probs.shape[-1]
  shift = np.uint64(max(1, (num_classes - 1).bit_length()))
  bits = (probs + np.float32(0.0)).view(np.uint32)  # −0.0 + 0.0 is 0.0
  # The float's order as unsigned integers (negatives reversed below the positives), then
  # reversed: larger probabilities first.
  descending = ~np.where(bits >= _SIGN, ~bits, bits | _SIGN)
  keys = descending.astype(np.uint64) << shift
  keys |= np.arange(num_classes, dtype=np.uint64)
  keys.sort(axis=-1)
  return (keys & np.uint64((1 << int(shift)) - 1)).astype(np.int32)


def _host_sorted_descending(probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  # The same permutation as the stable lax.sort (`_host_descending_order`).
  order = jax.pure_callback(_host_descending_order, jax.ShapeDtypeStruct(probs.shape, jnp.int32),
                            probs, vmap_method="broadcast_all")
  return jnp.take_along_axis(probs, order, axis=-1), order


def _sorted_descending(probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Probabilities sorted descending per row, and the class of each sorted position."""
  if probs.size < _HOST_SORT_MIN_ENTRIES:
    return _lax_sorted_descending(probs)
  return lax.platform_dependent(probs, cpu=_host_sorted_descending,
                                default=_lax_sorted_descending)


def _to_class_order(sorted_values: jax.Array, order: jax.Array) -> jax.Array:
  """Inverse of `_sorted_descending`'s permutation: value of each class in class order."""
  rows = jnp.arange(order.shape[0])[:, None]
  return jnp.zeros_like(sorted_values).at[rows, order].set(sorted_values, unique_indices=True)


def thr_scores(probs: jax.Array) -> jax.Array:
  """THR / LAC score of every class, `1 − p_y` (Sadinle et al. 2019). `[N, C] -> [N, C]`."""
  return 1.0 - probs


def raps_scores(probs: jax.Array, u: Optional[jax.Array] = None, lam: float = 0.0,
                k_reg: int = 0) -> jax.Array:
  """RAPS score of every class (Angelopoulos et al. 2021); `lam = 0` is APS.

  `s(x, y) = Σ_{j<r(y)} p_(j) + u·p_y + λ·max(0, r(y) − k_reg)`, `r` the 1-based rank.

  Args:
    probs: `[N, C]` probabilities.
    u: `[N]` uniforms in [0, 1] (randomised scores), or None for `u = 1` (non-randomised).
    lam: penalty per rank beyond `k_reg` (λ ≥ 0).
    k_reg: number of top ranks without penalty.

  Returns:
    `[N, C]` float32 scores in class order.
  """
  sorted_p, order = _sorted_descending(probs)
  return _to_class_order(_raps_sorted(sorted_p, jnp.cumsum(sorted_p, axis=-1), u, lam, k_reg),
                         order)


def _raps_sorted(sorted_p, inclusive, u, lam: float, k_reg: int) -> jax.Array:
  """RAPS scores in the sorted order, from the sorted probabilities and their cumulative sum."""
  if u is None:
    sorted_scores = inclusive
  else:
    # Mass strictly above y plus a uniform fraction of p_y (Romano et al.'s randomisation).
    sorted_scores = (inclusive - sorted_p) + u[:, None] * sorted_p
  if lam:
    rank = jnp.arange(1, sorted_p.shape[-1] + 1, dtype=jnp.float32)
    sorted_scores = sorted_scores + lam * jnp.maximum(rank - k_reg, 0.0)
  return sorted_scores


def aps_scores(probs: jax.Array, u: Optional[jax.Array] = None) -> jax.Array:
  """APS score of every class (Romano et al. 2020): `Σ_{j<r(y)} p_(j) + u·p_y`.

  `u` is `[N]` uniforms (randomised) or None (`u = 1`, the cumulative mass up to and including
  `y`). `[N, C] -> [N, C]`.
  """
  return raps_scores(probs, u)


def saps_scores(probs: jax.Array, u: Optional[jax.Array] = None, lam: float = 0.2) -> jax.Array:
  """SAPS score of every class (Huang et al. 2024, "Conformal prediction for deep classifier via
  label ranking").

  `s(x, y) = u·p_(1)` when `r(y) = 1`, else `p_(1) + (r(y) − 2 + u)·λ`, `r` the 1-based rank.

  Args:
    probs: `[N, C]` probabilities.
    u: `[N]` uniforms in [0, 1] (randomised scores), or None for `u = 1` (non-randomised).
    lam: the rank weight λ > 0.

  Returns:
    `[N, C]` float32 scores in class order.
  """
  sorted_p, order = _sorted_descending(probs)
  return _to_class_order(_saps_sorted(sorted_p, u, lam), order)


def _saps_sorted(sorted_p, u, lam: float) -> jax.Array:
  """SAPS scores in the sorted order, from the sorted probabilities."""
  p_max = sorted_p[:, :1]
  u = jnp.ones((sorted_p.shape[0], 1), jnp.float32) if u is None else u[:, None]
  rank = jnp.arange(1, sorted_p.shape[-1] + 1, dtype=jnp.float32)
  sorted_scores = jnp.where(rank == 1, u * p_max, p_max + (rank - 2.0 + u) * lam)
  return sorted_scores.astype(jnp.float32)


def scores_of_methods(probs: jax.Array, u: Optional[jax.Array],
                      methods: tuple) -> tuple[jax.Array, ...]:
  """The scores `[N, C]` of several methods `(name, lam, k_reg)` ("thr", "aps", "raps",
  "saps") of the same probabilities and uniforms, the sorting ones from one sort of each row
  (its cost dominates at large C): each equals its own function's, bit for bit."""
  scores, order = sorted_scores_of_methods(probs, u, methods)
  return tuple(s if name == "thr" else _to_class_order(s, order)
               for (name, _, _), s in zip(methods, scores))


def sorted_scores_of_methods(probs: jax.Array, u: Optional[jax.Array], methods: tuple
                             ) -> tuple[tuple[jax.Array, ...], Optional[jax.Array]]:
  """`scores_of_methods` before the sorting methods' scores go back to class order: THR's
  `[N, C]` in class order, the others' in each row's descending-probability order, and `order
  [N, C]` (the class at each sorted position; None without a sorting method). What needs no
  class order (a set's size; a label's score at its rank, `rank_of`) is read from them
  without the scatter back, the same values."""
  needs_sort = any(name != "thr" for name, _, _ in methods)
  order = None
  if needs_sort:
    sorted_p, order = _sorted_descending(probs)
    inclusive = jnp.cumsum(sorted_p, axis=-1)
  out = []
  for name, lam, k_reg in methods:
    if name == "thr":
      out.append(thr_scores(probs))
    elif name == "saps":
      out.append(_saps_sorted(sorted_p, u, lam))
    else:  # aps is raps with lam = 0
      out.append(_raps_sorted(sorted_p, inclusive, u, lam, k_reg))
  return tuple(out), order


def rank_of(order: jax.Array, labels: jax.Array) -> jax.Array:
  """The sorted position of each row's label in `order [N, C]` (`sorted_scores_of_methods`):
  `[N]` int32, so `sorted[i, rank[i]] == class_order[i, labels[i]]`."""
  return jnp.argmax(order == labels[:, None], axis=-1).astype(jnp.int32)


def label_scores(all_scores: jax.Array, labels: jax.Array) -> jax.Array:
  """The score of each sample's label: `all_scores[i, labels[i]]`. `[N, C], [N] -> [N]`."""
  return jnp.take_along_axis(all_scores, labels[:, None], axis=-1)[:, 0]


def quantile_rank(n: int, alpha: float) -> int:
  """`k = ⌈(n + 1)(1 − α)⌉`, the rank of the conformal quantile among `n` scores (float64)."""
  return math.ceil((n + 1) * (1.0 - alpha))


def min_calibration_size(alpha: float) -> int:
  """The smallest `n` with `⌈(n + 1)(1 − α)⌉ ≤ n`: fewer calibration samples give `q̂ = ∞`."""
  n = max(1, math.floor((1.0 - alpha) / alpha) - 1)
  while quantile_rank(n, alpha) > n:
    n += 1
  return n


def conformal_quantile(scores: jax.Array, alpha: float,
                       mask: Optional[jax.Array] = None) -> jax.Array:
  """The split-conformal threshold `q̂`: the k-th smallest of the n valid scores.

  `k = ⌈(n + 1)(1 − α)⌉` (Vovk et al. 2005; Lei et al. 2018): the empirical `k/n` quantile
  with the "higher" rule in the inverse-CDF sense (no interpolation; `np.quantile(s, k/n,
  method="inverted_cdf")`). With exchangeable data, `P(s_test ≤ q̂) ≥ 1 − α`, and `≤ 1 − α +
  1/(n + 1)` without ties. Returns `+inf` when `k > n` (too few samples for `α`); `fit` raises
  there instead when `n` is known.

  Args:
    scores: `[N]` float32 calibration scores.
    alpha: miscoverage level in (0, 1), a Python float.
    mask: optional `[N]` bool; only selected scores count (`n = Σ mask`).

  Returns:
    float32 scalar.
  """
  return quantile_from_ranks(scores, quantile_ranks(scores.shape[0], alpha), mask)


def quantile_ranks(size: int, alpha: float) -> np.ndarray:
  """`quantile_rank(n, alpha)` for n = 0..size as an int32 table (float64 on the host)."""
  return np.ceil((np.arange(size + 1) + 1.0) * (1.0 - alpha)).astype(np.int32)


def quantile_from_ranks(scores: jax.Array, ranks: jax.Array,
                        mask: Optional[jax.Array] = None) -> jax.Array:
  """`conformal_quantile` with the ranks given as a table `ranks[n] = k` (`quantile_ranks`).

  The table makes α a traced value: one compiled program serves every α, and the rank of a
  masked `n` (traced under jit) equals the float64 formula exactly, which float32 arithmetic on
  device can miss by one.
  """
  size = scores.shape[0]
  if mask is None:
    n = jnp.int32(size)
  else:
    scores = jnp.where(mask, scores, jnp.inf)
    n = jnp.sum(mask, dtype=jnp.int32)
  k = jnp.asarray(ranks)[n]
  ordered = jnp.sort(scores)
  q = ordered[jnp.clip(k - 1, 0, size - 1)]
  return jnp.where(k <= n, q, jnp.inf).astype(jnp.float32)


def class_conditional_quantile(scores: jax.Array, labels: jax.Array, num_classes: int,
                               alpha: float, mask: Optional[jax.Array] = None) -> jax.Array:
  """The Mondrian (class-conditional) thresholds `q̂_k`, one per class.

  `q̂_k` is the `⌈(n_k + 1)(1 − α)⌉`-th smallest of the `n_k` valid scores whose label is k, so
  `P(s_test ≤ q̂_k | y_test = k) ≥ 1 − α` for every class k (Vovk et al. 2005; Vovk 2012). A
  class with too few samples for its rank (`n_k < min_calibration_size(alpha)`, none at all
  included) gets `+inf`; `fit(..., conditional="class")` raises there instead.

  Args:
    scores: `[N]` float32 calibration scores (each sample's label's score).
    labels: `[N]` int labels in [0, num_classes).
    num_classes: C (static).
    alpha: miscoverage level in (0, 1), a Python float.
    mask: optional `[N]` bool; only selected scores count.

  Returns:
    `[C]` float32.
  """
  return class_quantiles_from_ranks(scores, labels, num_classes,
                                    quantile_ranks(scores.shape[0], alpha), mask)


def class_quantiles_from_ranks(scores: jax.Array, labels: jax.Array, num_classes: int,
                               ranks: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
  """`class_conditional_quantile` with the ranks given as a table (`quantile_ranks`).

  One sort by (class, score) serves every class: class k's scores are the `n_k` consecutive
  entries from `start_k = Σ_{j<k} n_j`, and its threshold the entry at `start_k + k_k − 1`.
  No per-class loop, one compiled program whatever C and α.
  """
  size = scores.shape[0]
  valid = jnp.ones(size, bool) if mask is None else mask
  group = jnp.where(valid, labels.astype(jnp.int32), num_classes)  # masked rows sort last
  _, ordered = lax.sort((group, scores), num_keys=2)
  counts = jnp.zeros(num_classes + 1, jnp.int32).at[group].add(1)[:num_classes]
  starts = jnp.cumsum(counts) - counts
  k = jnp.asarray(ranks)[counts]
  q = ordered[jnp.clip(starts + k - 1, 0, size - 1)]
  return jnp.where(k <= counts, q, jnp.inf).astype(jnp.float32)
