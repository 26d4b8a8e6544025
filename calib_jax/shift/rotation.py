"""Rotated images (Ovadia et al., NeurIPS 2019, "Can you trust your model's uncertainty?").

Ovadia et al. evaluate MNIST models on test digits rotated by 0, 15, ..., 180 degrees. `rotate`
turns images counter-clockwise about their centre ((H - 1) / 2, (W - 1) / 2) with bilinear
interpolation and zero fill, keeping their size: `scipy.ndimage.rotate(image, angle,
reshape=False, order=1, mode="constant", cval=0)` per channel. Output pixel (r, c) reads the input
at

    r' = cy + (r - cy) cos a + (c - cx) sin a,    c' = cx - (r - cy) sin a + (c - cx) cos a,

and is 0 where (r', c') falls outside [0, H - 1] x [0, W - 1].
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

ROTATION_ANGLES: tuple[int, ...] = tuple(range(0, 181, 15))
# Coordinates this close outside the image still count as inside (float32 rounding of cos/sin).
_EDGE_TOLERANCE = 1e-3


def _bilinear(image: jax.Array, rows: jax.Array, cols: jax.Array) -> jax.Array:
  height, width = image.shape[0], image.shape[1]
  inside = ((rows >= -_EDGE_TOLERANCE) & (rows <= height - 1 + _EDGE_TOLERANCE)
            & (cols >= -_EDGE_TOLERANCE) & (cols <= width - 1 + _EDGE_TOLERANCE))
  rows = jnp.clip(rows, 0.0, height - 1.0)
  cols = jnp.clip(cols, 0.0, width - 1.0)
  top = jnp.clip(jnp.floor(rows).astype(jnp.int32), 0, max(height - 2, 0))
  left = jnp.clip(jnp.floor(cols).astype(jnp.int32), 0, max(width - 2, 0))
  down = jnp.minimum(top + 1, height - 1)
  right = jnp.minimum(left + 1, width - 1)
  dy = (rows - top)[..., None]
  dx = (cols - left)[..., None]
  value = ((1 - dy) * ((1 - dx) * image[top, left] + dx * image[top, right])
           + dy * ((1 - dx) * image[down, left] + dx * image[down, right]))
  return jnp.where(inside[..., None], value, 0.0)


def rotate(images: jax.Array, angle_degrees: float | jax.Array) -> jax.Array:
  """Rotates `images` `[..., H, W, C]` counter-clockwise by `angle_degrees` (scalar, may be traced).

  Returns the same shape and dtype; integer images are rounded to the nearest level (as scipy
  does). Jit-able; one bilinear gather per pixel.
  """
  images = jnp.asarray(images)
  if images.ndim < 3:
    raise ValueError(f"rotate expects images [..., H, W, C]; got shape {images.shape}")
  height, width, channels = images.shape[-3:]
  flat = images.reshape((-1, height, width, channels)).astype(jnp.float32)
  angle = jnp.deg2rad(jnp.asarray(angle_degrees, jnp.float32))
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  centre_y, centre_x = (height - 1) / 2.0, (width - 1) / 2.0
  rows, cols = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32) - centre_y,
                            jnp.arange(width, dtype=jnp.float32) - centre_x, indexing="ij")
  source_rows = centre_y + rows * cos + cols * sin
  source_cols = centre_x - rows * sin + cols * cos
  out = jax.vmap(lambda image: _bilinear(image, source_rows, source_cols))(flat)
  if jnp.issubdtype(images.dtype, jnp.integer):
    info = jnp.iinfo(images.dtype)
    out = jnp.clip(jnp.round(out), info.min, info.max)
  return out.astype(images.dtype).reshape(images.shape)
