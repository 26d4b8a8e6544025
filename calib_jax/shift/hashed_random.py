"""Counter-based random numbers for the corruptions: a cheap integer hash of each value's index.

The noise corruptions draw one number per pixel and channel, millions per batch. On CPUs
`jax.random`'s generators are the bottleneck there: at 224 px, 16 images (2.4 M values),
`jax.random.normal` took ~200 ms with threefry2x32, and ~270-320 ms with the "rbg" and
"unsafe_rbg" implementations (XLA's RngBitGenerator), on the loaded 2-core VM of BENCHMARKS.md;
numpy's ziggurat takes ~110 ms for the same count there. The reference draws with numpy, so the
corruptions could not beat it by generating numbers with `jax.random`.

Here a value's bits are a hash of its counter instead, an elementwise function XLA fuses into the
corruption's one loop (~1-2 ms for the 2.4 M bits, ~10-20 ms with the normal transform):

    b = h(h(c XOR s0) + s1),   c = the value's index within its image,

with h Wellons' "lowbias32" integer hash (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
x *= 0x846ca68b; x ^= x >> 16; a bijection of uint32 with near-ideal avalanche) and (s0, s1) two
words drawn per image from the caller's key with `jax.random.bits`, so images and keys get
independent streams. Uniforms take the top 23 bits, U = (b >> 9 + 1/2) 2^-23 in (0, 1); normals
are sqrt(2) erfinv(2U - 1), the inverse-CDF transform `jax.random.normal` uses too, with Giles'
float32 erfinv written out (XLA's `erf_inv` took half of the time of a normal draw).

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


# Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing Gems, 2010):
# erfinv(x) = x p(w), w = -log(1 - x^2), p a degree-8 polynomial in w - 2.5 (w < 5) or in
# sqrt(w) - 3 (w >= 5). Highest degree first.
_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
            -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
         -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _polynomial(coefficients: tuple[float, ...], value: jax.Array) -> jax.Array:
  total = jnp.full_like(value, coefficients[0])
  for coefficient in coefficients[1:]:
    total = total * value + np.float32(coefficient)
  return total


def erfinv(x: jax.Array) -> jax.Array:
  """Giles' float32 erfinv of `x` in (-1, 1), written out in jnp: on CPUs half the time of
  `lax.erf_inv` (which dominated the normal draws), and within 2e-5 of it on (-1, 1)."""
  w = -jnp.log((1.0 - x) * (1.0 + x))
  central = _polynomial(_CENTRAL, w - 2.5)
  tail = _polynomial(_TAIL, jnp.sqrt(w) - 3.0)
  return jnp.where(w < 5.0, central, tail) * x


def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """float32 standard normals (inverse CDF of `uniform`, |z| < 5.3)."""
  return np.float32(np.sqrt(2.0)) * erfinv(2.0 * uniform(key, shape) - 1.0)
