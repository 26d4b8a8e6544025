"""Isotonic regression calibration (Zadrozny & Elkan 2002, "Transforming classifier scores into
accurate multiclass probability estimates", KDD), fitted by a pool-adjacent-violators algorithm
that runs on device under `jit`.

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


@jax.jit
def _fit_top_label(logits, labels, weights):
  probs = jax.nn.softmax(logits, axis=-1)
  correct = arrays.first_argmax(probs) == labels
  return pav_binary(jnp.max(probs, axis=-1), correct, weights)


@jax.jit
def _fit_ovr(logits, labels, weights):
  probs = jax.nn.softmax(logits, axis=-1)
  targets = labels[None, :] == jnp.arange(logits.shape[1])[:, None]
  return jax.vmap(pav_binary, in_axes=(0, 0, None))(probs.T, targets, weights)


def fit_isotonic(logits: ArrayLike, labels: ArrayLike,
                 mask: Optional[ArrayLike] = None) -> dict:
  """Top-label isotonic regression of correctness on the top softmax probability.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.

  Returns:
    `{"scores": [N], "fitted": [N], "rounds": int32}`: sorted held-out confidences and the
    calibrated confidence at each (pass them to `apply_isotonic`).
  """
  xs, fitted, rounds = _fit_top_label(*_fitting.fit_inputs(logits, labels, mask))
  return {"scores": xs, "fitted": fitted, "rounds": rounds}


def fit_isotonic_ovr(logits: ArrayLike, labels: ArrayLike,
                     mask: Optional[ArrayLike] = None) -> dict:
  """One-vs-rest isotonic regression: per class k, `1[y = k]` on `p_k`.

  Returns:
    `{"scores": [C, N], "fitted": [C, N], "rounds": [C]}` (pass them to `apply_isotonic_ovr`).
  """
  xs, fitted, rounds = _fit_ovr(*_fitting.fit_inputs(logits, labels, mask))
  return {"scores": xs, "fitted": fitted, "rounds": rounds}
