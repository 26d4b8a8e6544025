"""relplot's bandwidth search (`smooth.search_bandwidth`) for B resamples of one data set at
once: the smooth-ECE bootstrap's inner loop (`metrics.bootstrap`).

Each resample's search is the same computation as `smooth.search_bandwidth` on its own: the
same grids, FFT lengths and kernel vectors, the same ten bisection steps and the same
decisions; values equal it up to float32 rounding of batched operations (tested). What is
shared across the B resamples, and why it is cheaper on XLA:CPU, where per-operation costs of
B small programs' operations dominate at N of a few hundred:

* The spreads: one scatter of the B·N resampled points into B stacked grids (segment ids
  `b·M + lower`), each grid's sums in the same order as its own scatter.
* The kernel spectra: every bandwidth the bisection scores is dyadic, `σ = j/1024`, so the
  rFFTs of the sampled kernels are computed once per call for every `j` on each grid
  (`kernel_tables`: 1014 coarse, 9 fine) and gathered per step, instead of one rFFT per
  resample per step.
* The fine grid (`σ ≤ 0.00999`, relplot's finer grids): its spectra and its steps are computed
  only for the resamples that need them, one at a time (a loop over their compacted indices),
  not for the whole batch whenever one of them does: a fine step is ~10x a coarse one.

Per coarse step and resample the work left is one complex product, one inverse rFFT of two
rows (length 2048) and the interpolation at up to 1001 points.
"""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import smooth

_DYADIC = 1 << smooth.SEARCH_STEPS           # the bisection's bandwidths are j / 1024
# Smallest j on the coarse grid (σ > smooth.COARSE_MIN_SIGMA) and on the fine grid (σ ≥ 2⁻⁹:
# the search's value at σ < SEARCH_FLOOR = 1e-3, j = 1, is never used).
_COARSE_MIN_J = int(smooth.COARSE_MIN_SIGMA * _DYADIC) + 1
_FINE_MIN_J = 2


# The evaluation-point counts `T = max(round(10/σ), 200)` of the coarse grid's bandwidths:
# one per j up to _EVAL_MAX_J, all 200 from there on (j ≥ 52).
_EVAL_MAX_J = 52
# Evaluation points read per resample in a coarse step: the smallest of these that holds the
# batch's largest T (most steps of most searches have T = 200, the coarse grid's largest T is
# round(10/0.01074) = 931).
_EVAL_BUCKETS = (smooth.MIN_EVAL_POINTS, 2 * smooth.MIN_EVAL_POINTS,
                 smooth.MAX_COARSE_EVAL_POINTS)


class KernelTables(NamedTuple):
  """What every search shares, per bandwidth `σ = j/1024` the bisection can score."""
  coarse: jax.Array   # complex64 [1025 − _COARSE_MIN_J, F]: kernel rFFTs, j = 11 .. 1024
  fine: jax.Array     # complex64 [_COARSE_MIN_J − _FINE_MIN_J, F_fine]: j = 2 .. 10
  density: jax.Array  # complex64 [_EVAL_MAX_J − _COARSE_MIN_J + 1, F]: `_density_weights`


def _density_weights(num_eval: jax.Array) -> jax.Array:
  """Frequency weights `W` with `Σ_{k<T} D(t_k) = Re Σ_f S_f K_f W_f` for the smoothed
  density `D` on the coarse grid (`S`: its `mirrored_spectrum`, `K`: the kernel's, `T`:
  `num_eval`).

  The sum of the interpolated values is `Σ_j a_j D_j` with `a` the interpolation weights summed
  per grid point, and `D_j` entry `M − 1 + j` of the circular convolution `irfft(S·K)`; by
  Parseval's identity for real sequences of length L, `Σ_n x_n y_n = (1/L) Σ_f w_f Re(X_f
  conj(Y_f))` over the rFFT's bins (`w_f = 2`, but 1 at DC and Nyquist), with `y` the weights
  `a` placed at `M − 1 + j`: one complex dot product per resample instead of an inverse FFT
  and an interpolation."""
  m, length = smooth.COARSE_GRID, smooth.fft_length(smooth.COARSE_GRID)
  t, inside = smooth.eval_grid(num_eval, smooth.MAX_COARSE_EVAL_POINTS)
  lower, frac = smooth.interpolation_weights(t, m)
  inside = inside.astype(jnp.float32)
  placed = jnp.zeros(length, jnp.float32)
  placed = placed.at[m - 1 + lower].add((1.0 - frac) * inside)
  placed = placed.at[m + lower].add(frac * inside)
  bins = length // 2 + 1
  w = jnp.full(bins, 2.0, jnp.float32).at[0].set(1.0).at[-1].set(1.0) / length
  return w * jnp.conj(jnp.fft.rfft(placed))


def kernel_tables() -> KernelTables:
  """The tables of every bandwidth the bisection can score (~20 ms on one core)."""
  def sigmas(first, last):
    return jnp.arange(first, last + 1, dtype=jnp.float32) / _DYADIC
  return KernelTables(
      smooth.kernel_spectrum(smooth.COARSE_GRID, sigmas(_COARSE_MIN_J, _DYADIC)),
      smooth.kernel_spectrum(smooth.FINE_GRID, sigmas(_FINE_MIN_J, _COARSE_MIN_J - 1)),
      jax.vmap(_density_weights)(
          smooth.search_eval_points(sigmas(_COARSE_MIN_J, _EVAL_MAX_J))))


def spread_to_grids(f: jax.Array, weights: jax.Array, num_points: int) -> jax.Array:
  """`smooth.spread_to_grid` of B data sets at once: `f [B, N]`, `weights [B, K, N]` ->
  `[B, K, num_points]`, as one scatter into the B stacked grids."""
  b, k, n = weights.shape
  scaled = f * (num_points - 1)
  lower = jnp.clip(jnp.floor(scaled).astype(jnp.int32), 0, num_points - 2)
  frac = (scaled - lower)[:, None, :]
  parts = jnp.concatenate([(1.0 - frac) * weights, frac * weights], axis=1)   # [B, 2K, N]
  segments = (lower + num_points * jnp.arange(b, dtype=jnp.int32)[:, None]).reshape(-1)
  summed = jax.ops.segment_sum(parts.transpose(0, 2, 1).reshape(b * n, 2 * k), segments,
                               b * num_points)
  summed = summed.reshape(b, num_points, 2 * k).transpose(0, 2, 1)            # [B, 2K, M]
  return summed[:, :k] + jnp.pad(summed[:, k:, :-1], ((0, 0), (0, 0), (1, 0)))


def _dyadic_index(sigma: jax.Array) -> jax.Array:
  return jnp.round(sigma * _DYADIC).astype(jnp.int32)


def _residual_sums(smoothed: jax.Array, num_eval: jax.Array, max_eval: int) -> jax.Array:
  """`Σ_{k<T} |R(t_k)|` of smoothed residual grids `[B, M]` at `T = num_eval [B] ≤ max_eval`."""
  def one(curve, count):
    t, inside = smooth.eval_grid(count, max_eval)
    return jnp.sum(jnp.where(inside, jnp.abs(smooth.interpolate(curve, t)), 0.0))
  return jax.vmap(one)(smoothed, num_eval)


def _coarse_values(spectra: jax.Array, tables: KernelTables, sigma: jax.Array) -> jax.Array:
  """`smECE_σ` of every resample on the coarse grid (`[B, 2, F]` spectra, `σ [B]`); values of
  the resamples whose σ is on the fine grid are computed too, and not used."""
  j = _dyadic_index(sigma)
  on_coarse = j >= _COARSE_MIN_J
  kernels = tables.coarse[jnp.clip(j - _COARSE_MIN_J, 0, tables.coarse.shape[0] - 1)]
  num_eval = jnp.where(on_coarse, smooth.search_eval_points(sigma), smooth.MIN_EVAL_POINTS)
  residual = smooth.smooth_with(spectra[:, 0], smooth.COARSE_GRID, kernels)
  bucket = jnp.searchsorted(jnp.asarray(_EVAL_BUCKETS), jnp.max(num_eval))
  numerator = lax.switch(bucket, [
      lambda points=points: _residual_sums(residual, num_eval, points)
      for points in _EVAL_BUCKETS])
  weights = tables.density[jnp.clip(j, _COARSE_MIN_J, _EVAL_MAX_J) - _COARSE_MIN_J]
  density = jnp.real(jnp.sum(spectra[:, 1] * kernels * weights, axis=-1))
  return numerator / (density + num_eval.astype(jnp.float32) * smooth.DENSITY_FLOOR)


def _fine_value(spectrum: jax.Array, tables: KernelTables, sigma: jax.Array) -> jax.Array:
  """`smECE_σ` of one resample on the fine grid (`[2, F_fine]` spectrum)."""
  row = jnp.clip(_dyadic_index(sigma) - _FINE_MIN_J, 0, tables.fine.shape[0] - 1)
  smoothed = smooth.smooth_with(spectrum, smooth.FINE_GRID, tables.fine[row][None, :])
  return smooth.smooth_ece_of_grid(smoothed, smooth.search_eval_points(sigma),
                                   smooth.MAX_SEARCH_EVAL_POINTS)


def _for_each_flagged(flags: jax.Array, body, init):
  """`init` updated by `body(b, carry)` for each b with `flags[b]`, in a loop over the
  compacted indices (as many iterations as flags set, none when no flag is)."""
  order = jnp.nonzero(flags, size=flags.shape[0], fill_value=0)[0]
  return lax.fori_loop(0, jnp.sum(flags, dtype=jnp.int32),
                       lambda i, carry: body(order[i], carry), init)


def search_bandwidths(conf: jax.Array, correct: jax.Array, mask: Optional[jax.Array],
                      tables: KernelTables):
  """`smooth.search_bandwidth` of B resamples `conf [B, N]`, `correct [B, N]` (mask: None or
  `[N]` / `[B, N]`), with `tables = kernel_tables()`; returns `(smECE [B], σ [B])`."""
  if mask is not None:
    mask = jnp.broadcast_to(mask, conf.shape)
  weights = jnp.moveaxis(smooth.spread_weights(conf, correct, mask), 0, 1)       # [B, 2, N]
  coarse = smooth.mirrored_spectrum(spread_to_grids(conf, weights, smooth.COARSE_GRID))
  batch = coarse.shape[0]

  # As `smooth.search_spectra`: the fine grid exactly where the search scores 1/64 and grows.
  first_fine = jnp.full((batch,), 1.0 / 64, jnp.float32)
  needs_fine = first_fine >= _coarse_values(coarse, tables, first_fine)

  def fine_spectrum(b, fine):
    grid = smooth.spread_to_grid(conf[b], weights[b], smooth.FINE_GRID)
    return fine.at[b].set(smooth.mirrored_spectrum(grid))

  fine_bins = smooth.fft_length(smooth.FINE_GRID) // 2 + 1
  fine = _for_each_flagged(needs_fine, fine_spectrum,
                           jnp.zeros((batch, 2, fine_bins), jnp.complex64))

  def step(i, state):
    lo, hi, _ = state
    sigma = jnp.where(i < smooth.SEARCH_STEPS, (lo + hi) / 2, hi)
    value = _coarse_values(coarse, tables, sigma)
    on_fine = (sigma <= smooth.COARSE_MIN_SIGMA) & (_dyadic_index(sigma) >= _FINE_MIN_J)
    value = _for_each_flagged(
        on_fine, lambda b, v: v.at[b].set(_fine_value(fine[b], tables, sigma[b])), value)
    too_small = (i < smooth.SEARCH_STEPS) & ((sigma < smooth.SEARCH_FLOOR) | (sigma < value))
    grow = (i < smooth.SEARCH_STEPS) & ~too_small
    return jnp.where(too_small, sigma, lo), jnp.where(grow, sigma, hi), value

  zeros = jnp.zeros(batch, jnp.float32)
  _, sigma, value = lax.fori_loop(0, smooth.SEARCH_STEPS + 1, step, (zeros, zeros + 1.0, zeros))
  return value, sigma
