"""Smooth ECE (Błasiok & Nakkiran, 2023) with relplot's automatic bandwidth, on device.

Reference: J. Błasiok and P. Nakkiran, "Smooth ECE: Principled reliability diagrams via kernel
smoothing", ICLR 2024 (arXiv:2309.12236, 2023); its package is relplot 1.0.

Top-label: the confidence `f_i = max_k p_ik`, the outcome `y_i = 1[argmax p_i = label_i]` and
the residual `r_i = f_i − y_i`. With a Gaussian kernel reflected at 0 and 1,
`K_σ(t, f) = Σ_{s ∈ {f, −f, 2 − f}} φ_σ(t − s)` (each term truncated at `|t − s| ≤ 1/2`, as
relplot's kernel vector is), the smoothed residual and density are
`R(t) = Σ_i K_σ(t, f_i) r_i`, `D(t) = Σ_i K_σ(t, f_i)`, and

    smECE_σ = Σ_{t ∈ T} |R(t)| / Σ_{t ∈ T} (D(t) + 1e-4),

a Riemann sum of the paper's `∫ |R(t)| dt / N` over the `T = max(200, round(10/σ))` points
`linspace(0, 1, T)` (the `1e-4` is relplot's density floor; it weighs `1e-4/N` of the result).
The automatic bandwidth is the fixed point `σ* = smECE_σ*`, found as relplot finds it: ten
bisection steps on `(0, 1]` with the predicate `σ < 1e-3 or σ < smECE_σ`, keeping the upper
end (the smallest dyadic `σ = j/1024` tested with `σ ≥ smECE_σ`); the result is
`smECE_σ` at that `σ`.

Discretisation (relplot's): the `f_i` are spread onto a uniform grid of `M` points by linear
(cloud-in-cell) weights, the grid is convolved with the sampled, reflected kernel, and `R`, `D`
are linearly interpolated at the `T` evaluation points. Work is O(N) for the two histograms
plus O(M log M) per bandwidth (an FFT convolution), so N = 1e6 costs about two passes over the
confidences. The spreading moves each sample's mass by at most one grid step `h = 1/(M − 1)`
while keeping its mean position, so the smoothed curves are off by `O(h²/σ²)` relative
(≤ 1.3e-3 at relplot's smallest grid-to-bandwidth ratio, 1e-4 at σ = 0.05); tests bound the
gap to a direct O(N·T) evaluation of the formula above.

Where this differs from relplot 1.0, and why:
* relplot's grid is `M = max(2000, round(20/σ)) // 2 + 1`. For `σ ≥ 0.01` that is 1001
  points, used here too. Below 0.01 relplot re-bins the data for every bandwidth the search
  tries (1025 to 5121 points); here one second grid of 5121 points (relplot's finest, at
  `σ = 2⁻⁹`) serves all of them, so the data is binned at most twice, not once per step (the
  fine grid only when the search goes below 1/64) — the difference is within the
  discretisation error above. With a fixed `bandwidth=` the grid
  is relplot's exactly.
* An even `M` (relplot at some `σ < 0.01`) centres relplot's kernel half a grid step off; the
  grid here is always odd (`M + 1` when relplot's is even).
* relplot mirrors the grid about its end nodes without repeating them, so mass on the end
  nodes (samples in the outermost grid cells, e.g. confidences of exactly 1) is reflected at
  half the weight the continuous reflected kernel gives it: an O(h/σ) difference from the
  formula near 0 and 1. It is relplot's value, so it is kept.
* float32 instead of float64, and relplot's test of `σ = 1` before the
  bisection is skipped: it can never pass, since `smECE_σ ≤ 1` for any data.

Against relplot 1.0.3 (`crosscheck/relplot_smece.py`): the same σ on every case run, values
within 3.6e-7 relative (float32 rounding) where σ ≥ 0.01 and 6.4e-4 where it is below.
"""
import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import program_store
from calib_jax import arrays
from calib_jax.metrics import calibration

ArrayLike = jax.typing.ArrayLike

DENSITY_FLOOR = 1e-4     # relplot's `eps` added to the smoothed density
SEARCH_STEPS = 10        # bisection steps of the bandwidth search (resolution 2⁻¹⁰)
SEARCH_FLOOR = 1e-3      # bandwidths below this count as "too small" without evaluation
MIN_EVAL_POINTS = 200    # relplot's config.smECE_mesh_pts
COARSE_GRID = 1001      # relplot's grid for σ ≥ 0.01
FINE_GRID = 5121        # relplot's grid at σ = 2⁻⁹, the smallest bandwidth the search scores
_FINE_FFT_LENGTH = 10368  # 2⁷·3⁴ ≥ 2·5121 − 1
# relplot's grid is 1001 points while round(20/σ) ≤ 2001, i.e. for σ > 20/2001.5.
COARSE_MIN_SIGMA = 20.0 / 2001.5
# The search never scores σ < 2⁻⁹, so round(10/σ) ≤ 5120 evaluation points; on the coarse
# grid (σ > COARSE_MIN_SIGMA) round(10/σ) ≤ 1001, so its steps interpolate 5x fewer points.
MAX_SEARCH_EVAL_POINTS = 5120
MAX_COARSE_EVAL_POINTS = round(10.0 / COARSE_MIN_SIGMA)


def grid_points(bandwidth: float) -> int:
  """relplot's smoothing grid for a bandwidth, `max(2000, round(20/σ)) // 2 + 1`, made odd."""
  m = max(2000, round(20.0 / bandwidth)) // 2 + 1
  return m if m % 2 else m + 1


def eval_points(bandwidth: float) -> int:
  """relplot's number of evaluation points, `max(round(10/σ), 200)`."""
  return max(round(10.0 / bandwidth), MIN_EVAL_POINTS)


def spread_to_grid(f: jax.Array, weights: jax.Array, num_points: int) -> jax.Array:
  """Linear (cloud-in-cell) weights of points `f ∈ [0, 1]` on `linspace(0, 1, num_points)`.

  `weights [K, N]` are spread together; returns `[K, num_points]` float32.
  """
  scaled = f * (num_points - 1)
  lower = jnp.clip(jnp.floor(scaled).astype(jnp.int32), 0, num_points - 2)
  frac = scaled - lower
  # One scatter of N rows `[(1 − frac)·w, frac·w]` (for every weight row) into the lower grid
  # point; the `frac` parts then move one point up. A plain scatter-add: ~10x faster than the
  # chunked `segment_sum_f32` on XLA:CPU, and its float32 rounding (~1e-5 relative for 1e6
  # samples in one grid cell) is far below the discretisation error. Half the scattered rows
  # of spreading to `lower` and `lower + 1` separately, in one pass for all weights.
  parts = jnp.concatenate([(1.0 - frac) * weights, frac * weights]).T   # [N, 2K]
  summed = jax.ops.segment_sum(parts, lower, num_points).T               # [2K, M]
  k = weights.shape[0]
  return summed[:k] + jnp.pad(summed[k:, :-1], ((0, 0), (1, 0)))


def mirrored_spectrum(grid: jax.Array) -> jax.Array:
  """The rFFT of grid values `[K, M]` (M odd) mirrored about both ends (end points not
  repeated) by the kernel's half-width `(M − 1)/2`, zero-padded so that the convolution with
  the kernel's M taps does not wrap around onto the M outputs kept.

  The kernel reaches `(M − 1)/2` points, so a mirror of that many points on each side is all
  any output reads: `2M − 1` points, an FFT of `fft_length(M) ≥ 2M − 1` (half the length of
  mirroring the whole grid on each side, the same sums)."""
  m = grid.shape[-1]
  half = (m - 1) // 2
  extended = jnp.concatenate(
      [grid[..., 1:half + 1][..., ::-1], grid, grid[..., m - 1 - half:m - 1][..., ::-1]], axis=-1)
  return jnp.fft.rfft(extended, fft_length(m))


def fft_length(m: int) -> int:
  """The FFT length of an M-point grid's convolution: at least `2M − 1` (the mirrored grid and
  the kernel's M taps, no wrap onto the outputs kept). 2048 for the coarse grid; the fine
  grid's `2⁷·3⁴ = 10368`, a 5-smooth length ~1.6x faster on XLA:CPU than the power of two
  16384; otherwise the next power of two."""
  if m == FINE_GRID:
    return _FINE_FFT_LENGTH
  return 1 << (2 * m - 2).bit_length()


def kernel_spectrum(m: int, sigma: jax.Array) -> jax.Array:
  """The rFFT (`fft_length(m)`) of the Gaussian sampled at offsets `j·h`, `|j| ≤ (M − 1)/2`,
  `h = 1/(M − 1)`: unnormalised pdf values, as relplot's kernel vector. `sigma` of any shape
  `[...]` gives `[..., fft_length(m)//2 + 1]`."""
  half = (m - 1) // 2
  h = 1.0 / (m - 1)
  offsets = jnp.arange(-half, half + 1, dtype=jnp.float32) * h
  sigma = jnp.asarray(sigma, jnp.float32)[..., None]
  kernel = jnp.exp(-jnp.square(offsets) / (2.0 * sigma * sigma)) / (
      math.sqrt(2.0 * math.pi) * sigma)
  return jnp.fft.rfft(kernel, fft_length(m))


def smooth_with(spectrum: jax.Array, m: int, kernel: jax.Array) -> jax.Array:
  """The M grid values of a `mirrored_spectrum` `[..., F]` convolved with a `kernel_spectrum`
  (broadcast against it): the grid smoothed by the Gaussian reflected at 0 and 1."""
  length = fft_length(m)
  full = jnp.fft.irfft(spectrum * kernel, length)
  return full[..., m - 1:2 * m - 1]    # output j reads mirrored points j .. j + M − 1


def _smooth_spectrum(spectrum: jax.Array, m: int, sigma: jax.Array) -> jax.Array:
  """Convolves the grid behind `mirrored_spectrum` with the Gaussian reflected at 0 and 1.

  The bandwidth search calls this once per bandwidth on the spectrum computed once.
  """
  return smooth_with(spectrum, m, kernel_spectrum(m, sigma))


def _reflected_gaussian(grid: jax.Array, sigma: jax.Array) -> jax.Array:
  """Convolves grid values `[K, M]` with the Gaussian reflected at 0 and 1 (via one FFT)."""
  return _smooth_spectrum(mirrored_spectrum(grid), grid.shape[-1], sigma)


def interpolate(curves: jax.Array, t: jax.Array) -> jax.Array:
  """Linear interpolation of `[..., M]` grid curves at points `t ∈ [0, 1]`."""
  lower, frac = interpolation_weights(t, curves.shape[-1])
  return curves[..., lower] * (1.0 - frac) + curves[..., lower + 1] * frac


def interpolation_weights(t: jax.Array, m: int):
  """`(lower, frac)`: the point `t ∈ [0, 1]` lies `frac` of the way from grid point `lower`
  to `lower + 1` of `linspace(0, 1, m)`."""
  pos = t * (m - 1)
  lower = jnp.clip(jnp.floor(pos).astype(jnp.int32), 0, m - 2)
  return lower, pos - lower


def eval_grid(num_eval: jax.Array, max_eval: int):
  """The evaluation points `linspace(0, 1, num_eval)` padded to `max_eval`: `(t, inside)`,
  `t = 0` where `inside` is False."""
  k = jnp.arange(max_eval, dtype=jnp.float32)
  t = k / jnp.maximum(num_eval - 1, 1).astype(jnp.float32)
  inside = k < num_eval
  return jnp.where(inside, t, 0.0), inside


def smooth_ece_of_grid(smoothed: jax.Array, num_eval: jax.Array, max_eval: int) -> jax.Array:
  """`smECE_σ` from the smoothed `[residual, count]` grid `[2, M]` (`smooth_with`), read at
  `num_eval ≤ max_eval` points `linspace(0, 1, num_eval)`."""
  t, inside = eval_grid(num_eval, max_eval)
  residual, density = interpolate(smoothed, t)
  numerator = jnp.sum(jnp.where(inside, jnp.abs(residual), 0.0))
  denominator = jnp.sum(jnp.where(inside, density + DENSITY_FLOOR, 0.0))
  return numerator / denominator


def _smooth_ece_at(spectrum: jax.Array, m: int, sigma: jax.Array, num_eval: jax.Array,
                   max_eval: int) -> jax.Array:
  """`smECE_σ` from the `mirrored_spectrum` of the spread `[residual, count]` grid of `m`
  points; `num_eval ≤ max_eval` points."""
  return smooth_ece_of_grid(_smooth_spectrum(spectrum, m, sigma), num_eval, max_eval)


def search_eval_points(sigma: jax.Array) -> jax.Array:
  return jnp.maximum(jnp.round(10.0 / sigma), MIN_EVAL_POINTS).astype(jnp.int32)


def spread_weights(conf, correct, mask):
  """The spread weights `[residual, count]` (0 for masked-out entries)."""
  weight = jnp.ones_like(conf) if mask is None else mask.astype(jnp.float32)
  return jnp.stack([(conf - correct.astype(jnp.float32)) * weight, weight])


def _smooth_ece_on(coarse, fine, sigma):
  """`smECE_σ` from the grid relplot uses at σ: coarse above 0.01, else fine."""
  num_eval = search_eval_points(sigma)
  return lax.cond(
      sigma > COARSE_MIN_SIGMA,
      lambda: _smooth_ece_at(coarse, COARSE_GRID, sigma, num_eval, MAX_COARSE_EVAL_POINTS),
      lambda: _smooth_ece_at(fine, FINE_GRID, sigma, num_eval, MAX_SEARCH_EVAL_POINTS))


def search_spectra(conf, correct, mask):
  """The spectra of the coarse grid, and of the fine one where the search will need it (else
  zeros): computed once, not once per bandwidth tried.

  The bisection scores a bandwidth below 1/64 only after scoring 1/64 itself (on the coarse
  grid) and finding `1/64 ≥ smECE_{1/64}`; otherwise the second pass over the data is skipped.
  """
  weights = spread_weights(conf, correct, mask)
  coarse = mirrored_spectrum(spread_to_grid(conf, weights, COARSE_GRID))
  sigma = jnp.float32(1.0 / 64)
  needs_fine = sigma >= _smooth_ece_at(coarse, COARSE_GRID, sigma, search_eval_points(sigma),
                                       MAX_COARSE_EVAL_POINTS)
  fine_shape = (2, fft_length(FINE_GRID) // 2 + 1)
  fine = lax.cond(needs_fine,
                  lambda: mirrored_spectrum(spread_to_grid(conf, weights, FINE_GRID)),
                  lambda: jnp.zeros(fine_shape, jnp.complex64))
  return coarse, fine


def bisect_bandwidth(score: Callable[[jax.Array], jax.Array], shape: tuple[int, ...] = ()):
  """relplot's bisection of the bandwidth on `(0, 1]` (module docstring) for bandwidths of
  `shape` at once, `score(σ)` giving `smECE_σ`; returns `(smECE_σ, σ)` (float32 `shape`)."""

  def step(i, state):
    lo, hi, _ = state
    # Steps 0..9 bisect; step 10 scores the result, `hi` (one compiled evaluation for all).
    sigma = jnp.where(i < SEARCH_STEPS, (lo + hi) / 2, hi)
    value = score(sigma)
    too_small = (i < SEARCH_STEPS) & ((sigma < SEARCH_FLOOR) | (sigma < value))
    grow = (i < SEARCH_STEPS) & ~too_small
    return jnp.where(too_small, sigma, lo), jnp.where(grow, sigma, hi), value

  # A loop, not unrolled: one compiled step instead of eleven (compilation ~5x faster).
  zeros = jnp.zeros(shape, jnp.float32)
  _, sigma, value = lax.fori_loop(0, SEARCH_STEPS + 1, step, (zeros, zeros + 1.0, zeros))
  return value, sigma


def search_bandwidth(conf: jax.Array, correct: jax.Array, mask: Optional[jax.Array]):
  """relplot's bandwidth search on `(f, y)`; returns `(smECE_σ, σ)` (both float32)."""
  coarse, fine = search_spectra(conf, correct, mask)
  return bisect_bandwidth(lambda sigma: _smooth_ece_on(coarse, fine, sigma))


def fixed_bandwidth(conf: jax.Array, correct: jax.Array, mask: Optional[jax.Array],
                    bandwidth: float) -> jax.Array:
  """`smECE_σ` at a given (static) bandwidth, on relplot's grids for that bandwidth."""
  m = grid_points(bandwidth)
  spectrum = mirrored_spectrum(spread_to_grid(conf, spread_weights(conf, correct, mask), m))
  num_eval = eval_points(bandwidth)
  return _smooth_ece_at(spectrum, m, jnp.float32(bandwidth), jnp.int32(num_eval), num_eval)


@functools.partial(program_store.jit, static_argnames="bandwidth")
def _smooth_ece(probs, labels, mask, bandwidth):
  conf, correct = calibration.confidence_and_correct(probs, labels)
  if bandwidth is None:
    return search_bandwidth(conf, correct, mask)
  return fixed_bandwidth(conf, correct, mask, bandwidth), jnp.float32(bandwidth)


def check_bandwidth(bandwidth) -> Optional[float]:
  """None, or a Python float in (0, 1]."""
  if bandwidth is None:
    return None
  if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float, np.floating)):
    raise ValueError(f"bandwidth must be None (automatic) or a float in (0, 1], got "
                     f"{bandwidth!r}.")
  if not 0.0 < float(bandwidth) <= 1.0:
    raise ValueError(f"bandwidth must be in (0, 1], got {bandwidth}.")
  return float(bandwidth)


def smooth_ece(probs: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None,
               bandwidth: Optional[float] = None, *, return_bandwidth: bool = False):
  """Smooth ECE of the top-label confidence (Błasiok & Nakkiran, 2023), as relplot computes it.

  `smECE_σ = Σ_t |Σ_i K_σ(t, f_i)(f_i − y_i)| / Σ_t Σ_i K_σ(t, f_i)` with the reflected
  Gaussian kernel `K_σ` and `f = max p`, `y = 1[argmax p = label]`; see the module docstring
  for the grid, the bandwidth search and the differences from relplot.

  Args:
    probs: `[..., C]` probabilities.
    labels: `[...]` integer labels.
    mask: optional bool `[...]`, True for entries that count.
    bandwidth: the kernel width σ (a Python float in (0, 1], static under jit); None (default)
      chooses relplot's automatic bandwidth, the fixed point `σ = smECE_σ`.
    return_bandwidth: also return the σ used.

  Returns:
    float32 scalar in [0, 1] (with `return_bandwidth`, the pair `(smECE, σ)`).
  """
  bandwidth = check_bandwidth(bandwidth)
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  value, sigma = _smooth_ece(probs, labels, mask, bandwidth)
  return (value, sigma) if return_bandwidth else value


def top_label_inputs(confidence: ArrayLike, correct: ArrayLike):
  """`(confidence, correct)` `[N]` checked and cast: float32 in [0, 1] and bool."""
  confidence = jnp.asarray(confidence)
  correct = jnp.asarray(correct)
  if confidence.ndim != 1 or correct.shape != confidence.shape:
    raise ValueError(f"confidence and correct must both be [N], got shapes "
                     f"{tuple(confidence.shape)} and {tuple(correct.shape)}.")
  if not jnp.issubdtype(correct.dtype, jnp.bool_):
    raise ValueError(f"correct must be bool, got {correct.dtype}.")
  return confidence.astype(jnp.float32), correct


@jax.jit
def _top_label_smooth_ece(confidence, correct, mask):
  return search_bandwidth(confidence, correct, mask)[0]


def top_label_smooth_ece(confidence: ArrayLike, correct: ArrayLike,
                         mask: Optional[ArrayLike] = None) -> jax.Array:
  """`smooth_ece` from the top-label confidences `max_k p_k` `[N]` and whether each argmax is
  right (bool `[N]`), the automatic bandwidth: the value `smooth_ece` gives on the
  probabilities. For bootstraps over precomputed confidences (`metrics.bootstrap` batches its
  bandwidth searches)."""
  confidence, correct = top_label_inputs(confidence, correct)
  if mask is not None:
    mask = jnp.asarray(mask, bool)
  return _top_label_smooth_ece(confidence, correct, mask)


@functools.partial(program_store.jit, static_argnames="num_points")
def _curve(conf, correct, mask, sigma, num_points):
  weights = spread_weights(conf, correct, mask)
  coarse, fine = spread_to_grid(conf, weights, COARSE_GRID), spread_to_grid(
      conf, weights, FINE_GRID)
  t = jnp.linspace(0.0, 1.0, num_points, dtype=jnp.float32)

  def on(grid):
    return interpolate(_reflected_gaussian(grid, sigma), t)

  residual, density = lax.cond(sigma > COARSE_MIN_SIGMA, lambda: on(coarse),
                               lambda: on(fine))
  density = density + DENSITY_FLOOR
  n = jnp.sum(weights[1])
  return t, t - residual / density, density / n


def smooth_calibration_curve(probs: ArrayLike, labels: ArrayLike,
                             mask: Optional[ArrayLike] = None,
                             bandwidth: Optional[float] = None, num_points: int = 200) -> dict:
  """The kernel-smoothed reliability curve that relplot draws, at `num_points` points.

  `accuracy(t) = t − R(t)/(D(t) + 1e-4)` (the smoothed `E[y | f = t]`) and the smoothed
  density of the confidences `density(t) = D(t)/N` (relplot's `KernelSmoother` on centred
  targets and its `kde`), at the smooth ECE's bandwidth.

  Returns:
    dict of numpy arrays `t`, `accuracy`, `density` `[num_points]` and floats `smooth_ece`,
    `bandwidth`.
  """
  bandwidth = check_bandwidth(bandwidth)
  num_points = arrays.check_num_bins(num_points)
  if num_points < 2:
    raise ValueError(f"num_points must be >= 2, got {num_points}.")
  probs, labels, mask = arrays.flatten_probs_labels(probs, labels, mask)
  value, sigma = _smooth_ece(probs, labels, mask, bandwidth)
  conf, correct = calibration.confidence_and_correct(probs, labels)
  t, accuracy, density = _curve(conf, correct, mask, sigma, num_points)
  return {"t": np.asarray(t), "accuracy": np.asarray(accuracy),
          "density": np.asarray(density), "smooth_ece": float(value),
          "bandwidth": float(sigma)}
