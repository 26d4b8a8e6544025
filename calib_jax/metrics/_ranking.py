"""Rank statistics behind AURC-type metrics and AECE, on every backend.

Both need the samples sorted by score with their error/correct bit, and the tie groups (runs
of equal scores). Two paths give the same values (tested, ties included):

* `lax.sort` and binary-free counts (`_sorting.lax_sorted_ties`): on GPU/TPU always, and on
  CPU for rows of at most `XLA_SORT_MAX_N` samples once `use_cacheable_cpu_sorts(True)` was
  called (eval.py's and train.py's `compilation_cache.enable` does, with the persistent
  compilation cache it switches on). A program holding only XLA operations is kept in that
  cache, so a report on a small split compiles these once per machine rather than once per
  process. It is opt-in, not tied to `jax_compilation_cache_dir` alone: the first process pays
  2–4x the compile time, which a program that compiles many shapes once each (a test run, a
  study) never earns back.
* numpy through `jax.pure_callback` on CPU otherwise: the data already lives in host memory,
  numpy's SIMD sort of a packed key is 10–30x faster there than XLA:CPU's sort at
  N = 1e4–1e6, and only the small results come back. The callback embeds a per-process
  pointer, so its programs are never found in the persistent cache; but they compile 2–4x
  faster than the XLA path's (0.3–1.2 s against 1.2–2.4 s per metric, loaded), so without a
  cache they are the cheaper choice at any n.

Keys are uint32 from `_sorting.monotone_key`; key 0 marks a masked-out entry.
`ranked_and_groups` gives AECE's groups and the tie-aware errors of the same confidences from
one sort (`metrics.rank_summary`).
"""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax.metrics import _segments
from calib_jax.metrics import _sorting

# Rows up to this length are ranked by XLA on CPU as well. Paired times on XLA:CPU (2 cores
# shared, load 10-11), per row: one call at N = 540 / 2048 / 8192 XLA 0.16 / 0.30 / 3.1 ms
# against the numpy callback's 0.24 / 0.31 / 0.31 ms; vmapped (a bootstrap's resamples)
# 0.25 / 0.98 / 3.7 ms against 0.08 / 0.16 / 0.47 ms. Up to here a 1,000-resample bootstrap
# pays at most ~0.8 s for a program that a second process then finds in the cache.
XLA_SORT_MAX_N = 1 << 11


# `use_cacheable_cpu_sorts`'s setting, read at trace time. An environment variable, so that
# calib_jax.cli.compilation_cache can switch it on without importing JAX (its programs set
# TF_CPP_MIN_LOG_LEVEL before JAX or TensorFlow load) and the programs it starts inherit it.
CACHEABLE_SORTS_ENV = "CALIB_JAX_CACHEABLE_SORTS"


def use_cacheable_cpu_sorts(enabled: bool) -> None:
  """Ranks rows of at most `XLA_SORT_MAX_N` samples by XLA on CPU too (`enabled`), so the rank
  metrics' programs can be kept in JAX's persistent compilation cache, or by the numpy
  callback (the default: faster to compile, never cached). Programs already traced keep the
  path they were traced with."""
  if enabled:
    os.environ[CACHEABLE_SORTS_ENV] = "1"
  else:
    os.environ.pop(CACHEABLE_SORTS_ENV, None)


def xla_sorts_on_cpu(n: int) -> bool:
  """Whether rows of n samples are ranked by XLA on CPU (see the module docstring): short
  rows once `use_cacheable_cpu_sorts(True)` was called."""
  return n <= XLA_SORT_MAX_N and os.environ.get(CACHEABLE_SORTS_ENV) == "1"


def _ranked_by(lax_fn, callback_fn, key: jax.Array, bit: jax.Array):
  """`lax_fn(key, bit)` where XLA sorts (accelerators, and short rows on CPU when
  `xla_sorts_on_cpu`), else `callback_fn(key, bit)` (the host sort) on CPU."""
  if xla_sorts_on_cpu(key.shape[-1]):
    return lax_fn(key, bit)
  return lax.platform_dependent(key, bit, cpu=callback_fn, default=lax_fn)


# ------------------------------------------------------------------ tie-aware errors
_EXACT_TIE_MAX = 46340  # largest tie group whose `taken · group_errors` (≤ size²) fits int32


def spread_tie_errors(above, taken, group_errors, size, xp, divmod_fn=None):
  """`above + taken · group_errors / size`: the errors among a tie group's first `taken`
  members (in descending order) with the group's `group_errors` spread evenly, plus the
  `above` errors of larger scores; integer arrays in, float32 out.

  Computed as the integer `above + (taken·g) // size` plus the float32 fraction
  `((taken·g) mod size) / size`: no product is rounded, and an add of a quotient cannot be
  contracted into a fused multiply-add, so numpy and XLA give the same float32 bit for bit.
  Groups larger than `_EXACT_TIE_MAX` (their product would overflow int32) use the float32
  `above + taken · (g / size)` instead, within an ulp of it. `divmod_fn(a, b)` (default
  `(a // b, a % b)`) is the integer division: any exact one gives the same values
  (`ranked_counts` passes one that XLA:CPU vectorizes).
  """
  f32 = xp.float32
  above, taken = above.astype(xp.int32), taken.astype(xp.int32)
  group_errors, size = group_errors.astype(xp.int32), size.astype(xp.int32)
  exact = size <= _EXACT_TIE_MAX
  product = xp.where(exact, taken, 0) * group_errors
  quotient, remainder = (product // size, product % size) if divmod_fn is None else divmod_fn(
      product, size)
  quotient = xp.where(exact, above + quotient, 0).astype(f32)
  exact_value = quotient + remainder.astype(f32) / size.astype(f32)
  rounded_value = above.astype(f32) + taken.astype(f32) * (group_errors.astype(f32)
                                                           / size.astype(f32))
  return xp.where(exact, exact_value, rounded_value)


def _tie_runs(linked: np.ndarray):
  """`(starts, sizes)` of the runs of equal keys from `linked`, the ascending positions i whose
  key equals the next one's.

  Only the tied entries are visited, not every tie group: at N = 1e6 the bookkeeping of all N
  groups cost more than the sort.
  """
  if linked.size == 0:
    return linked, linked
  new_run = np.empty(linked.size, bool)
  new_run[0] = True
  np.not_equal(linked[1:], linked[:-1] + 1, out=new_run[1:])
  first = np.flatnonzero(new_run)
  starts = linked[first]
  ends = linked[np.append(first[1:], linked.size) - 1] + 2   # exclusive
  return starts, ends - starts


def _numpy_tie_errors(key: np.ndarray, bit: np.ndarray):
  return _tie_errors_of_sorted(*_sorting.numpy_sort_with_bit(key, bit))


def _tie_errors_of_sorted(keys: np.ndarray, bits: np.ndarray):
  """`_numpy_tie_errors` of keys sorted ascending (masked, key 0, first) and their bits."""
  n_total = keys.shape[0]
  # Descending order. The running count in int32: exact for any N of an int32 array, and its
  # float32 value is the int64's.
  cum = np.cumsum(bits[::-1], dtype=np.int32)
  errors = cum.astype(np.float32)                      # exact wherever there is no tie
  same_ascending = keys[1:] == keys[:-1]
  boundary = np.empty(n_total, bool)
  boundary[-1] = True
  np.logical_not(same_ascending[::-1], out=boundary[:-1])
  # Positions i (descending order) tied to i + 1, from the ascending array's contiguous scan.
  starts, size = _tie_runs((n_total - 2 - np.flatnonzero(same_ascending))[::-1])
  if size.size:
    # Spread each tie group's errors evenly over its members.
    ends = starts + size
    base = np.where(starts > 0, cum[starts - 1], 0)
    offsets = np.arange(size.sum()) - np.repeat(np.cumsum(size) - size, size)
    positions = np.repeat(starts, size) + offsets
    errors[positions] = spread_tie_errors(np.repeat(base, size), offsets + 1,
                                          np.repeat(cum[ends - 1] - base, size),
                                          np.repeat(size, size), np)
  valid = n_total - int(np.searchsorted(keys, 1))      # masked entries sort first
  errors[valid:] = 0.0
  boundary[valid:] = False
  return errors, boundary


def _lax_tie_errors(key: jax.Array, bit: jax.Array):
  t = _sorting.lax_sorted_ties(key, bit)
  total = key.shape[0]
  idx = jnp.arange(total, dtype=jnp.int32)
  num_errors = t.bits_upto[total - 1]
  errors = spread_tie_errors(num_errors - t.bits_upto, t.last - idx + 1,
                             t.bits_upto - t.bits_below, t.last - t.first + 1, jnp)
  valid = t.keys != 0
  errors = jnp.where(valid, errors, 0.0)[::-1]
  return errors, ((t.first == idx) & valid)[::-1]


def _by_rows(fn, key: np.ndarray, bit: np.ndarray, **kw):
  """`fn(key, bit)` of 1-D rows, applied to every row of `[..., N]` arrays (a vmapped metric,
  e.g. the bootstrap's resamples: one host call for the batch, not one per row)."""
  key, bit = np.asarray(key), np.asarray(bit)  # host arrays: rows by numpy, not jax, slicing
  if key.ndim == 1:
    return fn(key, bit, **kw)
  rows = [fn(k, b, **kw) for k, b in zip(key.reshape(-1, key.shape[-1]),
                                          bit.reshape(-1, bit.shape[-1]))]
  return tuple(np.stack(parts).reshape(key.shape[:-1] + parts[0].shape)
               for parts in zip(*rows))


def _callback_tie_errors(key: jax.Array, bit: jax.Array):
  shape = key.shape
  out = (jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct(shape, jnp.bool_))
  # Under vmap (all batched: "broadcast_all") the rows go to the host in one call.
  return jax.pure_callback(functools.partial(_by_rows, _numpy_tie_errors), out, key, bit,
                           vmap_method="broadcast_all")


def tie_errors(key: jax.Array, bit: jax.Array):
  """Tie-aware cumulative errors along the descending key order.

  Args:
    key: uint32 `[N]` score keys (larger = more confident); 0 marks masked-out entries.
    bit: `[N]` 1 for an error (must be 0 where key is 0).

  Returns:
    `(errors f32 [N], boundary bool [N])` in descending order: `errors[k − 1] = E_k`, the
    errors among the k most confident valid samples with each tie group counting its mean
    error; `boundary` is True where a tie group ends. Masked entries come last (E = 0).
  """
  return _ranked_by(_lax_tie_errors, _callback_tie_errors, key.astype(jnp.uint32),
                    bit.astype(jnp.uint8))


# ------------------------------------------------------------------ adaptive (AECE) groups
def group_starts(n, num_bins: int, xp):
  """Starts of `num_bins` contiguous groups of n items, sizes differing by ≤ 1, larger first."""
  q, r = n // num_bins, n % num_bins
  g = xp.arange(num_bins + 1)
  return xp.where(g <= r, g * (q + 1), r * (q + 1) + (g - r) * q)


def _counts_before(bits: np.ndarray, positions: np.ndarray) -> np.ndarray:
  """`bits[:j].sum()` for each j in `positions` (int64), by one `add.reduceat` pass between the
  sorted distinct positions rather than a running count of every entry."""
  total = bits.shape[0]
  cuts = np.unique(np.concatenate([[0], positions[positions < total]]))
  before = np.concatenate([[0], np.cumsum(np.add.reduceat(bits, cuts, dtype=np.int64))])
  # before[i] counts bits[:cuts[i]] (cuts[i] = total reads the last entry, the sum of all).
  return before[np.searchsorted(np.append(cuts, total), positions)]


def _numpy_adaptive_groups(key: np.ndarray, bit: np.ndarray, num_bins: int):
  return _adaptive_groups_of_sorted(*_sorting.numpy_sort_with_bit(key, bit), num_bins)


def _adaptive_groups_of_sorted(keys: np.ndarray, bits: np.ndarray, num_bins: int,
                               bits_are_errors: bool = False):
  """`_numpy_adaptive_groups` of confidence keys sorted ascending (masked, key 0, first) and
  their correct bits, or their error bits (`bits_are_errors`: the correct ones are counted as
  the valid entries less the errors, the same integers)."""
  total = keys.shape[0]
  offset = int(np.searchsorted(keys, 1))                # masked entries (key 0) come first
  split = offset + group_starts(total - offset, num_bins, np)
  # A run of equal confidences cut by a split point gives each side its mean accuracy.
  inner = np.clip(split, 1, total - 1)
  cut = (split > offset) & (split < total) & (keys[inner - 1] == keys[inner])
  lo = np.searchsorted(keys, keys[inner], side="left")
  hi = np.searchsorted(keys, keys[inner], side="right")
  positions = np.concatenate([split, lo, hi])
  before = _counts_before(bits, positions)
  if bits_are_errors:
    before = np.maximum(positions - offset, 0) - before
  cum_split, cum_lo, cum_hi = np.split(before, 3)
  # float32 fractional parts beside exact integer counts, as the lax path computes them.
  tie_mean = (cum_hi - cum_lo).astype(np.float32) / np.maximum(hi - lo, 1).astype(np.float32)
  whole = np.where(cut, cum_lo, cum_split)
  frac = np.where(cut, (split - lo).astype(np.float32) * tie_mean, np.float32(0))
  # Confidences are non-negative, so their keys are the float bits with the sign bit set.
  conf = np.bitwise_and(keys, np.uint32(0x7FFFFFFF), out=keys).view(np.float32)  # keys: done
  conf_sums = [np.sum(conf[a:b], dtype=np.float64) for a, b in zip(split[:-1], split[1:])]
  return (np.diff(whole).astype(np.float32) + np.diff(frac), np.asarray(conf_sums, np.float32))


def _lax_adaptive_groups(key: jax.Array, bit: jax.Array, num_bins: int):
  t = _sorting.lax_sorted_ties(key, bit)
  total = key.shape[0]
  n = jnp.sum(key != 0, dtype=jnp.int32)
  offset = total - n
  split = offset + group_starts(n, num_bins, jnp).astype(jnp.int32)
  inner = jnp.clip(split, 1, total - 1)
  cut = (split > offset) & (split < total) & (t.keys[inner - 1] == t.keys[inner])
  lo, hi = t.first[inner], t.last[inner] + 1
  # Set bits among the first j sorted entries where j ends a tie group (`split` uncut).
  before_split = jnp.where(split > 0, t.bits_upto[jnp.maximum(split - 1, 0)], 0)
  tie_mean = (t.bits_upto[inner] - t.bits_below[inner]).astype(jnp.float32) / (hi - lo)
  # Integer and fractional parts apart, so float32 never rounds a large running count.
  whole = jnp.where(cut, t.bits_below[inner], before_split)
  frac = jnp.where(cut, (split - lo).astype(jnp.float32) * tie_mean, 0.0)
  pos = jnp.arange(total, dtype=jnp.int32)
  # Group of each sorted position: the split points it has passed (a running count of
  # split marks, not a binary search: no scan to compile).
  marks = jnp.zeros(total + 1, jnp.int32).at[split[1:-1]].add(1)[:total]
  group = _sorting.cumsum_small(marks)
  group = jnp.where(pos >= offset, jnp.minimum(group, num_bins - 1), num_bins)
  conf = _sorting.key_to_score(t.keys)
  group_conf = _segments.segment_sum_f32(conf, group, num_bins + 1)[:num_bins]
  return jnp.diff(whole).astype(jnp.float32) + jnp.diff(frac), group_conf


def _callback_adaptive_groups(key: jax.Array, bit: jax.Array, num_bins: int):
  out = (jax.ShapeDtypeStruct(key.shape[:-1] + (num_bins,), jnp.float32),) * 2
  return jax.pure_callback(functools.partial(_by_rows, _numpy_adaptive_groups,
                                             num_bins=num_bins), out,
                           key, bit, vmap_method="broadcast_all")


def adaptive_groups(key: jax.Array, bit: jax.Array, num_bins: int):
  """Per-group correct counts and confidence sums of the AECE's equal-mass groups.

  Args:
    key: uint32 `[N]` confidence keys; 0 marks masked-out entries.
    bit: `[N]` 1 for a correct prediction (0 where key is 0).
    num_bins: number of groups (static).

  Returns:
    `(hits f32 [B], confidence_sums f32 [B])` of the contiguous groups of the ascending order
    with `np.array_split` sizes; a tie run cut by a group boundary gives both sides its mean
    accuracy.
  """
  return _ranked_by(functools.partial(_lax_adaptive_groups, num_bins=num_bins),
                    functools.partial(_callback_adaptive_groups, num_bins=num_bins),
                    key.astype(jnp.uint32), bit.astype(jnp.uint8))


# ------------------------------------------------------------------ both from one sort
def _numpy_ranked_and_groups(key: np.ndarray, error: np.ndarray, num_bins: int):
  """`_numpy_tie_errors(key, error)` and `_numpy_adaptive_groups(key, ~error)` from one sort
  (equal to the bit: AECE's values count each tie group, whatever the order inside it)."""
  keys, bits = _sorting.numpy_sort_with_bit(key, error)
  errors, boundary = _tie_errors_of_sorted(keys, bits)
  hits, conf_sums = _adaptive_groups_of_sorted(keys, bits, num_bins, bits_are_errors=True)
  return errors, boundary, hits, conf_sums


def _callback_ranked_and_groups(key: jax.Array, error: jax.Array, num_bins: int):
  shape = key.shape
  groups = jax.ShapeDtypeStruct(shape[:-1] + (num_bins,), jnp.float32)
  out = (jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct(shape, jnp.bool_),
         groups, groups)
  return jax.pure_callback(functools.partial(_by_rows, _numpy_ranked_and_groups,
                                             num_bins=num_bins), out,
                           key, error, vmap_method="broadcast_all")


def _lax_ranked_and_groups(key: jax.Array, error: jax.Array, num_bins: int):
  correct = jnp.where(key != 0, 1 - error, 0).astype(jnp.uint8)
  return (*_lax_tie_errors(key, error), *_lax_adaptive_groups(key, correct, num_bins))


def ranked_and_groups(key: jax.Array, error: jax.Array, num_bins: int):
  """`tie_errors(key, error)` and `adaptive_groups(key, correct, num_bins)` of the same
  confidence keys (0: masked out; `error` 0 there), from one sort on CPU.

  Returns:
    `(errors f32 [N], boundary bool [N], hits f32 [B], confidence_sums f32 [B])`.
  """
  return _ranked_by(functools.partial(_lax_ranked_and_groups, num_bins=num_bins),
                    functools.partial(_callback_ranked_and_groups, num_bins=num_bins),
                    key.astype(jnp.uint32), error.astype(jnp.uint8))
