"""Float32 segment sums that stay accurate for millions of entries.

`jax.ops.segment_sum` is a scatter-add, which adds into each segment sequentially: summing
1e7 confidences into 15 bins that way loses ~3e-4 relative accuracy in float32. Summing
fixed-size chunks separately and then adding the per-chunk partials (a tree reduction)
brings the error back to ~1e-7 for about 1.3x the cost.
"""
import jax
import jax.numpy as jnp

_CHUNK = 128
_MAX_PARTIALS = 1 << 22   # bound on the [chunks, segments] partial-sum buffer (16 MB)


def segment_sum_f32(values: jax.Array, segment_ids: jax.Array, num_segments: int) -> jax.Array:
  """`jax.ops.segment_sum` of float32 `values` with chunked (pairwise-like) accumulation."""
  values = values.reshape(-1).astype(jnp.float32)
  segment_ids = segment_ids.reshape(-1)
  n = values.shape[0]
  num_chunks = max(1, min(n // _CHUNK, _MAX_PARTIALS // num_segments))
  if num_chunks == 1:
    return jax.ops.segment_sum(values, segment_ids, num_segments)
  chunk = -(-n // num_chunks)
  pad = num_chunks * chunk - n
  values = jnp.pad(values, (0, pad))
  segment_ids = jnp.pad(segment_ids, (0, pad))
  offsets = jnp.arange(num_chunks, dtype=segment_ids.dtype)[:, None] * num_segments
  ids = (segment_ids.reshape(num_chunks, chunk) + offsets).reshape(-1)
  partials = jax.ops.segment_sum(values, ids, num_chunks * num_segments)
  return jnp.sum(partials.reshape(num_chunks, num_segments), axis=0)
