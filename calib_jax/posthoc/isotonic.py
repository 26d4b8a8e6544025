"""Isotonic regression calibration (Zadrozny & Elkan 2002, "Transforming classifier scores into
accurate multiclass probability estimates", KDD), fitted by a pool-adjacent-violators algorithm
that runs on the host (numpy and SciPy) for concrete inputs and on device under `jit`.

The fit finds the non-decreasing `g` minimising `Σ_i (g(s_i) − y_i)²` over held-out scores `s_i`
and binary targets `y_i` (Ayer et al. 1955; Barlow et al. 1972). Between the fitted scores `g`
is linear, and constant beyond them — as scikit-learn's `IsotonicRegression(out_of_bounds=
"clip")` predicts.

PAV on device: instead of the sequential stack, every round merges *all* adjacent blocks whose
means violate (or tie) the order at once, `mean_k ≥ mean_{k+1}`. A run `b_1 ≥ b_2 ≥ … ≥ b_m` of
violators can be pooled in one step (pooling any two violators gives a mean still ≥ the next
one), and the isotonic solution does not depend on the order of pooling, so the fixed point is
the exact PAV solution. Each round is O(N) vector work (block sums from integer prefix sums);
the rounds needed are few on calibration data (tens at N = 1e6) but O(N) in the worst case.
Tied scores are pooled first, as scikit-learn does.

PAV on the host: `pav_binary_host` sorts with numpy's argsort, pools the ties, and runs
SciPy's sequential PAV (`scipy.optimize.isotonic_regression`, O(N)) on the tie blocks' weighted
means. PAV is sequential, so the host beats the device's log-N scans and XLA:CPU's argsort
(3-5x faster than the jitted path at N = 1e5..1e6 on a CPU). `fit_isotonic[_ovr]` take it
whenever their inputs are concrete; traced inputs (a fit inside `jit`) take `pav_binary`. The
two agree to float32 rounding (the host means are float64, rounded once).

Two multi-class reductions:
* top-label (`fit_isotonic`): `g` maps the top probability `c = max_k p_k` to
  `P(argmax = y | c)`; the other classes are rescaled to fill `1 − g(c)` in their old
  proportions (`_fitting.replace_top_label`), so the prediction is kept and rows sum to 1;
* one-vs-rest (`fit_isotonic_ovr`): one `g_k` per class on `(p_k, 1[y = k])`, then
  `q_k = g_k(p_k) / Σ_j g_j(p_j)` (uniform when all `g_j(p_j) = 0`), as scikit-learn's
  `CalibratedClassifierCV` normalises.
"""
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import scipy.optimize

from calib_jax import program_store
from calib_jax import arrays
from calib_jax.posthoc import _fitting

ArrayLike = jax.typing.ArrayLike


def _block_means(start, y_prefix, w_prefix):
  """Per element: the weighted mean target of its block (blocks begin where `start`)."""
  n = start.shape[0]
  idx = jnp.arange(n)
  first = lax.cummax(jnp.where(start, idx, 0))
  is_last = jnp.concatenate([start[1:], jnp.ones(1, bool)])
  last = lax.cummin(jnp.where(is_last, idx, n - 1), reverse=True)
  hits = y_prefix[last + 1] - y_prefix[first]
  count = w_prefix[last + 1] - w_prefix[first]
  return hits.astype(jnp.float32) / jnp.maximum(count, 1).astype(jnp.float32)


@jax.jit
def pav_binary(scores: jax.Array, targets: jax.Array, weights: jax.Array):
  """Isotonic regression of binary `targets [N]` on `scores [N]` with 0/1 `weights [N]`.

  Zero-weight entries take the largest valid score and so join its tie block without moving
  its mean. Counts are int32 prefix sums, exact for any N < 2^31.

  Returns:
    `(sorted_scores [N], fitted [N], rounds)`: the fitted non-decreasing value at each sorted
    score, and the number of pooling rounds.
  """
  valid = weights > 0
  top = jnp.max(jnp.where(valid, scores, -jnp.inf))
  scores = jnp.where(valid, scores, top)
  order = jnp.argsort(scores, stable=True)
  xs = scores[order]
  ws = valid[order].astype(jnp.int32)
  ys = (targets[order] & valid[order]).astype(jnp.int32)
  zero = jnp.zeros(1, jnp.int32)
  y_prefix = jnp.concatenate([zero, jnp.cumsum(ys)])
  w_prefix = jnp.concatenate([zero, jnp.cumsum(ws)])
  start = jnp.concatenate([jnp.ones(1, bool), xs[1:] != xs[:-1]])  # ties pooled first

  def pool(carry):
    start, _, rounds = carry
    means = _block_means(start, y_prefix, w_prefix)
    violates = jnp.concatenate([jnp.zeros(1, bool), means[:-1] >= means[1:]])
    merge = start & violates
    return start & ~merge, jnp.any(merge), rounds + 1

  start, _, rounds = lax.while_loop(lambda carry: carry[1], pool,
                                    (start, jnp.array(True), jnp.int32(0)))
  return xs, _block_means(start, y_prefix, w_prefix), rounds


def pav_binary_host(scores: ArrayLike, targets: ArrayLike,
                    weights: ArrayLike) -> tuple[np.ndarray, np.ndarray, int]:
  """`pav_binary` on the host: the same `(sorted_scores [N], fitted [N], rounds)`, float32.

  `rounds` is 0: the sequential PAV pools in one pass. Zero-weight entries join the largest
  valid score's tie block without moving its mean, as in `pav_binary`.
  """
  scores = np.asarray(scores, np.float32)
  valid = np.asarray(weights) > 0
  if scores.size == 0:
    return scores, scores.copy(), 0
  top = scores[valid].max() if valid.any() else np.float32(-np.inf)
  scores = np.where(valid, scores, top)
  # Any order within a tie will do: ties are pooled, so the fit is constant across each tie
  # block. numpy's default (vectorised) sort is ~5x faster than its stable one at N = 1e6.
  order = np.argsort(scores)
  xs = scores[order]
  counts_sorted = valid[order].astype(np.int64)
  hits_sorted = (np.asarray(targets, bool)[order] & valid[order]).astype(np.int64)
  start = np.concatenate([[True], xs[1:] != xs[:-1]])  # ties pooled first
  starts = np.flatnonzero(start)
  counts = np.add.reduceat(counts_sorted, starts)
  hits = np.add.reduceat(hits_sorted, starts)
  block_values = np.zeros(len(starts))  # a block with no valid entry (all masked) reads 0
  has = counts > 0
  if has.any():
    block_values[has] = scipy.optimize.isotonic_regression(
        hits[has] / counts[has], weights=counts[has].astype(np.float64)).x
  fitted = np.repeat(block_values, np.diff(np.append(starts, len(xs)))).astype(np.float32)
  return xs, fitted, 0


def compress(scores: ArrayLike, fitted: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
  """The first and last point of each constant run of a fit (host-side, numpy).

  The fitted map is constant on a block and linear between the last point of one block and the
  first of the next, so these points interpolate exactly as the full table does: O(blocks)
  memory instead of O(N). `[C, M]` fits (one-vs-rest) are padded per class by repeating the
  last kept point.
  """
  scores, fitted = np.asarray(scores, np.float32), np.asarray(fitted, np.float32)
  if scores.ndim == 2:
    rows = [compress(s, f) for s, f in zip(scores, fitted)]
    width = max(len(s) for s, _ in rows)
    pad = lambda a: np.concatenate([a, np.full(width - len(a), a[-1], a.dtype)])
    return (np.stack([pad(s) for s, _ in rows]), np.stack([pad(f) for _, f in rows]))
  changes = fitted[1:] != fitted[:-1]
  keep = np.ones(len(fitted), bool)
  keep[1:-1] = changes[:-1] | changes[1:]  # the last of a run, or the first of the next
  return scores[keep], fitted[keep]


def _interp(x, xs, fitted):
  return jnp.interp(x, xs, fitted)


def apply_isotonic(logits: ArrayLike, scores: ArrayLike, fitted: ArrayLike) -> jax.Array:
  """Top-label isotonic probabilities `[N, C]` from a fit (`scores [M]`, `fitted [M]`)."""
  probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  return _top_label_apply(probs, scores, fitted)


# One compiled program after the softmax (op by op it was ~20 one-operation programs, each
# compiled or found in the persistent cache by `eval.py --predictions`), the same values to
# the bit. The softmax stays outside: jitted, XLA:CPU's fused exp rounds ~3 % of the
# probabilities differently in the last bit, which moves conformal set sizes.
@program_store.jit
def _top_label_apply(probs: jax.Array, scores: jax.Array, fitted: jax.Array) -> jax.Array:
  return _fitting.replace_top_label(probs, _interp(jnp.max(probs, axis=-1), scores, fitted))


def apply_isotonic_ovr(logits: ArrayLike, scores: ArrayLike, fitted: ArrayLike) -> jax.Array:
  """One-vs-rest isotonic probabilities `[N, C]` from per-class fits `scores, fitted [C, M]`."""
  probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  per_class = jax.vmap(_interp, in_axes=(1, 0, 0), out_axes=1)(probs, scores, fitted)
  return normalise_ovr(per_class)


def normalise_ovr(per_class: jax.Array) -> jax.Array:
  """`q_k / Σ_j q_j` per row, uniform where every `q_j` is 0."""
  total = jnp.sum(per_class, axis=-1, keepdims=True)
  uniform = jnp.full_like(per_class, 1.0 / per_class.shape[-1])
  return jnp.where(total > 0, per_class / jnp.where(total > 0, total, 1.0), uniform)


@program_store.jit
def _top_label_targets(logits, labels):
  """The top softmax probability `[N]` and whether its class is the label `[N]`."""
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.max(probs, axis=-1), arrays.first_argmax(probs) == labels


@jax.jit
def _fit_top_label(logits, labels, weights):
  return pav_binary(*_top_label_targets(logits, labels), weights)


@jax.jit
def _ovr_targets(logits, labels):
  """Per class (rows): the probabilities `[C, N]` and whether the label is that class."""
  probs = jax.nn.softmax(logits, axis=-1)
  return probs.T, labels[None, :] == jnp.arange(logits.shape[1])[:, None]


@jax.jit
def _fit_ovr(logits, labels, weights):
  return jax.vmap(pav_binary, in_axes=(0, 0, None))(*_ovr_targets(logits, labels), weights)


def fit_isotonic(logits: ArrayLike, labels: ArrayLike,
                 mask: Optional[ArrayLike] = None) -> dict:
  """Top-label isotonic regression of correctness on the top softmax probability.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.

  Returns:
    `{"scores": [N], "fitted": [N], "rounds": int32}`: sorted held-out confidences and the
    calibrated confidence at each (pass them to `apply_isotonic`).
  """
  logits, labels, weights = _fitting.fit_inputs(logits, labels, mask)
  if arrays.is_concrete(logits, labels, weights):  # PAV is sequential: the host's (docstring)
    xs, fitted, rounds = pav_binary_host(*_top_label_targets(logits, labels), weights)
    return {"scores": jnp.asarray(xs), "fitted": jnp.asarray(fitted), "rounds": rounds}
  xs, fitted, rounds = _fit_top_label(logits, labels, weights)
  return {"scores": xs, "fitted": fitted, "rounds": rounds}


def fit_isotonic_ovr(logits: ArrayLike, labels: ArrayLike,
                     mask: Optional[ArrayLike] = None) -> dict:
  """One-vs-rest isotonic regression: per class k, `1[y = k]` on `p_k`.

  Returns:
    `{"scores": [C, N], "fitted": [C, N], "rounds": [C]}` (pass them to `apply_isotonic_ovr`).
  """
  logits, labels, weights = _fitting.fit_inputs(logits, labels, mask)
  if arrays.is_concrete(logits, labels, weights):
    probs, targets = (np.asarray(a) for a in _ovr_targets(logits, labels))
    weights = np.asarray(weights)
    xs, fitted, rounds = zip(*(pav_binary_host(p, t, weights) for p, t in zip(probs, targets)))
    return {"scores": jnp.asarray(np.stack(xs)), "fitted": jnp.asarray(np.stack(fitted)),
            "rounds": np.asarray(rounds, np.int32)}
  xs, fitted, rounds = _fit_ovr(logits, labels, weights)
  return {"scores": xs, "fitted": fitted, "rounds": rounds}
