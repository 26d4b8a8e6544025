"""Fog, frost and spatter (Hendrycks & Dietterich, ICLR 2019), batched and jit-able; all random.

* `fog`: x' = (x + c P) max(x) / (max(x) + c) with P a plasma fractal (diamond-square on an
  N x N grid, N the next power of two of the image's side, cropped to H x W, scaled to [0, 1]);
  at step size s the new points are the mean of their 4 neighbours plus w U(-w, w), and w is
  divided by the table's decay after each step (w starts at 100). The steps are static strided
  updates, one uniform draw array per step.
* `frost`: x' = a x + b F with F a random crop of one of the reference package's frost
  photographs (random texture, random offset). The textures are read from the installed
  `imagecorruptions` package on the host once per image size and resized like OpenCV's bicubic
  `resize` (ImageNet-C: enlarged to cover the image, times 1.1; CIFAR-10-C / Tiny-ImageNet-C:
  scaled by 0.2 / 0.3 and only the first 5 textures); the crop runs on the device.
* `spatter`: a blurred Gaussian "liquid" layer, thresholded. Severities with mode 0 (water) add a
  pale turquoise layer shaped by an edge map of the liquid (Canny edges, their chamfer distance
  transform truncated at 20, a box blur, histogram equalisation, an emboss filter and a box
  blur, as the reference's OpenCV pipeline); mode 1 (mud) blends in a brown layer where the
  blurred liquid mask exceeds 0.8.

`x` is float32 `[B, H, W, 3]` on the 0..255 scale, `params` one severity's table entry (static),
`key` a PRNG key with independent draws per image; results are float32 on 0..255, unclipped.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.shift.geometric import gaussian_filter

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]


# --- fog --------------------------------------------------------------------------------------

def plasma_size(height: int, width: int) -> int:
  """The side of the plasma grid: the next power of two of the image's longest side."""
  side = max(height, width, 3)
  return 1 << (side - 1).bit_length()


def plasma_draw_shapes(size: int) -> list[tuple[int, int]]:
  """The shapes of the uniform draws of the diamond-square steps, in the reference's order."""
  shapes, step = [], size
  while step >= 2:
    count = size // step
    shapes += [(count, count)] * 3
    step //= 2
  return shapes


def plasma_fractal(size: int, decay: float, draws: list[jax.Array]) -> jax.Array:
  """One plasma map `[size, size]` in [0, 1] from U(-1, 1) `draws` (`plasma_draw_shapes`)."""
  grid = jnp.zeros((size, size), jnp.float32)
  step, wibble, index = size, 100.0, 0

  def noisy_mean(total):
    nonlocal index
    value = total / 4.0 + wibble * wibble * draws[index]
    index += 1
    return value

  while step >= 2:
    half = step // 2
    corners = grid[0::step, 0::step]
    square = corners + jnp.roll(corners, -1, axis=0)
    square = square + jnp.roll(square, -1, axis=1)
    grid = grid.at[half::step, half::step].set(noisy_mean(square))
    centres, corners = grid[half::step, half::step], grid[0::step, 0::step]
    left = centres + jnp.roll(centres, 1, axis=0) + corners + jnp.roll(corners, -1, axis=1)
    grid = grid.at[0::step, half::step].set(noisy_mean(left))
    top = centres + jnp.roll(centres, 1, axis=1) + corners + jnp.roll(corners, -1, axis=0)
    grid = grid.at[half::step, 0::step].set(noisy_mean(top))
    step //= 2
    wibble /= decay
  grid = grid - grid.min()
  return grid / grid.max()


def fog_at(x: jax.Array, params: tuple[float, float], draws: list[jax.Array]) -> jax.Array:
  """`fog` from given draws: per `plasma_draw_shapes` entry an array `[B, *shape]` of U(-1, 1)."""
  strength, decay = params
  height, width = x.shape[1:3]
  size = plasma_size(height, width)
  maps = jax.vmap(lambda *d: plasma_fractal(size, decay, list(d)))(*draws)[:, :height, :width]
  image = x.astype(jnp.float32) / 255.0
  peak = image.max(axis=(1, 2, 3), keepdims=True)
  image = image + strength * maps[..., None]
  return image * peak / (peak + strength) * 255.0


def fog(x: jax.Array, params: tuple[float, float], key: jax.Array) -> jax.Array:
  """Fog: `params = (strength, decay)` (the reference's c)."""
  size = plasma_size(*x.shape[1:3])
  shapes = plasma_draw_shapes(size)
  keys = jax.random.split(key, len(shapes))
  draws = [jax.random.uniform(k, (x.shape[0], *shape), minval=-1.0, maxval=1.0)
           for k, shape in zip(keys, shapes)]
  return fog_at(x, params, draws)


# --- frost ------------------------------------------------------------------------------------

FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg",
               "frost6.jpg")


class Frost(NamedTuple):
  """One severity of `frost`: x' = image_weight x + frost_weight F. `scale` None: the texture is
  enlarged to cover the image, times 1.1 (ImageNet-C); else it is scaled by `scale`. Only the first
  `textures` photographs are drawn from."""
  image_weight: float
  frost_weight: float
  scale: float | None
  textures: int


def _frost_directory() -> str:
  # find_spec, not import: the reference package pulls in OpenCV, numba and scikit-image.
  spec = importlib.util.find_spec("imagecorruptions")
  if spec is None or not spec.submodule_search_locations:
    raise ValueError("frost needs the frost textures of the reference package: "
                     "pip install imagecorruptions-imaug")
  return os.path.join(list(spec.submodule_search_locations)[0], "frost")


def frost_problem() -> str | None:
  """None when frost's textures can be read, else the one-line reason (the extra to install):
  checked before an evaluation starts, rather than when it reaches frost."""
  try:
    _frost_directory()
  except ValueError as e:
    return str(e)
  return None


def _cubic_weights(offset: np.ndarray) -> np.ndarray:
  """OpenCV's bicubic weights (A = -0.75) of the 4 taps around fractional offsets `[n]`."""
  a = -0.75
  t = offset[:, None] + np.array([1.0, 0.0, -1.0, -2.0])
  t = np.abs(t)
  return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                  np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _cubic_resize(image: np.ndarray, out_h: int, out_w: int, scale_h: float,
                  scale_w: float) -> np.ndarray:
  """OpenCV's INTER_CUBIC resize of a uint8 `[H, W, 3]` image (source = (dst + 0.5) scale - 0.5,
  replicated border, rounded and saturated to uint8)."""
  out = image.astype(np.float64)
  for axis, (n_out, scale) in enumerate(((out_h, scale_h), (out_w, scale_w))):
    source = (np.arange(n_out) + 0.5) * scale - 0.5
    base = np.floor(source).astype(int)
    weights = _cubic_weights(source - base)
    taps = np.clip(base[:, None] + np.arange(-1, 3), 0, out.shape[axis] - 1)
    gathered = np.take(out, taps, axis=axis)        # [.., n_out, 4, ..]
    shape = [1] * gathered.ndim
    shape[axis], shape[axis + 1] = n_out, 4
    out = (gathered * weights.reshape(shape)).sum(axis=axis + 1)
  return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def frost_textures(height: int, width: int, scale: float | None,
                   textures: int) -> tuple[np.ndarray, np.ndarray]:
  """The resized textures, zero-padded into one uint8 stack `[T, h, w, 3]`, and their sizes."""
  from PIL import Image  # deferred: only frost reads image files
  directory = _frost_directory()
  resized = []
  for name in FROST_FILES[:textures]:
    with Image.open(os.path.join(directory, name)) as handle:
      texture = np.asarray(handle.convert("RGB"))
    tex_h, tex_w = texture.shape[:2]
    if scale is None:
      factor = 1.0
      if tex_h < height or tex_w < width:
        factor = max(height / tex_h if tex_h < height else 0.0,
                     width / tex_w if tex_w < width else 0.0)
      factor *= 1.1
      out_h, out_w = int(np.ceil(tex_h * factor)), int(np.ceil(tex_w * factor))
      scales = (tex_h / out_h, tex_w / out_w)
    else:
      out_h, out_w = int(round(tex_h * scale)), int(round(tex_w * scale))
      scales = (1.0 / scale, 1.0 / scale)
    if out_h <= height or out_w <= width:
      raise ValueError(f"frost: images of {height}x{width} are larger than the textures at this "
                       f"table's scale ({out_h}x{out_w}); use the imagenet table")
    resized.append(_cubic_resize(texture, out_h, out_w, *scales))
  sizes = np.array([t.shape[:2] for t in resized], np.int32)
  stack = np.zeros((len(resized), sizes[:, 0].max(), sizes[:, 1].max(), 3), np.uint8)
  for index, texture in enumerate(resized):
    stack[index, :texture.shape[0], :texture.shape[1]] = texture
  return stack, sizes


def frost_at(x: jax.Array, params: Frost, choice: jax.Array, corner: jax.Array) -> jax.Array:
  """`frost` from given draws: texture index `[B]` and crop corner `[B, 2]` (row, column)."""
  batch, height, width = x.shape[:3]
  stack, _ = frost_textures(height, width, params.scale, params.textures)
  textures, tex_h, tex_w = stack.shape[:3]
  # One gather of the B crops out of the flattened stack (no per-image copy of a texture).
  rows = corner[:, 0, None, None] + jnp.arange(height)[None, :, None]
  cols = corner[:, 1, None, None] + jnp.arange(width)[None, None, :]
  flat = (choice[:, None, None] * tex_h + rows) * tex_w + cols
  layer = jnp.take(jnp.asarray(stack.reshape(textures * tex_h * tex_w, 3)), flat, axis=0)
  return params.image_weight * x.astype(jnp.float32) + params.frost_weight * layer.astype(
      jnp.float32)


def frost(x: jax.Array, params: Frost, key: jax.Array) -> jax.Array:
  """Frost; raises a one-line ValueError when the reference package (the textures) is missing."""
  batch, height, width = x.shape[:3]
  _, sizes = frost_textures(height, width, params.scale, params.textures)
  choice_key, row_key, col_key = jax.random.split(key, 3)
  choice = jax.random.randint(choice_key, (batch,), 0, params.textures)
  room = jnp.asarray(sizes)[choice] - jnp.asarray([height, width])
  # numpy's randint(0, room) excludes `room`, as randint does here.
  rows = jax.random.randint(row_key, (batch,), 0, room[:, 0])
  cols = jax.random.randint(col_key, (batch,), 0, room[:, 1])
  return frost_at(x, params, choice, jnp.stack([rows, cols], axis=1))


# --- spatter ----------------------------------------------------------------------------------

def _shifted(image: jax.Array, dy: int, dx: int, mode: str) -> jax.Array:
  """image[r + dy, c + dx] with the border `mode` of jnp.pad (2-D `[H, W]`)."""
  padded = jnp.pad(image, 2, mode=mode) if mode != "constant" else jnp.pad(image, 2)
  height, width = image.shape
  return padded[2 + dy:2 + dy + height, 2 + dx:2 + dx + width]


def _box3(image: jax.Array) -> jax.Array:
  """OpenCV's `blur(., (3, 3))`: the 3 x 3 mean, border reflected without the edge (REFLECT_101)."""
  return sum(_shifted(image, dy, dx, "reflect") for dy in (-1, 0, 1) for dx in (-1, 0, 1)) / 9.0


def _canny(image: jax.Array, low: float = 50.0, high: float = 150.0) -> jax.Array:
  """OpenCV's Canny edges of a uint8-valued `[H, W]` image: 3 x 3 Sobel (replicated border), L1
  magnitude, non-maximum suppression along the gradient's quantised direction, hysteresis."""
  at = functools.partial(_shifted, image, mode="edge")
  gx = (at(-1, 1) + 2 * at(0, 1) + at(1, 1)) - (at(-1, -1) + 2 * at(0, -1) + at(1, -1))
  gy = (at(1, -1) + 2 * at(1, 0) + at(1, 1)) - (at(-1, -1) + 2 * at(-1, 0) + at(-1, 1))
  magnitude = jnp.abs(gx) + jnp.abs(gy)
  near = functools.partial(_shifted, magnitude, mode="constant")
  ax, ay = jnp.abs(gx), jnp.abs(gy)
  tan22, tan67 = np.tan(np.deg2rad(22.5)), np.tan(np.deg2rad(67.5))
  horizontal = ay < ax * tan22
  vertical = ay > ax * tan67
  same_sign = (gx * gy) >= 0
  keep_h = (magnitude > near(0, -1)) & (magnitude >= near(0, 1))
  keep_v = (magnitude > near(-1, 0)) & (magnitude >= near(1, 0))
  keep_d = jnp.where(same_sign, (magnitude > near(-1, -1)) & (magnitude > near(1, 1)),
                     (magnitude > near(-1, 1)) & (magnitude > near(1, -1)))
  maximum = jnp.where(horizontal, keep_h, jnp.where(vertical, keep_v, keep_d))
  candidate = maximum & (magnitude > low)
  strong = candidate & (magnitude > high)

  def grow(state):
    edges, _ = state
    reached = sum(_shifted(edges.astype(jnp.float32), dy, dx, "constant")
                  for dy in (-1, 0, 1) for dx in (-1, 0, 1)) > 0
    grown = candidate & reached
    return grown, jnp.any(grown != edges)

  edges, _ = jax.lax.while_loop(lambda state: state[1], grow, (strong, jnp.array(True)))
  return edges


# OpenCV's 5 x 5 chamfer mask for DIST_L2: a = 1, b = 1.4 (diagonal), c = 2.1969 (knight's move).
_CHAMFER = [(dy, dx, {1: 1.0, 2: 1.4, 5: 2.1969}[dy * dy + dx * dx])
            for dy in range(-2, 3) for dx in range(-2, 3) if dy * dy + dx * dx in (1, 2, 5)]


def _truncated_distance(edges: jax.Array, limit: float = 20.0) -> jax.Array:
  """min(chamfer distance to the nearest edge pixel, limit): 20 relaxations reach every
  distance up to 20, since each step of a path costs at least 1."""
  far = jnp.float32(1e6)
  height, width = edges.shape

  def relax(_, distance):
    padded = jnp.pad(distance, 2, constant_values=far)
    return functools.reduce(jnp.minimum, [
        padded[2 + dy:2 + dy + height, 2 + dx:2 + dx + width] + cost
        for dy, dx, cost in _CHAMFER] + [distance])

  distance = jax.lax.fori_loop(0, int(limit), relax, jnp.where(edges, 0.0, far))
  return jnp.minimum(distance, limit)


def _equalize(image: jax.Array) -> jax.Array:
  """OpenCV's equalizeHist of a uint8-valued image (LUT from the cumulative histogram, from the
  first occupied level, rounded)."""
  levels = jnp.arange(256, dtype=jnp.float32)
  counts = jnp.bincount(image.astype(jnp.int32).reshape(-1), length=256).astype(jnp.float32)
  total = jnp.float32(image.size)
  first = jnp.argmax(counts > 0)
  cumulative = jnp.cumsum(counts)
  scale = 255.0 / jnp.maximum(total - counts[first], 1.0)
  lut = jnp.where(levels > first, jnp.clip(jnp.round((cumulative - counts[first]) * scale), 0, 255),
                  0.0)
  lut = jnp.where(counts[first] == total, first.astype(jnp.float32), lut)
  return lut[image.astype(jnp.int32)]


_EMBOSS = ((-2, -1, 0), (-1, 1, 1), (0, 1, 2))


def _water_mask(liquid: jax.Array) -> jax.Array:
  """The reference's water layer m `[H, W]` (before its strength) from the thresholded liquid."""
  liquid_u8 = jnp.floor(jnp.clip(liquid * 255.0, 0.0, 255.0))
  edges = _canny(liquid_u8)
  distance = jnp.floor(_box3(_truncated_distance(edges)))
  distance = _equalize(distance)
  embossed = sum(weight * _shifted(distance, dy - 1, dx - 1, "reflect")
                 for dy, row in enumerate(_EMBOSS) for dx, weight in enumerate(row))
  embossed = jnp.clip(jnp.round(embossed), 0, 255)
  distance = jnp.round(_box3(embossed))
  mask = liquid_u8 * distance
  peak = mask.max()
  return jnp.where(peak > 0, mask / jnp.where(peak > 0, peak, 1.0), 0.0)


def spatter_at(x: jax.Array, params: tuple, noise: jax.Array) -> jax.Array:
  """`spatter` from given draws: `noise` `[B, H, W]` N(mu, s) (the unblurred liquid layer)."""
  _, _, sigma, threshold, strength, mode = params
  image = x.astype(jnp.float32) / 255.0
  liquid = gaussian_filter(noise.astype(jnp.float32), (sigma, sigma), axes=(1, 2))
  liquid = jnp.where(liquid < threshold, 0.0, liquid)
  if mode == 0:
    mask = jax.vmap(_water_mask)(liquid)[..., None] * strength
    colour = jnp.asarray([175.0, 238.0, 238.0], jnp.float32) / 255.0
    return jnp.clip(image + mask * colour, 0.0, 1.0) * 255.0
  mask = gaussian_filter((liquid > threshold).astype(jnp.float32), (strength, strength),
                         axes=(1, 2))
  mask = jnp.where(mask < 0.8, 0.0, mask)[..., None]
  colour = jnp.asarray([63.0, 42.0, 20.0], jnp.float32) / 255.0
  return (image * (1.0 - mask) + colour * mask) * 255.0


def spatter(x: jax.Array, params: tuple, key: jax.Array) -> jax.Array:
  """Spatter: `params = (mu, s, sigma, threshold, strength, mode)` (the reference's c)."""
  loc, scale = params[:2]
  noise = loc + scale * jax.random.normal(key, x.shape[:3])
  return spatter_at(x, params, noise)


CORRUPTIONS: dict[str, Corruption] = {"frost": frost, "fog": fog, "spatter": spatter}

PARAMETERS: dict[str, dict[str, tuple]] = {
    "imagenet": {
        "frost": tuple(Frost(a, b, None, 6) for a, b in (
            (1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75))),
        "fog": ((1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)),
        "spatter": ((0.65, 0.3, 4, 0.69, 0.6, 0), (0.65, 0.3, 3, 0.68, 0.6, 0),
                    (0.65, 0.3, 2, 0.68, 0.5, 0), (0.65, 0.3, 1, 0.65, 1.5, 1),
                    (0.67, 0.4, 1, 0.65, 1.5, 1)),
    },
    "cifar10": {
        # make_cifar_c.py draws from the first 5 textures (np.random.randint(5)).
        "frost": tuple(Frost(a, b, 0.2, 5) for a, b in (
            (1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))),
        "fog": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),
        "spatter": ((0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0),
                    (0.65, 0.3, 1, 0.69, 0.5, 0), (0.65, 0.1, 0.7, 0.69, 0.6, 1),
                    (0.65, 0.1, 0.5, 0.68, 0.6, 1)),
    },
    "tiny_imagenet": {
        "frost": tuple(Frost(a, b, 0.3, 5) for a, b in (
            (1, 0.3), (0.9, 0.4), (0.8, 0.45), (0.75, 0.5), (0.7, 0.55))),
        "fog": ((0.4, 3), (0.7, 3), (1, 2.5), (1.5, 2), (2, 1.75)),
        "spatter": ((0.62, 0.1, 0.7, 0.7, 0.6, 0), (0.65, 0.1, 0.8, 0.7, 0.6, 0),
                    (0.65, 0.3, 1, 0.69, 0.6, 0), (0.65, 0.1, 0.7, 0.68, 0.6, 1),
                    (0.65, 0.1, 0.5, 0.67, 0.6, 1)),
    },
}
