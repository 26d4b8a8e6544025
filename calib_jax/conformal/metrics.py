"""Metrics of prediction sets: coverage, set size, and coverage conditional on size or class.

Every function takes a bool set mask `sets [..., C]` (`sets[i, y]`: label y is in sample i's
set), int `labels [...]` where needed, and an optional bool `mask [...]` of the samples that
count, like the metrics of `calib_jax.metrics`. All are jit-able; results are float32.
"""
import functools
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.conformal import _inputs
from calib_jax import arrays

ArrayLike = jax.typing.ArrayLike

# Set-size strata of Angelopoulos et al. (2021, Table 4, ImageNet): 0–1, 2–3, 4–6, 7–10,
# 11–100, 101–1000 (upper ends inclusive), cut at C.
DEFAULT_SIZE_EDGES = (1, 3, 6, 10, 100, 1000)


class StratifiedCoverage(NamedTuple):
  """Coverage per stratum. An empty stratum has count 0 and coverage 0, and is left out of
  `worst`."""
  coverage: jax.Array   # float32 [S], fraction of the stratum's samples whose set holds y
  count: jax.Array      # int32 [S], (valid) samples per stratum
  worst: jax.Array      # float32 scalar, min coverage over non-empty strata


class SizeStratifiedCoverage(NamedTuple):
  """`StratifiedCoverage` over set-size strata `lower[s] ≤ |C(x)| ≤ upper[s]`."""
  coverage: jax.Array   # float32 [S]
  count: jax.Array      # int32 [S]
  worst: jax.Array      # float32 scalar
  lower: jax.Array      # int32 [S], smallest set size of each stratum
  upper: jax.Array      # int32 [S], largest set size of each stratum


def _flatten(sets: ArrayLike, labels: Optional[ArrayLike], mask: Optional[ArrayLike]):
  """Validates `sets [..., C]`, `labels [...]`, `mask [...]`; returns them flattened to N."""
  n, num_classes = _inputs.check_class_shape(sets, labels, "sets")
  leading = tuple(np.shape(sets))[:-1]
  dtype = sets.dtype if hasattr(sets, "dtype") else np.asarray(sets).dtype
  if dtype != bool:
    raise ValueError(f"sets must be a bool mask [..., C] (a predictor's output), got dtype "
                     f"{dtype}.")
  sets = arrays.unsharded(jnp.asarray(sets)).reshape(n, num_classes)
  mask = arrays.flatten_mask(mask, leading)
  if labels is not None:
    labels = arrays.as_int_array(labels, "labels").reshape(n)
    arrays.check_label_values(labels, num_classes, mask)
  return sets, labels, mask


def _weights(mask: Optional[jax.Array], n: int) -> jax.Array:
  return jnp.ones(n, jnp.float32) if mask is None else mask.astype(jnp.float32)


def _covered(sets: jax.Array, labels: jax.Array) -> jax.Array:
  """Whether each sample's set holds its label: `sets[i, labels[i]]`, `[N]` float32."""
  return jnp.take_along_axis(sets, labels[:, None], axis=-1)[:, 0].astype(jnp.float32)


# The computations are jitted as a whole (one compiled program instead of one per operation).


@jax.jit
def _coverage(sets, labels, mask):
  w = _weights(mask, sets.shape[0])
  return jnp.sum(w * _covered(sets, labels)) / jnp.sum(w)


@jax.jit
def _mean_set_size(sets, mask):
  w = _weights(mask, sets.shape[0])
  return jnp.sum(w * jnp.sum(sets, axis=-1, dtype=jnp.float32)) / jnp.sum(w)


def coverage(sets: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Empirical coverage `(1/n) Σ_i 1[y_i ∈ C(x_i)]` (the target is 1 − α)."""
  return _coverage(*_flatten(sets, labels, mask))


def mean_set_size(sets: ArrayLike, mask: Optional[ArrayLike] = None) -> jax.Array:
  """Mean set size `(1/n) Σ_i |C(x_i)|` (empty sets count 0)."""
  sets, _, mask = _flatten(sets, None, mask)
  return _mean_set_size(sets, mask)


@functools.partial(jax.jit, static_argnames="num_strata")
def _stratified(sets, labels, mask, stratum, num_strata: int):
  """Coverage per stratum: `(coverage [S], count [S], worst over non-empty strata)`."""
  w = _weights(mask, sets.shape[0])
  count = jax.ops.segment_sum(w, stratum, num_segments=num_strata)
  hits = jax.ops.segment_sum(w * _covered(sets, labels), stratum, num_segments=num_strata)
  cov = hits / jnp.maximum(count, 1.0)
  worst = jnp.min(jnp.where(count > 0, cov, jnp.inf))
  return cov, count.astype(jnp.int32), worst


@functools.partial(jax.jit, static_argnames="upper")
def _size_stratified(sets, labels, mask, upper: tuple):
  sizes = jnp.sum(sets, axis=-1, dtype=jnp.int32)
  stratum = jnp.searchsorted(jnp.asarray(upper, jnp.int32), sizes, side="left")
  return _stratified(sets, labels, mask, stratum, len(upper))


def size_strata(num_classes: int, edges: Optional[Sequence[int]] = None) -> np.ndarray:
  """The inclusive upper set sizes of the strata: `edges` (default `DEFAULT_SIZE_EDGES`) cut at
  C, with C appended when missing. The first stratum starts at size 0 (empty sets)."""
  edges = DEFAULT_SIZE_EDGES if edges is None else tuple(edges)
  if (not edges or any(isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0
                       for e in edges) or any(b <= a for a, b in zip(edges, edges[1:]))):
    raise ValueError(f"edges must be increasing ints >= 0 (inclusive upper set sizes), got "
                     f"{edges!r}.")
  upper = [int(e) for e in edges if e < num_classes] + [num_classes]
  return np.asarray(upper, np.int32)


def size_stratified_coverage(sets: ArrayLike, labels: ArrayLike,
                             edges: Optional[Sequence[int]] = None,
                             mask: Optional[ArrayLike] = None) -> SizeStratifiedCoverage:
  """Coverage per set-size stratum, and the worst stratum (SSC, Angelopoulos et al. 2021).

  Stratum s holds the samples with `upper[s−1] < |C(x)| ≤ upper[s]` (`upper[−1] = −1`). An
  adaptive method covers about 1 − α in every stratum; THR typically under-covers the large
  sets (the hard samples) and over-covers the small ones.

  Args:
    sets: `[..., C]` bool set mask.
    labels: `[...]` int labels.
    edges: inclusive upper set sizes of the strata (static); default `DEFAULT_SIZE_EDGES`.
    mask: optional `[...]` bool.
  """
  sets, labels, mask = _flatten(sets, labels, mask)
  upper = size_strata(sets.shape[-1], edges)
  cov, count, worst = _size_stratified(sets, labels, mask, tuple(int(e) for e in upper))
  lower = np.concatenate([[0], upper[:-1] + 1]).astype(np.int32)
  return SizeStratifiedCoverage(cov, count, worst, jnp.asarray(lower), jnp.asarray(upper))


def class_conditional_coverage(sets: ArrayLike, labels: ArrayLike,
                               mask: Optional[ArrayLike] = None) -> StratifiedCoverage:
  """Coverage per true class `P(y ∈ C(x) | y = c)`, and the worst class.

  Marginal split conformal guarantees only the average; the worst class shows how far a method
  is from class-conditional coverage (cf. Angelopoulos et al. 2021; Ding et al. 2023).
  """
  sets, labels, mask = _flatten(sets, labels, mask)
  cov, count, worst = _stratified(sets, labels, mask, labels, sets.shape[-1])
  return StratifiedCoverage(cov, count, worst)
