"""`corrupt`: Hendrycks & Dietterich's image corruptions (ICLR 2019) on uint8 image batches.

The family modules (noise, blur, digital, motion, geometric, weather) each export
`CORRUPTIONS` (name -> fn(x, params, key), x float32 `[B, H, W, 3]` on 0..255, unclipped float32
out), `PARAMETERS` (table -> name -> the 5 per-severity entries) and, where some run on the host,
`HOST_CORRUPTIONS`. This module merges them and wraps one corruption at one severity as a jitted
program: uint8 in, float32 on 0..255, the corruption, clip to [0, 255], truncate to uint8 (as the
reference's `np.uint8(clip(.))`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from calib_jax.shift import blur, digital, geometric, motion, noise, weather

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]
_FAMILIES = (noise, blur, geometric, motion, weather, digital)

# The order of imagecorruptions' `corruption_tuple`: the 15 benchmark corruptions of ImageNet-C,
# then the 4 held-out validation ones.
BENCHMARK_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression")
VALIDATION_CORRUPTIONS: tuple[str, ...] = (
    "speckle_noise", "gaussian_blur", "spatter", "saturate")
TABLES: tuple[str, ...] = ("imagenet", "cifar10", "tiny_imagenet")
# `key=None` means jax.random.key(DEFAULT_SEED): the same corrupted images on every call.
DEFAULT_SEED = 0

CORRUPTIONS: dict[str, Corruption] = {}
PARAMETERS: dict[str, dict[str, tuple]] = {table: {} for table in TABLES}
HOST_CORRUPTIONS: set[str] = set()
for _family in _FAMILIES:
  CORRUPTIONS.update(_family.CORRUPTIONS)
  for _table in TABLES:
    PARAMETERS[_table].update(_family.PARAMETERS[_table])
  HOST_CORRUPTIONS.update(getattr(_family, "HOST_CORRUPTIONS", set()))


def corruption_names() -> list[str]:
  """The available corruptions: the 15 benchmark ones, then the 4 validation ones."""
  return [name for name in BENCHMARK_CORRUPTIONS + VALIDATION_CORRUPTIONS
          if name in CORRUPTIONS]


def requirement_problems(corruptions: Sequence[str]) -> list[str]:
  """One line for each of `corruptions` this installation cannot run (frost without the
  reference package's textures); [] when all can run."""
  problem = weather.frost_problem() if "frost" in corruptions else None
  return [] if problem is None else [problem]


def table_names() -> list[str]:
  """The parameter tables: "imagenet" (ImageNet-C), "cifar10" (CIFAR-10-C), "tiny_imagenet"."""
  return list(TABLES)


@functools.lru_cache(maxsize=None)
def _program(corruption: str, severity: int, table: str) -> Callable:
  fn = CORRUPTIONS[corruption]
  params = PARAMETERS[table][corruption][severity - 1]

  def run(images: jax.Array, key: jax.Array) -> jax.Array:
    height, width, channels = images.shape[-3:]
    x = images.reshape((-1, height, width, channels)).astype(jnp.float32)
    if channels == 1:
      x = jnp.broadcast_to(x, (*x.shape[:3], 3))
    out = jnp.clip(fn(x, params, key), 0.0, 255.0)
    if channels == 1:
      # The first channel, as the reference's `saturate` returns grey images: its law is that
      # of one channel of the reference's output (a mean of three would shrink the noise).
      out = out[..., :1]
    return out.astype(jnp.uint8).reshape(images.shape)

  return jax.jit(run)


def corrupt(images: jax.Array, corruption: str, severity: int, *,
            key: jax.Array | None = None, table: str | None = None) -> jax.Array:
  """Applies `corruption` at `severity` (1..5) to uint8 `images` `[..., H, W, 3 or 1]`.

  Args:
    images: uint8 array `[..., H, W, C]`, C = 3 (RGB) or 1 (grey: corrupted as 3 equal channels,
      the first of which is returned); any leading batch dimensions.
    corruption: one of `corruption_names()`.
    severity: 1..5.
    key: PRNG key of the random corruptions (one independent draw per image); None means
      `jax.random.key(DEFAULT_SEED)` (DEFAULT_SEED = 0), so repeated calls give the same images.
    table: the parameters: "imagenet" (default; imagecorruptions' ImageNet-C values, any size),
      "cifar10" (Hendrycks' make_cifar_c.py) or "tiny_imagenet" (make_tinyimagenet_c.py).

  Returns:
    uint8 array of the shape of `images`: the corrupted float result clipped to [0, 255] and
    truncated. Compiled once per (corruption, severity, table, shape); `jpeg_compression` runs on
    the host through `jax.pure_callback` (see `HOST_CORRUPTIONS`).
  """
  if corruption not in CORRUPTIONS:
    raise ValueError(f"unknown corruption {corruption!r}; choose one of "
                     f"{', '.join(corruption_names())}")
  if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
    raise ValueError(f"severity must be an integer in 1..5; got {severity!r}")
  table = "imagenet" if table is None else table
  if table not in TABLES:
    raise ValueError(f"unknown table {table!r}; choose one of {', '.join(TABLES)}")
  dtype = getattr(images, "dtype", None)
  shape = getattr(images, "shape", ())
  if dtype != jnp.uint8:
    raise ValueError(f"images must be uint8 [..., H, W, 3 or 1]; got dtype {dtype}")
  if len(shape) < 3 or shape[-1] not in (1, 3):
    raise ValueError(f"images must be uint8 [..., H, W, 3 or 1]; got shape {tuple(shape)}")
  if key is None:
    key = jax.random.key(DEFAULT_SEED)
  return _program(corruption, int(severity), table)(images, key)
