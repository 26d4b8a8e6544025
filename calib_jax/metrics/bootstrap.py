"""Bootstrap confidence intervals for any metric, resampled and evaluated on device.

`bootstrap(metric_fn, *arrays)` draws `num_samples` resamples of the N samples with
replacement (B. Efron, "Bootstrap methods: another look at the jackknife", Ann. Statist.
1979): every array is indexed along axis 0 with the same `jax.random.randint` indices, so
`(probs, labels)` of a calibration metric and `(scores, correct)` of a selective or detection
metric stay paired. The metric is `vmap`ped over the resamples in chunks (`lax.map` with a
`batch_size`), so memory stays bounded. The interval is the percentile interval: the
`(1 − confidence)/2` and `(1 + confidence)/2` quantiles (linear interpolation, numpy's
default) of the resampled values; `std` is their standard deviation (ddof = 1), the
bootstrap standard error.

With a mask: a 1-D mask `[N]` restricts the resampling to the valid samples (each resample
draws `n_valid` of them and the metric gets a mask selecting exactly those); a mask with more
dims (`[B, H, W]` pixels) is resampled along axis 0 with the other arrays (images are the
resampled unit).

Cost: each resample gathers every array, so one resample reads them once. Two things keep it
near the cost of drawing the indices:

* Top-label metrics (`ece`, `mce`, `aece`, `accuracy`, `rms_calibration_error`,
  `debiased_ece`, `smooth_ece`, or a `functools.partial` of one) depend on a sample only
  through its confidence `max_k p_k` and whether its argmax is right, so `(probs [..., C],
  labels)` are reduced once to one float per sample (the confidence, negated when wrong); a
  resample gathers that 1-D array, not C columns, and gives the metric rows `[conf, 0]` with
  label 0 (right) or 1 (wrong) (`top_label_rows`) — the same value as the probabilities give.
* On XLA:CPU the resamples run one at a time (`batch_size` 1): vmapped gathers and scatters
  run there several times slower than a loop over them.
* `aurc`, `eaurc` and `augrc` of 1-D `(scores, correct)`: the samples are sorted once, and each
  resample ranked from its counts of them (`ranked_counts.ranked_from_counts`: running sums, no
  sort per resample), then reduced as the metric reduces: the same values, bit for bit.
* `smooth_ece` (automatic bandwidth) of `(probs, labels)`, or `smooth.top_label_smooth_ece`
  of `(confidence, correct)`: a chunk of resamples (at most `_SMOOTH_CHUNK`, and
  `_CHUNK_ELEMENTS` draws) are counts of the original points, spread onto their grids by one
  scatter and searched together (`smooth_batched.search_bandwidths`: kernel spectra tabulated
  once per call, one batched FFT convolution per step): the same values up to float32
  rounding of sums taken in another order.
* The index of each draw is `floor(u·n / 2³²)` of one uniform 32-bit word `u` (the product's
  high word, in exact uint32 arithmetic) instead of `jax.random.randint`'s two words and
  modulo, about 2x fewer random bits. An index then has probability `(1 ± ε)/n` with
  `ε < n/2³²` (≤ 1e-3 for the n ≤ 2²² it is used for; larger n use `randint`). The words are
  `jax.random.bits`' own, hashed by an unrolled threefry (`_random_bits`: ~3x faster on
  XLA:CPU), a chunk of resamples' indices at a time into a buffer that the loop over them
  reads (drawn where they are used, XLA hashes again in each consumer, unvectorised).
"""
import functools
import numbers
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import program_store
from calib_jax import arrays as arrays_lib
from calib_jax.metrics import calibration
from calib_jax.metrics import calibration_l2
from calib_jax.metrics import ranked_counts
from calib_jax.metrics import selective
from calib_jax.metrics import smooth
from calib_jax.metrics import smooth_batched

ArrayLike = jax.typing.ArrayLike

# Metrics of `(probs, labels[, mask])` that use only the top-label confidence and correctness.
_TOP_LABEL_METRICS = (calibration.ece, calibration.mce, calibration.aece, calibration.accuracy,
                      calibration_l2.rms_calibration_error, calibration_l2.debiased_ece,
                      smooth.smooth_ece)
_FAST_DRAW_MAX = 1 << 22  # largest n drawn from one 32-bit word per index (bias < n/2³²)
_CHUNK_BYTES = 1 << 28   # ~256 MB of resampled copies per vmapped chunk
_SMOOTH_CHUNK = 100      # smooth-ECE resamples whose bandwidth searches run batched, at most
_CHUNK_ELEMENTS = 1 << 21  # and at most this many draws (smooth ECE: ~40 MB of spread rows)
_DRAW_CHUNK = 10  # other metrics: resamples whose indices are drawn together, at most


def _check(metric_fn, arrays, num_samples, confidence, mask):
  if not callable(metric_fn):
    raise ValueError(f"metric_fn must be callable, got {metric_fn!r}.")
  if not arrays:
    raise ValueError("bootstrap needs at least one array to resample, e.g. (probs, labels).")
  shapes = [tuple(np.shape(a)) for a in arrays]
  if any(len(s) == 0 for s in shapes):
    raise ValueError(f"every array needs a sample axis 0, got shapes {shapes}.")
  n = shapes[0][0]
  if any(s[0] != n for s in shapes):
    raise ValueError(f"arrays must share their axis 0 (the samples), got shapes {shapes}.")
  if n == 0:
    raise ValueError("empty input: bootstrap needs >= 1 sample.")
  if (isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral)
      or num_samples < 2):
    raise ValueError(f"num_samples must be an int >= 2, got {num_samples!r}.")
  if (isinstance(confidence, bool) or not isinstance(confidence, numbers.Real)
      or not 0.0 < confidence < 1.0):
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
  if mask is not None:
    m_shape = tuple(np.shape(mask))
    if not m_shape or m_shape[0] != n:
      raise ValueError(f"mask shape {m_shape} must start with the sample axis {n}.")
    if np.asarray(mask).dtype != bool:
      raise ValueError(f"mask must be a bool array, got dtype {np.asarray(mask).dtype}.")
    if not bool(np.any(mask)):
      raise ValueError("mask selects no entries; metrics of an empty set are undefined.")
  return n


def _batch_size(arrays, mask, num_samples: int) -> int:
  if jax.default_backend() == "cpu":
    return 1  # XLA:CPU runs vmapped gathers and scatters several times slower than a loop
  per_resample = sum(int(np.prod(np.shape(a))) * 4 for a in arrays)
  if mask is not None:
    per_resample += int(np.prod(np.shape(mask)))
  return int(max(1, min(num_samples, _CHUNK_BYTES // max(per_resample, 1))))


def _is_top_label(metric_fn) -> bool:
  while isinstance(metric_fn, functools.partial):
    metric_fn = metric_fn.func
  return any(metric_fn is f for f in _TOP_LABEL_METRICS)


@jax.jit
def _packed_top_label(probs, labels):
  """One float32 per sample: the confidence `max p`, negated where the argmax is wrong (a
  resample then gathers one 1-D array)."""
  conf, correct = calibration.confidence_and_correct(probs, labels)
  return jnp.where(correct, conf, -conf)


def top_label_rows(confidence: ArrayLike, correct: ArrayLike) -> tuple[jax.Array, jax.Array]:
  """Two-class rows `[c, 0]` and labels 0 (right) / 1 (wrong) from top-label
  `(confidence [...], correct [...])` (`confidence_and_correct`).

  Row i's maximum is `c_i` in column 0, which is its label exactly when `correct_i`, so a
  top-label metric of `(probs, labels)` — `ece`, `mce`, `aece`, `accuracy`, `smooth_ece`,
  `reliability_bins`, ... — gives the same value on `top_label_rows(*confidence_and_correct(
  probs, labels))`: a `[N, 2]` array stands for `[N, C]` (how `bootstrap` resamples them).

  Returns:
    `(rows [..., 2] float, labels [...] int32)`.
  """
  if jnp.shape(confidence) != jnp.shape(correct):
    raise ValueError(f"confidence and correct must have the same shape, got "
                     f"{jnp.shape(confidence)} and {jnp.shape(correct)}.")
  return _top_label_rows(confidence, correct)


# One program outside a trace (the shape check above stays out of it: one-line errors).
@program_store.jit
def _top_label_rows(confidence, correct):
  rows = jnp.stack([confidence, jnp.zeros_like(confidence)], axis=-1)
  return rows, jnp.logical_not(correct).astype(jnp.int32)


def _scale_to_range(bits: jax.Array, n) -> jax.Array:
  """`floor(bits·n / 2³²)` for uint32 `bits` and `n < 2³¹`, exactly, in uint32: the 64-bit
  product assembled from 16-bit halves (`bits = 2¹⁶h + l`, `n = 2¹⁶n_h + n_l`)."""
  n = jnp.asarray(n, jnp.uint32)
  h, l = bits >> 16, bits & 0xFFFF
  n_h, n_l = n >> 16, n & 0xFFFF
  cross_a, cross_b = h * n_l, l * n_h
  carry = ((cross_a & 0xFFFF) + (cross_b & 0xFFFF) + ((l * n_l) >> 16)) >> 16
  return (h * n_h + (cross_a >> 16) + (cross_b >> 16) + carry).astype(jnp.int32)


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _random_bits(key: jax.Array, size: int) -> jax.Array:
  """`jax.random.bits(key, (size,), jnp.uint32)`, the same bits, ~3x faster on XLA:CPU.

  JAX's partitionable threefry (its default) hashes the counter pair `(0, i)` and returns the
  xor of the two output words; on the CPU it lowers the 20 rounds as a 5-step loop over whole
  arrays, each step a pass over memory. Here the rounds are unrolled (JAX's own lowering on
  other platforms), so XLA fuses them into one pass. Other key implementations, the
  non-partitionable scheme, or sizes ≥ 2³² keep `jax.random.bits` (tested to match it).
  """
  if (not jax.config.jax_threefry_partitionable or size >= 1 << 32
      or str(jax.random.key_impl(key)) != "threefry2x32"):
    return jax.random.bits(key, (size,), jnp.uint32)
  k0, k1 = jax.random.key_data(key)
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
  x0 = jnp.broadcast_to(ks[0], (size,))  # the counter's high word is 0 below 2³²
  x1 = lax.iota(jnp.uint32, size) + ks[1]
  for step in range(5):
    for r in _THREEFRY_ROTATIONS[step % 2]:
      x0 = x0 + x1
      x1 = x0 ^ ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r)))
    x0 = x0 + ks[(step + 1) % 3]
    x1 = x1 + ks[(step + 2) % 3] + np.uint32(step + 1)
  return x0 ^ x1


def _draw_indices(key: jax.Array, size: int, n) -> jax.Array:
  """`size` indices uniform on [0, n) (n may be traced, ≤ `size`); see the module docstring."""
  if size <= _FAST_DRAW_MAX:
    return _scale_to_range(_random_bits(key, size), n)
  return jax.random.randint(key, (size,), 0, n)


def _take(array, idx):
  # The indices are in range by construction: "clip" skips the out-of-bounds fill, ~3x faster
  # on XLA:CPU than the default gather.
  return jnp.take(array, idx, axis=0, mode="clip")


def _counts(indices: jax.Array, n: int, drawn: Optional[jax.Array] = None) -> jax.Array:
  """int32 `[B, n]`: how often each row of `indices [B, K]` drew each of n samples (only the
  draws where `drawn [K]`, when given, is True): one scatter for the B rows."""
  b = indices.shape[0]
  flat = (indices + n * jnp.arange(b, dtype=jnp.int32)[:, None]).reshape(-1)
  ones = jnp.ones(indices.shape, jnp.int32)
  if drawn is not None:
    ones = jnp.where(drawn, ones, 0)
  return jax.ops.segment_sum(ones.reshape(-1), flat, b * n).reshape(b, n)


def _chunk(num_samples: int, n: int, most: int) -> int:
  """Resamples per chunk: the largest divisor of `num_samples` of at most `most` and
  `_CHUNK_ELEMENTS` resampled samples in all."""
  limit = min(num_samples, most, max(1, _CHUNK_ELEMENTS // n))
  return max(d for d in range(1, limit + 1) if num_samples % d == 0)


def _smooth_chunk(metric_fn, arrays, mask, batch_size, top_label, num_samples: int):
  """Resamples per batched bandwidth search for smooth ECE (its automatic bandwidth) of
  `(probs, labels)` or `(confidence, correct)`; None for any other metric."""
  if batch_size is not None or (mask is not None and np.ndim(mask) != 1):
    return None
  if not ((metric_fn is smooth.smooth_ece and top_label)
          or (metric_fn is smooth.top_label_smooth_ece and len(arrays) == 2
              and all(np.ndim(a) == 1 for a in arrays))):
    return None
  return _chunk(num_samples, np.shape(arrays[0])[0], _SMOOTH_CHUNK)


@functools.partial(program_store.jit, static_argnames=("metric_fn", "batch_size", "top_label",
                                                       "ranked", "smooth_chunk"))
def _resampled(metric_fn, arrays, mask, keys, batch_size, top_label, ranked=False,
               smooth_chunk=None):
  n = arrays[0].shape[0]
  flat_mask = mask is not None and mask.ndim == 1
  if flat_mask:
    n_valid = jnp.sum(mask, dtype=jnp.int32)
    valid_rows = jnp.nonzero(mask, size=n, fill_value=0)[0]
    resampled_mask = jnp.arange(n) < n_valid

  def metric(*resampled, **kw):
    if top_label:
      (packed,) = resampled
      return metric_fn(*top_label_rows(jnp.abs(packed), ~jnp.signbit(packed)), **kw)
    return metric_fn(*resampled, **kw)

  def draw(key):
    if flat_mask:
      return _take(valid_rows, _draw_indices(key, n, n_valid))
    return _draw_indices(key, n, n)

  def draws(chunk_keys):
    # [K, n], a loop over the keys writing each one's indices to a buffer: vmapped, or drawn
    # where they are used, XLA fuses the hash into each consumer (a scatter, a gather), where
    # it runs unvectorised, once per consumer (~3-5x slower).
    return lax.map(draw, chunk_keys)

  def each_drawn(fn):
    # `fn(indices)` of every resample, one at a time (lax.map of batch_size 1 would vmap over
    # a batch of 1, whose batched gathers are the slow ones on XLA:CPU), their indices drawn
    # a chunk at a time (`draws`).
    chunk = _chunk(keys.shape[0], n, _DRAW_CHUNK)
    out = lax.map(lambda chunk_keys: lax.map(fn, draws(chunk_keys)), keys.reshape(-1, chunk))
    return out.reshape(keys.shape[0], *out.shape[2:])

  def resample(idx):
    if flat_mask:
      return metric(*(_take(a, idx) for a in arrays), mask=resampled_mask)
    if mask is None:
      return metric(*(_take(a, idx) for a in arrays))
    return metric(*(_take(a, idx) for a in arrays), mask=_take(mask, idx))

  if smooth_chunk is not None:
    # Smooth ECE: a chunk's resamples as counts of the original points, searched together
    # (`smooth_batched.search_bandwidths`), with the kernel tables computed once.
    if top_label:
      (packed,) = arrays
      conf, correct = jnp.abs(packed), ~jnp.signbit(packed)
    else:
      conf, correct = smooth.top_label_inputs(*arrays)
    tables = smooth_batched.tables()

    def chunk(chunk_keys):
      # With a mask: n draws among the n_valid valid rows, of which the first n_valid count.
      counts = _counts(draws(chunk_keys), n, resampled_mask if flat_mask else None)
      return smooth_batched.search_bandwidths(counts.astype(jnp.float32), conf, correct,
                                              tables)[0]

    return lax.map(chunk, keys.reshape(-1, smooth_chunk)).reshape(-1)
  if ranked:
    # AURC-type metrics: the samples sorted once; each resample is its counts of them, ranked
    # without a sort (`ranked_counts.ranked_from_counts`: the errors `E_k` bit for bit) and
    # reduced as the metric reduces.
    points = ranked_counts.rank_points(*arrays)
    reduction = selective.ranked_reduction(metric_fn)

    def ranked_one(idx):
      if flat_mask:  # n draws among the n_valid valid rows, of which the first n_valid count
        drawn, num_valid = resampled_mask.astype(jnp.int32), n_valid
      else:
        drawn, num_valid = jnp.int32(1), None
      counts = jnp.zeros(n, jnp.int32).at[idx].add(drawn, mode="promise_in_bounds")
      return reduction(ranked_counts.ranked_from_counts(points, counts, num_valid))

    return each_drawn(ranked_one)
  if batch_size == 1:
    return each_drawn(resample)
  return lax.map(lambda key: resample(draw(key)), keys, batch_size=batch_size)


def bootstrap(metric_fn: Callable, *arrays: ArrayLike, num_samples: int = 1000,
              key: Optional[jax.Array] = None, confidence: float = 0.95,
              mask: Optional[ArrayLike] = None, batch_size: Optional[int] = None,
              value: Optional[ArrayLike] = None) -> dict:
  """Bootstrap percentile interval of `metric_fn(*arrays)`, resampling axis 0 of all arrays.

  Works for any metric whose inputs share a sample axis, e.g.
  `bootstrap(metrics.ece, probs, labels)`, `bootstrap(metrics.smooth_ece, probs, labels)`,
  `bootstrap(metrics.aurc, scores, correct)`, `bootstrap(metrics.auroc, scores, positives)`.
  Keyword options of the metric go in through a closure or `functools.partial`, e.g.
  `bootstrap(functools.partial(metrics.ece, num_bins=10), probs, labels)`.

  Args:
    metric_fn: `metric_fn(*arrays[, mask=...]) -> scalar`, jit-able (it is traced once and
      vmapped over the resamples); it must accept `mask=` when a mask is given.
    *arrays: the metric's array arguments, all with N samples along axis 0.
    num_samples: number of resamples (≥ 2).
    key: a `jax.random` key; None uses `jax.random.key(0)` (reproducible).
    confidence: coverage of the interval, in (0, 1).
    mask: optional bool mask, shape starting with N (see the module docstring).
    batch_size: resamples vmapped at once (None: 1 on CPU, else as many as fit in ~256 MB of
      copies).
    value: `metric_fn(*arrays)` when the caller has computed it already (a report's own
      metrics program): returned as `value` as given, and the metric is not run on the data
      (nor are its input checks: pass inputs it has checked).

  Returns:
    dict of float32 scalars: `value` (the metric on the data), `lower`, `upper` (the
    percentile interval) and `std` (the bootstrap standard error). A metric whose value is an
    array (several metrics at once, e.g. one per calibrator, on the same resamples) gets
    arrays of that shape: one interval per element.
  """
  _check(metric_fn, arrays, num_samples, confidence, mask)
  if batch_size is not None and (isinstance(batch_size, bool)
                                 or not isinstance(batch_size, numbers.Integral)
                                 or batch_size < 1):
    raise ValueError(f"batch_size must be None or a positive int, got {batch_size!r}.")
  arrays = tuple(jnp.asarray(a) for a in arrays)
  mask = None if mask is None else jnp.asarray(mask)
  key = jax.random.key(0) if key is None else key
  keys = jax.random.split(key, num_samples)
  if value is None:
    value = metric_fn(*arrays) if mask is None else metric_fn(*arrays, mask=mask)
  top_label = _is_top_label(metric_fn) and len(arrays) == 2
  if top_label:
    arrays = (_packed_top_label(*arrays),)  # after `value`: its checks see the given arrays
  ranked = (selective.ranked_reduction(metric_fn) is not None and batch_size is None
            and len(arrays) == 2 and all(a.ndim == 1 for a in arrays)
            and (mask is None or mask.ndim == 1))
  if ranked:
    arrays = arrays_lib.flatten_scores_correct(*arrays, None)[:2]  # the metric's own casts
  smooth_chunk = _smooth_chunk(metric_fn, arrays, mask, batch_size, top_label, num_samples)
  batch = batch_size or _batch_size(arrays, mask, num_samples)
  samples = _resampled(metric_fn, arrays, mask, keys, int(batch), top_label, ranked,
                       smooth_chunk)
  return _interval(samples, jnp.asarray(value, jnp.float32), confidence)


@program_store.jit
def _interval(samples, value, confidence):
  """The percentile interval and standard error of `samples [num_samples, ...]` along axis 0,
  one program (a metric with a vector value gets one interval per element)."""
  samples = samples.astype(jnp.float32)
  tail = (1.0 - confidence) / 2.0
  lower, upper = jnp.quantile(samples, jnp.stack([tail, 1.0 - tail]), axis=0)
  return {"value": value, "lower": lower, "upper": upper,
          "std": jnp.std(samples, axis=0, ddof=1)}
