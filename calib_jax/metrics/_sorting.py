"""Order-preserving integer keys for scores, and sorting them with a payload bit.

`numpy_sort_with_bit` is the CPU path (numpy's SIMD sort of one packed integer);
`lax_sorted_ties` the XLA path (accelerators, and short rows on CPU), which returns the bit
counts per tie group and the tie-group extents. The metrics
reach them through `_ranking`.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_SIGN = np.uint32(0x80000000)


class SortedTies(NamedTuple):
  """Keys sorted ascending, the bit counts at each key and the tie-group extents."""
  keys: jax.Array       # uint32 [N], ascending
  bits_upto: jax.Array  # int32 [N], set bits among the keys <= keys[i]
  bits_below: jax.Array  # int32 [N], set bits among the keys < keys[i]
  first: jax.Array      # int32 [N], index of the first key equal to keys[i]
  last: jax.Array       # int32 [N], index of the last key equal to keys[i]


def monotone_key(scores: jax.Array) -> jax.Array:
  """Maps float32 scores to uint32 keys with the same order (−0.0 and +0.0 map together)."""
  scores = jnp.where(scores == 0, jnp.zeros_like(scores), scores)
  bits = lax.bitcast_convert_type(scores, jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | _SIGN)


def numpy_key_to_score(key: np.ndarray) -> np.ndarray:
  """numpy version of `key_to_score`."""
  key = np.asarray(key, np.uint32)
  positive = (key >> np.uint32(31)) == 1
  bits = np.where(positive, key & np.uint32(0x7FFFFFFF), ~key)
  return bits.view(np.float32)


def key_to_score(key: jax.Array) -> jax.Array:
  """Inverse of `monotone_key`."""
  positive = (key >> 31) == 1
  bits = jnp.where(positive, key & np.uint32(0x7FFFFFFF), ~key)
  return lax.bitcast_convert_type(bits, jnp.float32)


def numpy_sort_with_bit(key: np.ndarray, bit: np.ndarray):
  """Sorts 1-D uint32 `key` ascending carrying a 0/1 `bit` (ties: bit 0 first).

  Key and bit are packed into one integer and sorted once; returns `(keys, bits int32)`.
  """
  key = np.asarray(key, np.uint32).reshape(-1)
  bit = np.asarray(bit, np.uint8).reshape(-1)
  lo = key.min()
  if key.max() - lo < np.uint32(1 << 31):
    # Offset keys fit in 31 bits, so key and bit pack into uint32 (3x faster than uint64).
    # In place on the one new array: at N = 1e6 each extra temporary costs ~1 ms.
    packed = np.subtract(key, lo)
    np.left_shift(packed, np.uint32(1), out=packed)
    np.bitwise_or(packed, bit, out=packed)
    packed.sort()
    bits = (packed & np.uint32(1)).view(np.int32)     # 0 or 1: the same bits in int32
    np.right_shift(packed, np.uint32(1), out=packed)
    np.add(packed, lo, out=packed)
    return packed, bits
  packed = np.sort((key.astype(np.uint64) << np.uint64(1)) | bit.astype(np.uint64))
  return (packed >> np.uint64(1)).astype(np.uint32), (packed & np.uint64(1)).astype(np.int32)


# Rows up to this length take `cumsum_small` (a loop), not `jnp.cumsum`.
_SMALL_SCAN_MAX_N = 1 << 14


def cumsum_small(x: jax.Array) -> jax.Array:
  """Inclusive cumulative sum of a 1-D int32 array, for short rows.

  `jnp.cumsum` and `lax.cummax` on CPU lower to an unrolled associative scan that takes XLA
  ~0.3 s to compile per call site (a rank metric had six: 2-6 s a program loaded, more than
  the numpy callback path's whole program). A loop over the entries compiles like one
  operation and runs ~16 µs at n = 540 on XLA:CPU (the scan: ~230 µs). Longer rows, and
  accelerators (where a loop step is a kernel launch), use `jnp.cumsum`.
  """
  x = x.astype(jnp.int32)
  n = x.shape[-1]
  if n > _SMALL_SCAN_MAX_N:
    return jnp.cumsum(x, dtype=jnp.int32)
  return lax.platform_dependent(
      x, cpu=lambda x: lax.fori_loop(1, n, lambda i, c: c.at[i].add(c[i - 1]), x),
      default=lambda x: jnp.cumsum(x, dtype=jnp.int32))


def lax_sorted_ties(key: jax.Array, bit: jax.Array) -> SortedTies:
  """The XLA path of the rank statistics (also used to test the numpy path).

  One sort of the keys carrying the bits (order among equal keys arbitrary: every statistic
  the metrics need is a count per tie group), running counts by `cumsum_small`, and each
  entry's tie group from the group starts: no scan primitives, so the program compiles fast.
  """
  keys, bits = lax.sort((key, bit.astype(jnp.int32)), dimension=-1, is_stable=False,
                        num_keys=1)
  n = keys.shape[-1]
  starts = jnp.concatenate([jnp.ones(1, bool), keys[1:] != keys[:-1]])
  group = cumsum_small(starts.astype(jnp.int32)) - 1          # tie group of each entry
  sizes = jax.ops.segment_sum(jnp.ones(n, jnp.int32), group, n)
  group_start = cumsum_small(sizes) - sizes
  first = group_start[group]
  last = first + sizes[group] - 1
  cum = cumsum_small(bits)
  bits_upto = cum[last]
  bits_below = jnp.where(first > 0, cum[jnp.maximum(first - 1, 0)], 0)
  return SortedTies(keys, bits_upto, bits_below, first, last)
