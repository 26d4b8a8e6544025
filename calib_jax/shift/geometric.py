"""Elastic transform, zoom blur and glass blur (Hendrycks & Dietterich, ICLR 2019), batched, jit-able.

* `zoom_blur` (deterministic): the mean of the image and its centre crops of `ceil(H / z)` pixels
  zoomed back by each factor z of the table (`scipy.ndimage.zoom(order=1)`, output pixel o reads
  input o (n_in - 1) / (n_out - 1)), cropped to H x W (top-left for ImageNet-C, centred for the
  CIFAR-10-C / Tiny-ImageNet-C scripts).
* `elastic_transform` (random): displacement fields `alpha * G_sigma * U(-a, a)` (Gaussian filter,
  reflected border, truncated at 3 sigma), bilinear resampling with a reflected border
  (`scipy.ndimage.map_coordinates(order=1, mode="reflect")`). The CIFAR-10-C / Tiny-ImageNet-C
  scripts first warp by a random affine map (three points moved by U(-affine, affine); OpenCV's
  `warpAffine`, bilinear, border reflected without repeating the edge).
* `glass_blur` (random): Gaussian blur (sigma, edge border), truncate to uint8, then the
  reference's pass of local "swaps": for each iteration, rows h = H - d .. d + 1 and columns
  w = W - d .. d + 1 in decreasing order, pixel (h, w) takes the value of (h + dy, w + dx),
  dx, dy ~ U{-d, .., d - 1} (the reference's tuple swap of numpy pixel views copies one way).
  The copies are sequential (a value read may have been written earlier in the pass): their
  chains are resolved by pointer doubling over a map of source-pixel indices (`glass_sources`),
  applied once at the end; then a second Gaussian blur.

`x` is float32 `[B, H, W, 3]` on the 0..255 scale, `params` one severity's table entry (static),
`key` a PRNG key with independent draws per image; results are float32 on 0..255, unclipped.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.shift import hashed_random

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]


def gaussian_filter(x: jax.Array, sigmas: tuple[float, ...], axes: tuple[int, ...],
                    border: str = "nearest", truncate: float = 4.0) -> jax.Array:
  """`scipy.ndimage.gaussian_filter` along `axes` (skimage.filters.gaussian's defaults).

  The kernel has radius `int(truncate * sigma + 0.5)`, weights exp(-k^2 / (2 sigma^2)) normalised;
  `border` is "nearest" (edge repeated) or "reflect" (half-sample symmetric: d c b a | a b c d).
  A zero sigma leaves its axis alone.
  """
  pad_mode = {"nearest": "edge", "reflect": "symmetric"}[border]
  for axis, sigma in zip(axes, sigmas):
    if sigma <= 0:
      continue
    radius = int(truncate * float(sigma) + 0.5)
    taps = np.arange(-radius, radius + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (taps / sigma) ** 2)
    weights = (weights / weights.sum()).astype(np.float32)
    size = x.shape[axis]
    pads = [(0, 0)] * x.ndim
    pads[axis] = (radius, radius)
    # Materialised: fused into the shifted reads below, the pad's index arithmetic kept XLA's CPU
    # loop from vectorising (2-5x slower at 224 px).
    padded = jax.lax.optimization_barrier(jnp.pad(x, pads, mode=pad_mode))
    out = jnp.zeros_like(x)
    for offset, weight in enumerate(weights):
      out = out + weight * jax.lax.slice_in_dim(padded, offset, offset + size, axis=axis)
    x = out
  return x


def _linear_taps(size: int, zoom: float, trim: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Source indices (low, high) and weights of `clipped_zoom` along one axis, `size` outputs."""
  n_in = int(np.ceil(size / float(zoom)))
  n_out = int(round(n_in * zoom))
  start = (size - n_in) // 2
  first = (n_out - size) // 2 if trim else 0
  coords = np.arange(first, first + size) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
  low = np.clip(np.floor(coords).astype(np.int32), 0, n_in - 1)
  high = np.clip(low + 1, 0, n_in - 1)
  return low + start, high + start, (coords - np.floor(coords)).astype(np.float32)


def _resample(x: jax.Array, axis: int, taps) -> jax.Array:
  low, high, frac = taps
  shape = [1] * x.ndim
  shape[axis] = -1
  frac = jnp.asarray(frac).reshape(shape)
  return (jnp.take(x, jnp.asarray(low), axis=axis) * (1.0 - frac)
          + jnp.take(x, jnp.asarray(high), axis=axis) * frac)


class ZoomBlur(NamedTuple):
  """One severity of `zoom_blur`: the zoom factors and whether the zoomed crop is centred."""
  factors: tuple[float, ...]
  centred: bool


def zoom_blur(x: jax.Array, params: ZoomBlur, key: jax.Array | None = None) -> jax.Array:
  """Zoom blur (deterministic: `key` is unused)."""
  del key
  height, width = x.shape[1:3]
  image = x.astype(jnp.float32) / 255.0
  total = image
  for factor in params.factors:
    layer = _resample(image, 1, _linear_taps(height, factor, params.centred))
    total = total + _resample(layer, 2, _linear_taps(width, factor, params.centred))
  return total / (len(params.factors) + 1) * 255.0


def _reflect_index(index: jax.Array, size: int) -> jax.Array:
  """Half-sample symmetric extension of indices: -1 -> 0, size -> size - 1."""
  period = 2 * size
  index = jnp.mod(index, period)
  return jnp.where(index >= size, period - 1 - index, index)


def _bilinear(image: jax.Array, rows: jax.Array, cols: jax.Array, reflect) -> jax.Array:
  """Samples `image` `[H, W, C]` at real coordinates `[H, W]` with the given border extension."""
  height, width = image.shape[:2]
  row0, col0 = jnp.floor(rows), jnp.floor(cols)
  fr, fc = (rows - row0)[..., None], (cols - col0)[..., None]
  row0, col0 = row0.astype(jnp.int32), col0.astype(jnp.int32)
  r0, r1 = reflect(row0, height), reflect(row0 + 1, height)
  c0, c1 = reflect(col0, width), reflect(col0 + 1, width)
  top = image[r0, c0] * (1 - fc) + image[r0, c1] * fc
  bottom = image[r1, c0] * (1 - fc) + image[r1, c1] * fc
  return top * (1 - fr) + bottom * fr


def _reflect101_index(index: jax.Array, size: int) -> jax.Array:
  """OpenCV's BORDER_REFLECT_101: -1 -> 1, size -> size - 2."""
  if size == 1:
    return jnp.zeros_like(index)
  period = 2 * size - 2
  index = jnp.mod(index, period)
  return jnp.where(index >= size, period - index, index)


class Elastic(NamedTuple):
  """One severity of `elastic_transform`.

  Displacement = alpha * G_sigma * U(-amplitude, amplitude) per axis, after a random affine warp
  whose three control points move by U(-affine, affine) pixels (0: none). With `relative`, sigma
  is a fraction of (H, W) and amplitude a fraction of H (ImageNet-C's convention, any size);
  otherwise both are in pixels (the CIFAR-10-C / Tiny-ImageNet-C scripts, for their size).
  """
  alpha: float
  sigma: float
  amplitude: float
  affine: float
  relative: bool


def _affine_warp(image: jax.Array, moves: jax.Array) -> jax.Array:
  """OpenCV's warpAffine of `image` `[H, W, C]` by the map taking the reference's three control
  points to themselves plus `moves` `[3, 2]` (x, y in pixels), bilinear, BORDER_REFLECT_101."""
  height, width = image.shape[:2]
  centre = np.float32([height // 2, width // 2])
  half = min(height, width) // 3
  source = np.float32([centre + half, [centre[0] + half, centre[1] - half], centre - half])
  target = jnp.asarray(source) + moves
  design = jnp.asarray(np.concatenate([source, np.ones((3, 1), np.float32)], axis=1))
  forward = jnp.linalg.solve(design, target).T      # [2, 3]: (x', y') = A (x, y) + t
  linear, shift = forward[:, :2], forward[:, 2]
  inverse = jnp.linalg.inv(linear)
  ys, xs = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32),
                        jnp.arange(width, dtype=jnp.float32), indexing="ij")
  points = jnp.stack([xs - shift[0], ys - shift[1]], axis=-1) @ inverse.T
  return _bilinear(image, points[..., 1], points[..., 0], _reflect101_index)


def elastic_transform_at(x: jax.Array, params: Elastic, fields: jax.Array,
                         moves: jax.Array | None = None) -> jax.Array:
  """`elastic_transform` from given draws: `fields` `[B, 2, H, W]` U(-1, 1) (dx then dy),
  `moves` `[B, 3, 2]` U(-1, 1) for the affine control points (ignored when `affine == 0`)."""
  height, width = x.shape[1:3]
  if params.relative:
    sigmas = (params.sigma * height, params.sigma * width)
    amplitude = params.amplitude * height
  else:
    sigmas, amplitude = (params.sigma, params.sigma), params.amplitude
  displacement = params.alpha * gaussian_filter(
      amplitude * fields.astype(jnp.float32), sigmas, axes=(2, 3), border="reflect", truncate=3.0)
  ys, xs = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32),
                        jnp.arange(width, dtype=jnp.float32), indexing="ij")
  image = x.astype(jnp.float32) / 255.0

  def one(picture, shift, move):
    if params.affine > 0:
      picture = _affine_warp(picture, params.affine * move)
    return _bilinear(picture, ys + shift[1], xs + shift[0], _reflect_index)

  if moves is None:
    moves = jnp.zeros((x.shape[0], 3, 2), jnp.float32)
  return jax.vmap(one)(image, displacement, moves) * 255.0


def elastic_transform(x: jax.Array, params: Elastic, key: jax.Array) -> jax.Array:
  """Elastic transform (random displacement fields, and a random affine warp where the table has
  one)."""
  batch, height, width = x.shape[:3]
  field_key, affine_key = jax.random.split(key)
  # U(-1, 1) per pixel from the counter hash (see hashed_random: jax.random is slow on CPUs).
  fields = 2.0 * hashed_random.uniform(field_key, (batch, 2, height, width)) - 1.0
  moves = jax.random.uniform(affine_key, (batch, 3, 2), minval=-1.0, maxval=1.0)
  return elastic_transform_at(x, params, fields, moves)


def glass_swap_sites(height: int, width: int, delta: int, iterations: int) -> np.ndarray:
  """The flat pixel indices (h W + w) the reference visits, in its order, `[iterations * n]`."""
  rows = np.arange(height - delta, delta, -1)
  cols = np.arange(width - delta, delta, -1)
  sites = (rows[:, None] * width + cols[None, :]).reshape(-1)
  return np.tile(sites, iterations).astype(np.int32)


def _resolve(pointers: jax.Array) -> jax.Array:
  """Pointer doubling until every pointer reaches a node that points to itself."""
  def unresolved(state):
    return ~state[1]

  def double(state):
    jumped = state[0][state[0]]
    return jumped, jnp.all(jumped == state[0])

  return jax.lax.while_loop(unresolved, double, (pointers, jnp.asarray(False)))[0]


def glass_sources(height: int, width: int, delta: int, iterations: int,
                  offsets: jax.Array) -> jax.Array:
  """The source pixel (flat index) of each pixel after the reference's passes of copies,
  `[B, H W]`, from the offsets `[B, S, 2]` (dx, dy) of `glass_blur_at`.

  Within one pass a site s visited at rank r(s) reads its partner t = s + dy W + dx: the value t
  got earlier in the pass when r(t) < r(s) (t already visited), else t's value from before the
  pass. So new(s) = new(t) or old(t), new(p) = old(p) off the sites: pointers that always move to
  earlier ranks, ending at an "old" node (which points to itself). Pointer doubling
  (ptr <- ptr[ptr] until nothing moves; the chains are short, so ~6 times) resolves every chain
  at once: a few batched gathers per pass instead of the ~50,000 sequential steps of a loop over
  the sites at 224 px. Exact.
  """
  sites_np = glass_swap_sites(height, width, delta, 1)
  count, size = sites_np.shape[0], height * width
  rank_np = np.full(size, -1, np.int32)
  rank_np[sites_np] = np.arange(count, dtype=np.int32)
  sites, rank = jnp.asarray(sites_np), jnp.asarray(rank_np)
  batch = offsets.shape[0]
  # Nodes 0..size-1: a pixel's value after the pass; size..2 size-1: its value before. Image b's
  # nodes are numbered from 2 b size, so one flat 1-D gather serves the batch (XLA's CPU gather
  # is several times faster on flat indices than with a batch dimension).
  base = (jnp.arange(batch, dtype=jnp.int32) * (2 * size))[:, None]
  resting = jnp.broadcast_to(jnp.arange(size, 2 * size, dtype=jnp.int32), (batch, size))
  order = jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (batch, size))
  for step in range(iterations):
    moves = offsets[:, step * count:(step + 1) * count]
    partners = sites[None, :] + moves[..., 1] * width + moves[..., 0]
    partner_rank = rank[partners]
    earlier = (partner_rank >= 0) & (partner_rank < jnp.arange(count, dtype=jnp.int32)[None])
    updated = resting.at[:, sites].set(jnp.where(earlier, partners, partners + size))
    pointers = (jnp.concatenate([updated, resting], axis=1) + base).reshape(-1)
    pointers = _resolve(pointers)
    final = pointers.reshape(batch, 2 * size)[:, :size] - base - size
    order = (order + base // 2).reshape(-1)[final + base // 2] - base // 2
  return order


def glass_blur_at(x: jax.Array, params: tuple[float, int, int], offsets: jax.Array) -> jax.Array:
  """`glass_blur` from given swap offsets `[B, S, 2]` (dx, dy in [-d, d)), S the number of
  `glass_swap_sites`."""
  sigma, delta, iterations = params
  batch, height, width, channels = x.shape
  # The blurs run per channel plane [B, C, H, W] (vectorised along W, not along C = 3).
  planes = jnp.transpose(x.astype(jnp.float32) / 255.0, (0, 3, 1, 2))
  blurred = jnp.transpose(gaussian_filter(planes, (sigma, sigma), axes=(2, 3)), (0, 2, 3, 1))
  # np.uint8(v * 255) truncates towards zero.
  pixels = jnp.floor(jnp.clip(blurred * 255.0, 0.0, 255.0))
  # The reference's `x[h, w], x[h', w'] = x[h', w'], x[h, w]` on pixel views copies (h', w')
  # into (h, w) and leaves (h', w') as it was (a duplication, not a swap).
  order = glass_sources(height, width, delta, iterations, offsets)
  shuffled = jnp.take_along_axis(pixels.reshape(batch, height * width, channels),
                                 order[..., None], axis=1).reshape(x.shape)
  planes = jnp.transpose(shuffled / 255.0, (0, 3, 1, 2))
  return jnp.transpose(gaussian_filter(planes, (sigma, sigma), axes=(2, 3)), (0, 2, 3, 1)) * 255.0


def glass_blur(x: jax.Array, params: tuple[float, int, int], key: jax.Array) -> jax.Array:
  """Glass blur: `params = (sigma, max_delta, iterations)` (the reference's c)."""
  _, delta, iterations = params
  batch, height, width = x.shape[:3]
  count = glass_swap_sites(height, width, delta, iterations).shape[0]
  # Uniform on -d..d-1 from the counter hash (jax.random.randint took longer than the blur
  # itself on CPUs); the modulo's bias is below 2d / 2^32.
  draws = hashed_random.bits(key, (batch, count, 2)) % jnp.uint32(2 * delta)
  offsets = draws.astype(jnp.int32) - delta
  return glass_blur_at(x, params, offsets)


CORRUPTIONS: dict[str, Corruption] = {
    "elastic_transform": elastic_transform, "zoom_blur": zoom_blur, "glass_blur": glass_blur}


def _factors(stop: float, step: float) -> tuple[float, ...]:
  # The reference's np.arange(1, stop, step), float for float.
  return tuple(float(v) for v in np.arange(1, stop, step))


def _elastic_pixels(size: int, entries) -> tuple[Elastic, ...]:
  return tuple(Elastic(alpha=size * a, sigma=size * s, amplitude=1.0, affine=size * f,
                       relative=False) for a, s, f in entries)


PARAMETERS: dict[str, dict[str, tuple]] = {
    "imagenet": {
        "elastic_transform": tuple(
            Elastic(alpha=250 * a, sigma=0.01, amplitude=0.005, affine=0.0, relative=True)
            for a in (0.05, 0.065, 0.085, 0.1, 0.12)),
        "zoom_blur": tuple(ZoomBlur(_factors(stop, step), centred=False) for stop, step in (
            (1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03))),
        "glass_blur": ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
    },
    "cifar10": {
        "elastic_transform": _elastic_pixels(32, (
            (0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
            (0.1, 0.03, 0.03))),
        "zoom_blur": tuple(ZoomBlur(_factors(stop, 0.01), centred=True)
                           for stop in (1.06, 1.11, 1.16, 1.21, 1.26)),
        "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    },
    "tiny_imagenet": {
        "elastic_transform": _elastic_pixels(64, (
            (0, 0, 0.08), (0.05, 0.3, 0.06), (0.1, 0.08, 0.06), (0.1, 0.03, 0.03),
            (0.16, 0.03, 0.02))),
        "zoom_blur": tuple(ZoomBlur(_factors(stop, 0.01), centred=True)
                           for stop in (1.06, 1.11, 1.16, 1.21, 1.26)),
        "glass_blur": ((0.1, 1, 1), (0.5, 1, 1), (0.6, 1, 2), (0.7, 2, 1), (0.9, 2, 2)),
    },
}
