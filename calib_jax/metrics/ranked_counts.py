"""The tie-aware ranks of a bootstrap resample from its counts of the original samples, without
sorting it: `metrics.bootstrap` of `aurc`, `eaurc` and `augrc`.

A resample holds original sample i `c_i` times. Sorted descending by score, it is the
original samples' order (`rank_points`, one sort per bootstrap) with each sample repeated, so
its tie groups (equal scores) are the original ones with sizes `S_g = Σ_{i∈g} c_i`, and
everything `selective.rank_errors` gives — the tie-aware errors `E_k` at each position and the
tie-group boundaries — follows from running sums of the groups' sizes and errors
(`ranked_from_counts`): O(N) per resample instead of a sort, the same values bit for bit
(tested against the metric on the resampled arrays).
"""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import _ranking
from calib_jax.metrics import _sorting
from calib_jax.metrics import selective


class RankedPoints(NamedTuple):
  """Samples in descending score order with their tie groups, for `ranked_from_counts`."""
  order: jax.Array   # int32 [N], the sample at each rank
  errors: jax.Array  # int32 [N], its error bit
  group: jax.Array   # int32 [N], its tie group (0, 1, ... along the ranks)


def rank_points(scores: jax.Array, correct: jax.Array) -> RankedPoints:
  """Sorts `scores [N]` descending once (ties: equal scores, as `selective.rank_errors`)."""
  descending = ~_sorting.monotone_key(scores)
  n = scores.shape[0]
  keys, order = lax.sort((descending, jnp.arange(n, dtype=jnp.int32)), num_keys=1)
  new_group = jnp.concatenate([jnp.zeros(1, jnp.int32), (keys[1:] != keys[:-1]).astype(
      jnp.int32)])
  return RankedPoints(order, (~correct[order]).astype(jnp.int32), running_sums(new_group))


_SCAN_BLOCK = 32  # running sums: blocks summed by one product with a triangular matrix
_SCAN_EXACT = 1 << 24  # float32 holds every integer below this


def running_sums(x: jax.Array) -> jax.Array:
  """`jnp.cumsum(x, axis=-1)` of int32 `x [..., n]` of non-negative counts, exactly.

  XLA:CPU's cumsum is an associative scan, ~log₂ n passes (~10 ns an element at n = 25,000);
  here blocks of 32 are summed by one float32 product with a triangular matrix of ones
  (integers below 2²⁴ add exactly in any order), and the blocks' totals the same way, in
  turn: ~3x faster at n = 25,000. Rows longer than 2²⁴ use cumsum (their sums could exceed it).
  The product is asked for at full float32 precision: at the platform's default, a GPU rounds
  its operands to TF32 (11 significant bits) and a TPU to bfloat16 (8), which would round the
  block totals (counts above 2,048 or 256) and give wrong ranks there.
  """
  if x.shape[-1] >= _SCAN_EXACT:
    return jnp.cumsum(x, axis=-1)

  def sums(x):
    *lead, n = x.shape
    blocks = -(-n // _SCAN_BLOCK)
    padded = jnp.pad(x, [(0, 0)] * len(lead) + [(0, blocks * _SCAN_BLOCK - n)])
    within = jnp.matmul(padded.reshape(*lead, blocks, _SCAN_BLOCK),
                        jnp.triu(jnp.ones((_SCAN_BLOCK, _SCAN_BLOCK), jnp.float32)),
                        precision=lax.Precision.HIGHEST)
    if blocks > 1:
      within = within + (sums(within[..., -1]) - within[..., -1])[..., None]
    return within.reshape(*lead, blocks * _SCAN_BLOCK)[..., :n]
  return sums(x.astype(jnp.float32)).astype(jnp.int32)


def _divmod(a: jax.Array, b: jax.Array):
  """`(a // b, a % b)` of int32 `0 ≤ a < 2³¹`, `b ≥ 1`, exactly: the float32 quotient is within
  one of the true one (its relative error is below 2⁻²³ and `a/b < 2³¹/b`), then corrected by
  one integer product. XLA:CPU's integer division does not vectorize: ~4x slower."""
  q = jnp.floor(a.astype(jnp.float32) / b.astype(jnp.float32)).astype(jnp.int32)
  r = a - q * b
  q = jnp.where(r < 0, q - 1, jnp.where(r >= b, q + 1, q))
  return q, a - q * b


def _spread_tie_errors(above, taken, group_errors, size):
  """`_ranking.spread_tie_errors` with `_divmod` for its integer division (empty groups, past
  the resample's end, divided by 1): the same values bit for bit (tested)."""
  return _ranking.spread_tie_errors(above, taken, group_errors, size, jnp,
                                    lambda a, b: _divmod(a, jnp.maximum(b, 1)))


def ranked_from_counts(points: RankedPoints, counts: jax.Array,
                       num_valid: Optional[jax.Array] = None) -> selective.RankedErrors:
  """`selective.rank_errors` of the multiset holding sample i `counts[i]` times (int32 `[N]`; a bootstrap
  resample), without sorting it. The counts sum to N, or to `num_valid` (traced) where the
  resample is masked, as `selective.rank_errors`' n is a constant without a mask and traced with one
  (XLA divides by a constant as a product with its reciprocal: another last bit).

  The multiset's descending order is `points`' with each sample repeated: tie group g holds
  `S_g` positions `[s_g, e_g)` (running sums of the sizes) with `err_g` errors. At position p,
  the positions and errors of the groups ending at or before p are the start of p's group and
  the errors above it; those of the groups starting at or before p its end and the errors up
  to its end: running sums along the positions of `(S_g, err_g)` placed at `e_g`, and at `s_g`
  (int32, exact; no gather per position). `E_k` is then `_ranking.spread_tie_errors` of them,
  the expression the sorting paths use: the same float32 values, bit for bit (tested)."""
  n = counts.shape[0]
  copies = counts[points.order]
  per_group = jax.ops.segment_sum(jnp.stack([copies, copies * points.errors], axis=-1),
                                  points.group, n, indices_are_sorted=True)   # [G, 2]
  group_end = running_sums(per_group[:, 0])
  group_start = group_end - per_group[:, 0]
  placed = jnp.zeros((n, 2, 2), jnp.int32)
  placed = placed.at[group_end, 0].add(per_group, mode="drop")   # at or before p: above it
  placed = placed.at[group_start, 1].add(per_group, mode="drop")  # and up to its end
  (start, above), (end, errors_end) = running_sums(placed.transpose(1, 2, 0))
  position = jnp.arange(1, n + 1, dtype=jnp.int32)
  total = jnp.int32(n) if num_valid is None else num_valid
  inside = position <= total
  errors = _spread_tie_errors(above, position - start, errors_end - above, end - start)
  return selective.RankedErrors(jnp.where(inside, errors, 0.0), inside & (position == end),
                      jnp.sum(per_group[:, 1]), total)

