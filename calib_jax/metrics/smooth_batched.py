"""relplot's bandwidth search (`smooth.search_bandwidth`) for B bootstrap resamples of one data
set at once: the smooth-ECE bootstrap's inner loop (`metrics.bootstrap`).

A resample is given by its counts `c_bi`, how often it drew each of the N original points.
Each resample's search is `smooth.search_bandwidth` of its drawn points: the same grids, FFT
lengths and kernel vectors, the same ten bisection steps; its values equal that up to float32
rounding of sums taken in another order (tested). What the B searches share, and why it is
cheaper on XLA:CPU (where a scatter costs per element and small operations per call):

* The spreads: resample b's grid is `Σ_i c_bi v_i` over the original points' spread rows `v_i`
  (`[r_i, 1]` at their two grid points). The counts are one scatter of the B·N draws; the grids
  one scatter of N rows of 4B values (`grids_from_counts`), not B·N rows of 4.
* The kernel spectra: every bandwidth the bisection scores is dyadic, `σ = j/1024`, so the
  rFFTs of the sampled kernels are computed once per call for every `j` (`kernel_tables`: 1014
  on the coarse grid, 9 on the fine one) and gathered per step, not one rFFT per resample per
  step.
* The density's sum `Σ_{k<T} D(t_k)` is linear in the density grid: one complex dot product of
  its spectrum with the kernel's and a per-T weight (`_density_weights`, Parseval's identity)
  instead of an inverse FFT and an interpolation. Only the residual is transformed back and
  interpolated, at no more points than the batch's largest T needs (`_EVAL_BUCKETS`).
* The fine grid (`σ ≤ 0.00999`, where relplot's grids are finer) is ~5x the coarse one's
  work: its spectra and its steps are computed only for the resamples that need them, in
  groups of `_FINE_GROUP` (a loop over their compacted indices).
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import smooth

_DYADIC = 1 << smooth.SEARCH_STEPS           # the bisection's bandwidths are j / 1024
_FINE_GROUP = 8                               # fine-grid resamples transformed together


class _Grid(NamedTuple):
  """One of the two grids the search uses, and the dyadic bandwidths it scores."""
  points: int        # M
  min_j: int         # smallest j scored on it (the fine grid: 2, as σ = 1/1024 < SEARCH_FLOOR
  max_j: int         #   is never used), largest j
  eval_max_j: int    # T(j) = max(round(10/σ), 200) is 200 (coarse) for every j ≥ this one
  buckets: tuple     # evaluation points read per step: the smallest bucket ≥ the batch's T
                     #   (each bucket is one more compiled branch: ~1 s of compiling)


_COARSE_MIN_J = int(smooth.COARSE_MIN_SIGMA * _DYADIC) + 1    # 11
_COARSE = _Grid(smooth.COARSE_GRID, _COARSE_MIN_J, _DYADIC, 52,
                (smooth.MIN_EVAL_POINTS, smooth.MAX_COARSE_EVAL_POINTS))
_FINE = _Grid(smooth.FINE_GRID, 2, _COARSE_MIN_J - 1, _COARSE_MIN_J - 1,
              (smooth.MAX_SEARCH_EVAL_POINTS,))


class Tables(NamedTuple):
  """Per grid, what every search shares: the kernels' rFFTs for j = min_j .. max_j, and the
  density weights for j = min_j .. eval_max_j."""
  coarse_kernels: jax.Array   # complex64 [1014, F]
  coarse_density: jax.Array   # complex64 [42, F]
  fine_kernels: jax.Array     # complex64 [9, F_fine]
  fine_density: jax.Array     # complex64 [9, F_fine]


def _density_weights(num_eval: jax.Array, grid: _Grid) -> jax.Array:
  """Frequency weights `W` with `Σ_{k<T} D(t_k) = Re Σ_f S_f K_f W_f` for the smoothed density
  `D` (`S`: the density grid's `mirrored_spectrum`, `K`: the kernel's, `T`: `num_eval`).

  The sum of the interpolated values is `Σ_j a_j D_j`, `a` the interpolation weights summed
  per grid point and `D_j` entry `M − 1 + j` of the circular convolution `irfft(S·K)`. By
  Parseval's identity for real sequences of length L, `Σ_n x_n y_n = (1/L) Σ_f w_f Re(X_f
  conj(Y_f))` over the rFFT's bins (`w_f` = 2, but 1 at DC and Nyquist), with `y` the weights
  `a` placed at `M − 1 + j`."""
  m, length = grid.points, smooth.fft_length(grid.points)
  t, inside = smooth.eval_grid(num_eval, grid.buckets[-1])
  lower, frac = smooth.interpolation_weights(t, m)
  inside = inside.astype(jnp.float32)
  placed = jnp.zeros(length, jnp.float32)
  placed = placed.at[m - 1 + lower].add((1.0 - frac) * inside)
  placed = placed.at[m + lower].add(frac * inside)
  bins = length // 2 + 1
  w = jnp.full(bins, 2.0, jnp.float32).at[0].set(1.0).at[-1].set(1.0) / length
  return w * jnp.conj(jnp.fft.rfft(placed))


def tables() -> Tables:
  """The kernel and density tables of every bandwidth the bisection can score (~20 ms of one
  core; once per bootstrap)."""
  def of(grid):
    kernels = jnp.arange(grid.min_j, grid.max_j + 1, dtype=jnp.float32) / _DYADIC
    density = jnp.arange(grid.min_j, grid.eval_max_j + 1, dtype=jnp.float32) / _DYADIC
    return (smooth.kernel_spectrum(grid.points, kernels),
            jax.vmap(lambda s: _density_weights(smooth.search_eval_points(s), grid))(density))
  return Tables(*of(_COARSE), *of(_FINE))


class _Points(NamedTuple):
  """The original points' spread onto one grid: rows `[(1−frac)·r, 1−frac, frac·r, frac]`
  at grid point `lower` (`frac·[r, 1]` goes on to `lower + 1`)."""
  parts: jax.Array   # float32 [N, 4]
  lower: jax.Array   # int32 [N]


def _points(conf: jax.Array, correct: jax.Array, m: int) -> _Points:
  weights = smooth.spread_weights(conf, correct, None)                  # [2, N]
  lower, frac = smooth.interpolation_weights(conf, m)
  return _Points(jnp.concatenate([(1.0 - frac) * weights, frac * weights]).T, lower)


def grids_from_counts(counts: jax.Array, points: _Points, m: int) -> jax.Array:
  """The spread `[residual, count]` grids `[B, 2, m]` of the resamples with `counts [B, N]`
  (`smooth.spread_to_grid` of their drawn points, summed in another order)."""
  b, n = counts.shape
  rows = (counts.T[:, :, None] * points.parts[:, None, :]).reshape(n, 4 * b)
  summed = jax.ops.segment_sum(rows, points.lower, m).reshape(m, b, 4).transpose(1, 2, 0)
  return summed[:, :2] + jnp.pad(summed[:, 2:, :-1], ((0, 0), (0, 0), (1, 0)))


def _values(spectra: jax.Array, sigma: jax.Array, grid: _Grid, kernels: jax.Array,
            density: jax.Array) -> jax.Array:
  """`smECE_σ` of B resamples on `grid` from their `mirrored_spectrum` `[B, 2, F]` and `σ [B]`
  (a σ off the grid's range is scored at the nearest j in it, and not used)."""
  j = jnp.clip(jnp.round(sigma * _DYADIC).astype(jnp.int32), grid.min_j, grid.max_j)
  kernel = kernels[j - grid.min_j]
  num_eval = smooth.search_eval_points(j.astype(jnp.float32) / _DYADIC)
  residual = smooth.smooth_with(spectra[:, 0], grid.points, kernel)

  def residual_sums(max_eval):
    def one(curve, count):
      t, inside = smooth.eval_grid(count, max_eval)
      return jnp.sum(jnp.where(inside, jnp.abs(smooth.interpolate(curve, t)), 0.0))
    return jax.vmap(one)(residual, num_eval)

  bucket = jnp.searchsorted(jnp.asarray(grid.buckets), jnp.max(num_eval))
  numerator = lax.switch(bucket, [lambda e=e: residual_sums(e) for e in grid.buckets])
  weights = density[jnp.minimum(j, grid.eval_max_j) - grid.min_j]
  denominator = jnp.real(jnp.sum(spectra[:, 1] * kernel * weights, axis=-1))
  return numerator / (denominator + num_eval.astype(jnp.float32) * smooth.DENSITY_FLOOR)


def _in_groups(flags: jax.Array, size: int, body, init):
  """`init` passed through `body(ids [size], carry)` for the indices b with `flags[b]`, `size`
  at a time (padded with the out-of-range index B: gathers clip, updates drop it)."""
  batch = flags.shape[0]
  order = jnp.nonzero(flags, size=batch + size, fill_value=batch)[0]
  groups = (jnp.sum(flags, dtype=jnp.int32) + size - 1) // size
  return lax.fori_loop(0, groups,
                       lambda g, carry: body(lax.dynamic_slice(order, (g * size,), (size,)),
                                             carry), init)


def search_bandwidths(counts: jax.Array, conf: jax.Array, correct: jax.Array, tab: Tables):
  """`smooth.search_bandwidth` of B resamples of the points `(conf [N], correct [N])` drawn
  `counts [B, N]` times each, with `tab = tables()`; returns `(smECE [B], σ [B])`."""
  coarse_points = _points(conf, correct, _COARSE.points)
  coarse = smooth.mirrored_spectrum(grids_from_counts(counts, coarse_points, _COARSE.points))
  batch = coarse.shape[0]

  def coarse_values(sigma):
    return _values(coarse, sigma, _COARSE, tab.coarse_kernels, tab.coarse_density)

  # As `smooth.search_spectra`: the fine grid where the search scores 1/64 and grows.
  first_fine = jnp.full((batch,), 1.0 / 64, jnp.float32)
  needs_fine = first_fine >= coarse_values(first_fine)
  fine_points = _points(conf, correct, _FINE.points)

  def fine_spectra(ids, fine):
    grids = grids_from_counts(jnp.take(counts, ids, axis=0, mode="clip"), fine_points,
                              _FINE.points)
    return fine.at[ids].set(smooth.mirrored_spectrum(grids), mode="drop")

  fine_bins = smooth.fft_length(_FINE.points) // 2 + 1
  fine = _in_groups(needs_fine, _FINE_GROUP, fine_spectra,
                    jnp.zeros((batch, 2, fine_bins), jnp.complex64))

  def score(sigma):
    """`smECE_σ` of each resample: on the coarse grid, then the fine grid's where σ is on it."""
    on_fine = (sigma <= smooth.COARSE_MIN_SIGMA) & (sigma >= _FINE.min_j / _DYADIC)

    def fine_values(ids, value):
      got = _values(jnp.take(fine, ids, axis=0, mode="clip"),
                    jnp.take(sigma, ids, mode="clip"), _FINE, tab.fine_kernels,
                    tab.fine_density)
      return value.at[ids].set(got, mode="drop")

    return _in_groups(on_fine, _FINE_GROUP, fine_values, coarse_values(sigma))

  return smooth.bisect_bandwidth(score, (batch,))
