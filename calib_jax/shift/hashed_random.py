"""Counter-based random numbers for the corruptions: a cheap integer hash of each value's index.

The noise corruptions draw one number per pixel and channel, millions per batch. On CPUs
`jax.random`'s generators are the bottleneck there: at 224 px, 16 images (2.4 M values),
`jax.random.normal` took ~200 ms with threefry2x32, and ~270-320 ms with the "rbg" and
"unsafe_rbg" implementations (XLA's RngBitGenerator), on the loaded 2-core VM of BENCHMARKS.md;
numpy's ziggurat takes ~110 ms for the same count there. The reference draws with numpy, so the
corruptions could not beat it by generating numbers with `jax.random`.

Here a value's bits are a hash of its counter instead, an elementwise function XLA fuses into the
corruption's one loop (~1-2 ms for the 2.4 M bits, ~20 ms with the normal transform):

    b = h(h(c XOR s0) + s1),   c = the value's index within its image,

with h Wellons' "lowbias32" integer hash (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
x *= 0x846ca68b; x ^= x >> 16; a bijection of uint32 with near-ideal avalanche) and (s0, s1) two
words drawn per image from the caller's key with `jax.random.bits`, so images and keys get
independent streams. Uniforms take the top 23 bits, U = (b >> 9 + 1/2) 2^-23 in (0, 1); normals
are sqrt(2) erfinv(2U - 1), the inverse-CDF transform `jax.random.normal` uses too.

This is a statistical generator, not a cryptographic one: it is enough for image noise (tests
check its moments, uniformity and neighbour correlations), not for anything that needs
unpredictability. An image holds at most 2^32 values (the counter's range).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np


def lowbias32(value: jax.Array) -> jax.Array:
  """Wellons' lowbias32 hash of uint32 `value` (a bijection of uint32)."""
  value = value ^ (value >> 16)
  value = value * jnp.uint32(0x7FEB352D)
  value = value ^ (value >> 15)
  value = value * jnp.uint32(0x846CA68B)
  return value ^ (value >> 16)


def bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """uint32 random bits of `shape` `[B, ...]`: an independent stream per leading index."""
  per_image = int(np.prod(shape[1:], dtype=np.int64))
  if per_image > 2 ** 32:
    raise ValueError(f"hashed_random draws at most 2^32 values per image; got {per_image}")
  seeds = jax.random.bits(key, (shape[0], 2), jnp.uint32)
  seed_shape = (shape[0],) + (1,) * (len(shape) - 1)
  counter = jnp.zeros(shape, jnp.uint32)
  for axis in range(1, len(shape)):  # the row-major index within one image
    counter = counter * jnp.uint32(shape[axis]) + lax.broadcasted_iota(jnp.uint32, shape, axis)
  first = lowbias32(counter ^ seeds[:, 0].reshape(seed_shape))
  return lowbias32(first + seeds[:, 1].reshape(seed_shape))


def uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """float32 uniforms on the open interval (0, 1), 2^23 equally spaced values."""
  return ((bits(key, shape) >> 9).astype(jnp.float32) + 0.5) * np.float32(2.0 ** -23)


def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """float32 standard normals (inverse CDF of `uniform`; |z| < 5.3)."""
  return np.float32(np.sqrt(2.0)) * lax.erf_inv(2.0 * uniform(key, shape) - 1.0)
