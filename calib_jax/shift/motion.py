"""Motion blur and snow (Hendrycks & Dietterich, ICLR 2019), batched and jit-able.

Both corruptions smear a layer along a line with the kernel that `imagecorruptions` uses in
place of ImageMagick's `MotionBlurImage`: a one-sided Gaussian of width `2 * radius + 1`,

    k_i = exp(-i^2 / (2 sigma^2)) / sum_j exp(-j^2 / (2 sigma^2)),   i = 0 .. 2 radius,

whose i-th tap reads the image shifted by `(dy_i, dx_i) = -ceil(i (sin a, cos a) - 1/2)` pixels
with the border pixel repeated. Taps whose shift reaches the image's size are dropped without
renormalising (the reference's loop stops there).

* `motion_blur`: the image blurred at an angle a ~ U(-45, 45) degrees, one angle per image.
* `snow`: a Gaussian noise layer N(mu, s), zoomed (bilinear, the reference's `clipped_zoom`),
  thresholded, motion-blurred at a ~ U(-135, -45) degrees and rounded to 1/255; the image is
  whitened towards `1.5 gray + 0.5` and the layer is added with its 180-degree rotation.

Every function takes `x` float32 `[B, H, W, 3]` on the 0..255 scale, the table entry of one
severity (a static Python tuple) and a PRNG key (one independent draw per image); it returns the
unclipped float32 result on the 0..255 scale.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]
# Interpolation as matrix products: full float32 (no TF32/bfloat16 passes on accelerators).
_EXACT = jax.lax.Precision.HIGHEST


def motion_weights(radius: int, sigma: float) -> np.ndarray:
  """The normalised one-sided Gaussian weights of the reference's motion-blur kernel."""
  taps = np.arange(2 * int(radius) + 1, dtype=np.float64)
  weights = np.exp(-taps ** 2 / (2.0 * sigma ** 2))
  return weights / weights.sum()


def motion_offsets(radius: int, angle_deg: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The (dy, dx) shift of each tap for a (traced) angle in degrees, as the reference rounds it."""
  width = 2 * int(radius) + 1
  angle = jnp.deg2rad(jnp.asarray(angle_deg, jnp.float32))
  point_y, point_x = width * jnp.sin(angle), width * jnp.cos(angle)
  hypot = jnp.hypot(point_y, point_x)
  taps = jnp.arange(width, dtype=jnp.float32)
  dy = -jnp.ceil(taps * point_y / hypot - 0.5).astype(jnp.int32)
  dx = -jnp.ceil(taps * point_x / hypot - 0.5).astype(jnp.int32)
  return dy, dx


def blur_along_line(layer: jax.Array, radius: int, sigma: float,
                    angle_deg: jax.Array) -> jax.Array:
  """Motion-blurs one image `layer` `[H, W, ...]` at `angle_deg` (a traced scalar).

  out[r, c] = sum_i k_i valid_i layer[clip(r - dy_i), clip(c - dx_i)], where valid_i is 0 from the
  first tap whose |dy| >= H or |dx| >= W on (the reference breaks out of its loop there).
  """
  height, width = layer.shape[0], layer.shape[1]
  weights = jnp.asarray(motion_weights(radius, sigma), jnp.float32)
  dy, dx = motion_offsets(radius, angle_deg)
  inside = (jnp.abs(dy) < height) & (jnp.abs(dx) < width)
  weights = weights * jnp.cumprod(inside.astype(jnp.float32))
  rows, cols = jnp.arange(height), jnp.arange(width)
  layer = layer.astype(jnp.float32)

  def tap(total, step):
    weight, shift_y, shift_x = step
    shifted = jnp.take(layer, jnp.clip(rows - shift_y, 0, height - 1), axis=0)
    shifted = jnp.take(shifted, jnp.clip(cols - shift_x, 0, width - 1), axis=1)
    return total + weight * shifted, None

  total, _ = jax.lax.scan(tap, jnp.zeros_like(layer), (weights, dy, dx))
  return total


def motion_blur(x: jax.Array, params: tuple[float, float], key: jax.Array) -> jax.Array:
  """Motion blur of `radius, sigma = params` at a uniform random angle in [-45, 45) degrees."""
  angles = jax.random.uniform(key, (x.shape[0],), minval=-45.0, maxval=45.0)
  return motion_blur_at(x, params, angles)


def motion_blur_at(x: jax.Array, params: tuple[float, float], angles: jax.Array) -> jax.Array:
  """`motion_blur` at given angles `[B]` (degrees): the corruption's deterministic part."""
  radius, sigma = params
  return jax.vmap(lambda image, angle: blur_along_line(image, radius, sigma, angle))(
      x.astype(jnp.float32), angles)


def zoom_matrix(size: int, zoom: float) -> np.ndarray:
  """The `[out, ceil(size / zoom)]` matrix of the reference's `clipped_zoom` along one axis.

  The centred crop of `ceil(size / zoom)` pixels is zoomed by `scipy.ndimage.zoom(order=1)`:
  output pixel o reads input coordinate o (n_in - 1) / (n_out - 1) with linear interpolation,
  n_out = round(n_in zoom). All rows are returned (the caller crops).
  """
  n_in = int(np.ceil(size / float(zoom)))
  n_out = int(round(n_in * zoom))
  coords = np.arange(n_out) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
  low = np.clip(np.floor(coords).astype(int), 0, n_in - 1)
  high = np.clip(low + 1, 0, n_in - 1)
  frac = coords - low
  matrix = np.zeros((n_out, n_in))
  matrix[np.arange(n_out), low] += 1.0 - frac
  matrix[np.arange(n_out), high] += frac
  return matrix


def snow_noise_shape(height: int, width: int, zoom: float) -> tuple[int, int]:
  """The shape of the centred noise crop that the reference's `clipped_zoom` enlarges."""
  return int(np.ceil(height / float(zoom))), int(np.ceil(width / float(zoom)))


def snow_at(x: jax.Array, params: tuple, noise: jax.Array, angles: jax.Array) -> jax.Array:
  """`snow` from given draws: `noise` `[B, *snow_noise_shape]` N(mu, s), `angles` `[B]` degrees."""
  _, _, zoom, threshold, radius, sigma, keep = params
  height, width = x.shape[1:3]
  zoom_rows = jnp.asarray(zoom_matrix(height, zoom), jnp.float32)
  zoom_cols = jnp.asarray(zoom_matrix(width, zoom), jnp.float32)

  def layer_of(noise_crop, angle):
    layer = jnp.matmul(jnp.matmul(zoom_rows, noise_crop.astype(jnp.float32), precision=_EXACT),
                       zoom_cols.T, precision=_EXACT)
    layer = jnp.clip(jnp.where(layer < threshold, 0.0, layer), 0.0, 1.0)
    # Blurred at the zoomed size, then cropped top-left, as the reference does.
    layer = blur_along_line(layer, radius, sigma, angle)
    return (jnp.round(layer * 255.0) / 255.0)[:height, :width]

  layers = jax.vmap(layer_of)(noise, angles)[..., None]
  image = x.astype(jnp.float32) / 255.0
  gray = jnp.matmul(image, jnp.asarray([0.299, 0.587, 0.114], jnp.float32), precision=_EXACT)
  image = keep * image + (1.0 - keep) * jnp.maximum(image, gray[..., None] * 1.5 + 0.5)
  return (image + layers + layers[:, ::-1, ::-1]) * 255.0


def snow(x: jax.Array, params: tuple, key: jax.Array) -> jax.Array:
  """Snow: `params = (mu, s, zoom, threshold, radius, sigma, keep)` (the reference's c[0..6]).

  The reference draws H x W noise and zooms its centred crop; drawing only the crop is the same
  law. The blur angle is U(-135, -45) degrees, one per image.
  """
  loc, scale, zoom = params[:3]
  batch, height, width = x.shape[:3]
  noise_key, angle_key = jax.random.split(key)
  noise = loc + scale * jax.random.normal(
      noise_key, (batch, *snow_noise_shape(height, width, zoom)))
  angles = jax.random.uniform(angle_key, (batch,), minval=-135.0, maxval=-45.0)
  return snow_at(x, params, noise, angles)


CORRUPTIONS: dict[str, Corruption] = {"motion_blur": motion_blur, "snow": snow}

# Per-severity entries. ImageNet-C's are imagecorruptions' (applied to any size); CIFAR-10-C's and
# Tiny-ImageNet-C's come from Hendrycks' make_cifar_c.py / make_tinyimagenet_c.py, which blur with
# ImageMagick: here the same entries drive the reference package's kernel (docs/shift.md).
PARAMETERS: dict[str, dict[str, tuple]] = {
    "imagenet": {
        "motion_blur": ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
        "snow": ((0.1, 0.3, 3, 0.5, 10, 4, 0.8),
                 (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
                 (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
                 (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
                 (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)),
    },
    "cifar10": {
        "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
        "snow": ((0.1, 0.2, 1, 0.6, 8, 3, 0.95),
                 (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                 (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
                 (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                 (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)),
    },
    "tiny_imagenet": {
        "motion_blur": ((10, 1), (10, 1.5), (10, 2), (10, 2.5), (12, 3)),
        "snow": ((0.1, 0.2, 1, 0.6, 8, 3, 0.8),
                 (0.1, 0.2, 1, 0.5, 10, 4, 0.8),
                 (0.15, 0.3, 1.75, 0.55, 10, 4, 0.7),
                 (0.25, 0.3, 2.25, 0.6, 12, 6, 0.65),
                 (0.3, 0.3, 1.25, 0.65, 14, 12, 0.6)),
    },
}
