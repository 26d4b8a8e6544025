"""Defocus and Gaussian blur (Hendrycks & Dietterich, ICLR 2019), batched and jit-able.

* `defocus_blur`, `params = (radius, alias_blur)`: the image correlated with an anti-aliased disk,
  as the reference builds it with OpenCV: the indicator of `i^2 + j^2 <= radius^2` on the grid
  `-L..L` (L = 8 for radius <= 8, else L = radius), normalised to sum 1, then smoothed by a
  `k x k` Gaussian of standard deviation `alias_blur` (k = 3 for radius <= 8, else 5) with
  reflect-101 borders; the image itself is filtered with reflect-101 borders (`cv2.filter2D`).
* `gaussian_blur`, `params = sigma`: scikit-image's `gaussian` (scipy's `gaussian_filter`): the
  separable kernel exp(-t^2 / (2 sigma^2)), t = -r..r with r = int(4 sigma + 0.5), normalised,
  with the border pixel repeated ('nearest'), as shifted adds along W and H per channel plane.

Every function takes `x` float32 `[B, H, W, 3]` on the 0..255 scale, the table entry of one
severity (a static Python constant) and a PRNG key (unused: both are deterministic); it returns the
float32 result on the 0..255 scale. Kernels are built with numpy at trace time.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.shift import geometric

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]


def _reflect101(values: np.ndarray, pad: int, axis: int) -> np.ndarray:
  widths = [(0, 0)] * values.ndim
  widths[axis] = (pad, pad)
  return np.pad(values, widths, mode="reflect")


def opencv_gaussian_kernel(size: int, sigma: float) -> np.ndarray:
  """`cv2.getGaussianKernel(size, sigma)` for sigma > 0: exp(-t^2 / (2 sigma^2)), normalised."""
  taps = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
  weights = np.exp(-taps ** 2 / (2.0 * sigma ** 2))
  return weights / weights.sum()


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
  """The reference's anti-aliased disk (its `disk` helper), float32 `[2L + 1, 2L + 1]`."""
  half = 8 if radius <= 8 else int(radius)
  size = 3 if radius <= 8 else 5
  grid = np.arange(-half, half + 1)
  rows, cols = np.meshgrid(grid, grid)
  disk = ((rows ** 2 + cols ** 2) <= radius ** 2).astype(np.float32)
  disk /= disk.sum()
  weights = opencv_gaussian_kernel(size, alias_blur).astype(np.float32)
  pad = size // 2
  for axis in (0, 1):  # separable Gaussian, reflect-101 borders, float32 like OpenCV
    padded = _reflect101(disk, pad, axis)
    disk = sum(weights[i] * np.take(padded, np.arange(i, i + disk.shape[axis]), axis=axis)
               for i in range(size)).astype(np.float32)
  return disk


def correlate(padded: jax.Array, kernel: np.ndarray) -> jax.Array:
  """Correlates each channel of a padded `x` `[B, H + kh - 1, W + kw - 1, C]` with `kernel`
  `[kh, kw]` ('valid'): out[i, j] = sum_ab kernel[a, b] x[i + a, j + b].

  Computed as a circular convolution with the flipped kernel through real FFTs (the valid part
  never wraps around): on CPUs several times faster than XLA's depthwise convolution for these
  kernel sizes, exact to float32 rounding (~1e-4 grey levels).
  """
  height, width = padded.shape[1], padded.shape[2]
  kernel_height, kernel_width = kernel.shape
  flipped = np.zeros((height, width), np.float32)
  flipped[:kernel_height, :kernel_width] = kernel[::-1, ::-1]
  spectrum = jnp.fft.rfft2(padded.astype(jnp.float32), axes=(1, 2))
  kernel_spectrum = jnp.asarray(np.fft.rfft2(flipped.astype(np.float64)).astype(np.complex64))
  full = jnp.fft.irfft2(spectrum * kernel_spectrum[None, :, :, None], s=(height, width),
                        axes=(1, 2))
  return full[:, kernel_height - 1:, kernel_width - 1:, :]


def to_planes(x: jax.Array) -> jax.Array:
  """`[B, H, W, C]` -> `[B, C, H, W]`: filters along H and W vectorise over the wide last axis
  (with C = 3 last, XLA's CPU loops run 3 wide; the two transposes cost ~one copy each)."""
  return jnp.transpose(x, (0, 3, 1, 2))


def from_planes(planes: jax.Array) -> jax.Array:
  """`[B, C, H, W]` -> `[B, H, W, C]`."""
  return jnp.transpose(planes, (0, 2, 3, 1))


def _support(kernel: np.ndarray) -> np.ndarray:
  """The kernel cropped to the smallest centred square holding its nonzero weights."""
  half = kernel.shape[0] // 2
  rows, cols = np.nonzero(kernel)
  reach = int(max(np.abs(rows - half).max(), np.abs(cols - half).max()))
  return kernel[half - reach:half + reach + 1, half - reach:half + reach + 1]


# Up to this many taps the disk is applied as shifted adds (one fused loop); above, through FFTs.
_DIRECT_TAPS = 49


def defocus_blur(x: jax.Array, params: tuple[float, float], key: jax.Array) -> jax.Array:
  """Defocus blur with the anti-aliased disk of `radius, alias_blur = params`.

  Small disks (CIFAR-10-C's radii under 1 px leave a 3 x 3 kernel) are applied as a sum of
  shifted copies, large ones (ImageNet-C's 17 x 17 to 21 x 21) by FFT; both per channel plane.
  """
  del key  # deterministic
  kernel = _support(disk_kernel(*params))
  pad = kernel.shape[0] // 2
  planes = to_planes(x)
  height, width = planes.shape[2:]
  # Materialised, as in geometric.gaussian_filter: a pad fused into the reads stops vectorising.
  padded = jax.lax.optimization_barrier(
      jnp.pad(planes, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="reflect"))
  if kernel.size <= _DIRECT_TAPS:
    out = jnp.zeros_like(planes)
    for (row, col), weight in np.ndenumerate(kernel):
      if weight != 0.0:
        out = out + weight * padded[:, :, row:row + height, col:col + width]
    return from_planes(out)
  batch, channels = planes.shape[:2]
  flat = padded.reshape((batch * channels, *padded.shape[2:], 1))
  out = correlate(flat, kernel)[..., 0]
  return from_planes(out.reshape(planes.shape))


def gaussian_blur(x: jax.Array, sigma: float, key: jax.Array) -> jax.Array:
  """Gaussian blur of standard deviation `sigma` pixels, border pixels repeated.

  Separable, per channel plane: shifted adds along W, then along H (`geometric.gaussian_filter`).
  On CPUs 4-5x faster than banded matrix products or a 2-D FFT at 224 px.
  """
  del key  # deterministic
  return from_planes(geometric.gaussian_filter(to_planes(x), (sigma, sigma), axes=(2, 3)))


CORRUPTIONS: dict[str, Corruption] = {
    "defocus_blur": defocus_blur,
    "gaussian_blur": gaussian_blur,
}

# ImageNet-C's entries are imagecorruptions' (applied to any image size); CIFAR-10-C's and
# Tiny-ImageNet-C's are those of Hendrycks' make_cifar_c.py and make_tinyimagenet_c.py.
PARAMETERS: dict[str, dict[str, tuple]] = {
    "imagenet": {
        "defocus_blur": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
        "gaussian_blur": (1, 2, 3, 4, 6),
    },
    "cifar10": {
        "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
        "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1),
    },
    "tiny_imagenet": {
        "defocus_blur": ((0.5, 0.6), (1, 0.1), (1.5, 0.1), (2.5, 0.01), (3, 0.1)),
        "gaussian_blur": (0.5, 0.75, 1, 1.25, 1.5),
    },
}
