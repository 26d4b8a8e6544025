"""Noise corruptions (Hendrycks & Dietterich, ICLR 2019), batched and jit-able.

With `u = x / 255` the image on [0, 1] and one independent draw per pixel and channel:

* `gaussian_noise`: u + N(0, c^2)
* `shot_noise`:     Poisson(c u) / c (inverse-CDF draws from a table of the 256 grey levels)
* `impulse_noise`:  scikit-image's salt & pepper: each value is replaced with probability c, by 1
  (salt) or 0 (pepper) with probability 1/2 each
* `speckle_noise`:  u + u N(0, c^2)

Every function takes `x` float32 `[B, H, W, 3]` on the 0..255 scale, the table entry `c` of one
severity (a static Python float) and a PRNG key; it returns the unclipped float32 result on the
0..255 scale (the caller clips and truncates to uint8). The draws come from `hashed_random`
(a counter hash: on CPUs ~10x faster than `jax.random`'s generators, see there).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.shift import hashed_random

Corruption = Callable[[jax.Array, Any, jax.Array], jax.Array]


def gaussian_noise(x: jax.Array, scale: float, key: jax.Array) -> jax.Array:
  """Additive Gaussian noise of standard deviation `scale` (on the [0, 1] scale)."""
  unit = x / 255.0
  return (unit + scale * hashed_random.normal(key, x.shape)) * 255.0


def poisson_cdf_table(photons: float) -> np.ndarray:
  """CDF of Poisson(photons * level / 255) for the 256 grey levels: float32 `[256, K]`.

  K covers the mean plus 12 standard deviations (the tail beyond is < 1e-30); the last column is
  set to 1, so every draw lands in the table. Built in float64 with numpy at trace time.
  """
  rates = np.arange(256, dtype=np.float64) / 255.0 * photons
  size = int(photons + 12.0 * np.sqrt(photons) + 20.0)
  counts = np.arange(size, dtype=np.float64)
  log_factorials = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1.0, size)))])
  with np.errstate(divide="ignore", invalid="ignore"):
    log_pmf = -rates[:, None] + counts[None] * np.log(rates)[:, None] - log_factorials[None]
  pmf = np.exp(log_pmf)
  pmf[0] = 0.0
  pmf[0, 0] = 1.0  # rate 0: always 0 photons
  cdf = np.cumsum(pmf, axis=1)
  cdf[:, -1] = 1.0
  return cdf.astype(np.float32)


def shot_noise(x: jax.Array, photons: float, key: jax.Array) -> jax.Array:
  """Poisson (shot) noise with `photons` expected counts at full intensity.

  Since `x` holds the 256 grey levels (it is rounded to them), each value is drawn by inverting
  its level's Poisson CDF at a uniform draw: count = min{k : F(k) > U}, found by binary search in
  a table of the 256 CDFs. Exact up to the float32 rounding of F and U, and much faster than
  `jax.random.poisson`'s rejection loops on CPUs.
  """
  table = poisson_cdf_table(photons)
  size = table.shape[1]
  flat = jnp.asarray(table.reshape(-1))
  levels = jnp.clip(jnp.round(x), 0, 255).astype(jnp.int32) * size
  uniform = hashed_random.uniform(key, x.shape)

  def halve(_, bounds):
    low, high = bounds
    middle = (low + high) // 2
    right = flat[levels + middle] <= uniform
    return jnp.where(right, middle + 1, low), jnp.where(right, high, middle)

  steps = int(np.ceil(np.log2(size))) + 1
  low = jnp.zeros(x.shape, jnp.int32)
  counts, _ = jax.lax.fori_loop(0, steps, halve, (low, jnp.full(x.shape, size - 1, jnp.int32)))
  return counts.astype(jnp.float32) / photons * 255.0


def impulse_noise(x: jax.Array, amount: float, key: jax.Array) -> jax.Array:
  """Salt & pepper noise: a fraction `amount` of the values set to 0 or 255 with equal odds.

  One uniform draw U per value: salt where U < amount / 2, pepper where amount / 2 <= U < amount
  (the same law as scikit-image's two Bernoulli draws, at half the random bits).
  """
  uniform = hashed_random.uniform(key, x.shape)
  return jnp.where(uniform < amount, jnp.where(uniform < amount / 2.0, 255.0, 0.0), x)


def speckle_noise(x: jax.Array, scale: float, key: jax.Array) -> jax.Array:
  """Multiplicative Gaussian noise u (1 + N(0, scale^2))."""
  unit = x / 255.0
  return (unit + unit * scale * hashed_random.normal(key, x.shape)) * 255.0


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "speckle_noise": speckle_noise,
}

# ImageNet-C's entries are imagecorruptions' (applied to any image size); CIFAR-10-C's and
# Tiny-ImageNet-C's are those of Hendrycks' make_cifar_c.py and make_tinyimagenet_c.py.
PARAMETERS: dict[str, dict[str, tuple]] = {
    "imagenet": {
        "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
        "shot_noise": (60, 25, 12, 5, 3),
        "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
        "speckle_noise": (0.15, 0.2, 0.35, 0.45, 0.6),
    },
    "cifar10": {
        "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
        "shot_noise": (500, 250, 100, 75, 50),
        "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
        "speckle_noise": (0.06, 0.1, 0.12, 0.16, 0.2),
    },
    "tiny_imagenet": {
        "gaussian_noise": (0.04, 0.08, 0.12, 0.15, 0.18),
        "shot_noise": (250, 100, 50, 30, 15),
        "impulse_noise": (0.01, 0.02, 0.05, 0.08, 0.14),
        "speckle_noise": (0.15, 0.2, 0.25, 0.3, 0.35),
    },
}
