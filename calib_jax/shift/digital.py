"""Digital corruptions (Hendrycks & Dietterich, ICLR 2019), batched and jit-able.

With `u = x / 255` the image on [0, 1]:

* `brightness`, c: in scikit-image's HSV space, V <- clip(V + c, 0, 1).
* `saturate`, (a, b): in HSV space, S <- clip(a S + b, 0, 1).
* `contrast`, c: u <- (u - m) c + m, m the per-image, per-channel mean over the pixels.
* `pixelate`, (f, up): Pillow's BOX resize to `(int(W f), int(H f))`, then back to `(W, H)` with
  NEAREST (`up="nearest"`, imagecorruptions) or BOX (`up="box"`, Hendrycks' CIFAR-10-C and
  Tiny-ImageNet-C scripts). Each resize pass is Pillow's: horizontal then vertical, each rounded
  to uint8.
* `jpeg_compression`, q: a round trip through Pillow's JPEG codec at quality q. It runs on the
  host through `jax.pure_callback`, so it can still be called under jit (listed in
  `HOST_CORRUPTIONS`).

The HSV conversions follow scikit-image's `rgb2hsv` / `hsv2rgb` (hue 0 where max = min; where two
channels tie for the maximum, blue wins over green over red).

Every function takes `x` float32 `[B, H, W, 3]` on the 0..255 scale, the table entry of one
severity (a static Python constant) and a PRNG key (unused: all are deterministic); it returns the
unclipped float32 result on the 0..255 scale.
"""
from __future__ import annotations

import concurrent.futures
import io
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]
_EXACT = jax.lax.Precision.HIGHEST


def rgb_to_hsv(rgb: jax.Array) -> jax.Array:
  """scikit-image's `rgb2hsv` for `rgb` `[..., 3]` on [0, 1]; H, S, V on [0, 1]."""
  red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]
  value = jnp.max(rgb, axis=-1)
  delta = value - jnp.min(rgb, axis=-1)
  flat = delta == 0.0
  safe_delta = jnp.where(flat, 1.0, delta)
  saturation = jnp.where(flat, 0.0, delta / jnp.where(value == 0.0, 1.0, value))
  hue = (green - blue) / safe_delta
  hue = jnp.where(green == value, 2.0 + (blue - red) / safe_delta, hue)
  hue = jnp.where(blue == value, 4.0 + (red - green) / safe_delta, hue)
  hue = jnp.where(flat, 0.0, jnp.mod(hue / 6.0, 1.0))
  return jnp.stack([hue, saturation, value], axis=-1)


def hsv_to_rgb(hsv: jax.Array) -> jax.Array:
  """scikit-image's `hsv2rgb`: the inverse of `rgb_to_hsv`."""
  hue, saturation, value = hsv[..., 0], hsv[..., 1], hsv[..., 2]
  sector = jnp.floor(hue * 6.0)
  frac = hue * 6.0 - sector
  p = value * (1.0 - saturation)
  q = value * (1.0 - frac * saturation)
  t = value * (1.0 - (1.0 - frac) * saturation)
  sector = jnp.mod(sector.astype(jnp.int32), 6)[..., None]
  choices = jnp.stack([
      jnp.stack([value, t, p], -1), jnp.stack([q, value, p], -1), jnp.stack([p, value, t], -1),
      jnp.stack([p, q, value], -1), jnp.stack([t, p, value], -1), jnp.stack([value, p, q], -1)])
  return jnp.take_along_axis(jnp.moveaxis(choices, 0, -1), sector[..., None], axis=-1)[..., 0]


def brightness(x: jax.Array, shift: float, key: jax.Array) -> jax.Array:
  """Adds `shift` to the HSV value channel."""
  del key  # deterministic
  hsv = rgb_to_hsv(x / 255.0)
  hsv = hsv.at[..., 2].set(jnp.clip(hsv[..., 2] + shift, 0.0, 1.0))
  return hsv_to_rgb(hsv) * 255.0


def saturate(x: jax.Array, params: tuple[float, float], key: jax.Array) -> jax.Array:
  """Scales and shifts the HSV saturation channel: S <- clip(a S + b, 0, 1)."""
  del key  # deterministic
  scale, offset = params
  hsv = rgb_to_hsv(x / 255.0)
  hsv = hsv.at[..., 1].set(jnp.clip(hsv[..., 1] * scale + offset, 0.0, 1.0))
  return hsv_to_rgb(hsv) * 255.0


def contrast(x: jax.Array, factor: float, key: jax.Array) -> jax.Array:
  """Shrinks every image towards its per-channel mean by `factor`."""
  del key  # deterministic
  unit = x / 255.0
  means = jnp.mean(unit, axis=(1, 2), keepdims=True)
  return ((unit - means) * factor + means) * 255.0


def pillow_box_matrix(in_size: int, out_size: int) -> np.ndarray:
  """The `[out, in]` weights of Pillow's BOX resampling along one axis.

  Output pixel o has centre c = (o + 1/2) in / out; with the support s = max(in / out, 1) / 2 it
  averages the input pixels i in [int(c - s + 1/2), int(c + s + 1/2)) whose offset
  (i - c + 1/2) / max(in / out, 1) lies in (-1/2, 1/2].
  """
  scale = in_size / out_size
  filter_scale = max(scale, 1.0)
  support = 0.5 * filter_scale
  matrix = np.zeros((out_size, in_size))
  for out in range(out_size):
    centre = (out + 0.5) * scale
    first = max(int(centre - support + 0.5), 0)
    last = min(int(centre + support + 0.5), in_size)
    for i in range(first, last):
      offset = (i - centre + 0.5) / filter_scale
      matrix[out, i] = 1.0 if -0.5 < offset <= 0.5 else 0.0
    total = matrix[out].sum()
    if total:
      matrix[out] /= total
  return matrix


def pillow_nearest_index(in_size: int, out_size: int) -> np.ndarray:
  """The input pixel Pillow's NEAREST resize reads for each output pixel: int((o + 1/2) in / out)."""
  return np.minimum(((np.arange(out_size) + 0.5) * (in_size / out_size)).astype(int), in_size - 1)


def _round_uint8(values: jax.Array) -> jax.Array:
  return jnp.clip(jnp.floor(values + 0.5), 0.0, 255.0)


def pillow_resize(planes: jax.Array, height: int, width: int, method: str) -> jax.Array:
  """Pillow's `resize((width, height), BOX or NEAREST)` of uint8-valued channel planes
  `[B, C, H, W]` (planes, so the products and gathers run along the wide last axes)."""
  in_height, in_width = planes.shape[2:]
  if method == "nearest":
    planes = jnp.take(planes, jnp.asarray(pillow_nearest_index(in_height, height)), axis=2)
    return jnp.take(planes, jnp.asarray(pillow_nearest_index(in_width, width)), axis=3)
  if width != in_width:  # Pillow's horizontal pass first, stored as uint8
    columns = jnp.asarray(pillow_box_matrix(in_width, width).T, jnp.float32)
    planes = _round_uint8(jnp.einsum("bchw,wo->bcho", planes, columns, precision=_EXACT))
  if height != in_height:
    rows = jnp.asarray(pillow_box_matrix(in_height, height), jnp.float32)
    planes = _round_uint8(jnp.einsum("oh,bchw->bcow", rows, planes, precision=_EXACT))
  return planes


def pixelate(x: jax.Array, params: tuple[float, str], key: jax.Array) -> jax.Array:
  """BOX-downsamples by `factor` and upsamples back with `up` ("nearest" or "box")."""
  del key  # deterministic
  factor, up = params
  height, width = x.shape[1:3]
  planes = jnp.transpose(x, (0, 3, 1, 2))
  small = pillow_resize(planes, int(height * factor), int(width * factor), "box")
  return jnp.transpose(pillow_resize(small, height, width, up), (0, 2, 3, 1))


def _jpeg_one(image: np.ndarray, quality: int) -> np.ndarray:
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, "JPEG", quality=quality)
  return np.asarray(Image.open(buffer).convert("RGB"))


def _jpeg_round_trip(images: np.ndarray, quality: int) -> np.ndarray:
  """Pillow's JPEG round trip of each uint8 image `[B, H, W, 3]`, on a thread pool (Pillow's
  codec releases the GIL, so the images of a batch are coded in parallel)."""
  with concurrent.futures.ThreadPoolExecutor(min(len(images), os.cpu_count() or 1)) as pool:
    return np.stack(list(pool.map(lambda image: _jpeg_one(image, int(quality)), images)))


def jpeg_compression(x: jax.Array, quality: int, key: jax.Array) -> jax.Array:
  """JPEG encode/decode at `quality` with Pillow, on the host (`jax.pure_callback`; uint8 both
  ways, a quarter of float32's transfer)."""
  del key  # deterministic
  pixels = jnp.clip(jnp.round(x), 0, 255).astype(jnp.uint8)
  coded = jax.pure_callback(lambda images: _jpeg_round_trip(np.asarray(images), quality),
                            jax.ShapeDtypeStruct(x.shape, jnp.uint8), pixels,
                            vmap_method="sequential")
  return coded.astype(jnp.float32)


CORRUPTIONS: dict[str, Corruption] = {
    "brightness": brightness,
    "contrast": contrast,
    "pixelate": pixelate,
    "jpeg_compression": jpeg_compression,
    "saturate": saturate,
}
HOST_CORRUPTIONS: set[str] = {"jpeg_compression"}

# ImageNet-C's entries are imagecorruptions' (applied to any image size); CIFAR-10-C's and
# Tiny-ImageNet-C's are those of Hendrycks' make_cifar_c.py and make_tinyimagenet_c.py (whose
# pixelate upsamples with BOX where imagecorruptions uses NEAREST).
PARAMETERS: dict[str, dict[str, tuple]] = {
    "imagenet": {
        "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
        "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
        "pixelate": tuple((f, "nearest") for f in (0.6, 0.5, 0.4, 0.3, 0.25)),
        "jpeg_compression": (25, 18, 15, 10, 7),
        "saturate": ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)),
    },
    "cifar10": {
        "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
        "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
        "pixelate": tuple((f, "box") for f in (0.95, 0.9, 0.85, 0.75, 0.65)),
        "jpeg_compression": (80, 65, 58, 50, 40),
        "saturate": ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)),
    },
    "tiny_imagenet": {
        "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
        "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
        "pixelate": tuple((f, "box") for f in (0.9, 0.8, 0.7, 0.6, 0.5)),
        "jpeg_compression": (65, 58, 50, 40, 25),
        "saturate": ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (30, 0.2)),
    },
}
