"""Array inputs shared by `metrics`, `posthoc` and `conformal`: their checks, and the prediction
and confidence of probability rows.

Checks: shapes are static under `jax.jit`, so shape errors are always raised eagerly. Value
checks (labels in range, a mask that selects something) run only when the values are concrete,
i.e. when a function is called outside a trace; inside a user's `jit` they are skipped
(documented in each public function).

Predictions: `first_argmax` is `argmax` with the first index on ties, blocked for many classes
(where XLA:CPU is slow at arg-reductions); `prediction_and_confidence` adds the max probability.
"""
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

ArrayLike = jax.typing.ArrayLike


def is_concrete(*xs) -> bool:
  """True when none of `xs` is a tracer, so their values can be inspected."""
  return not any(isinstance(x, jax.core.Tracer) for x in xs)


def unsharded(x: jax.Array) -> jax.Array:
  """Replicates an array that is sharded in explicit-sharding mode.

  The one-shot metrics sort and scatter along the sample axis, which explicit sharding does
  not resolve on its own; gathering is correct and cheap next to a model's forward pass. To
  scale over devices, use `StreamingMetrics` inside `shard_map` and `psum` it instead.
  """
  spec = getattr(jax.typeof(x).sharding, "spec", None)
  if spec is not None and any(axis is not None for axis in spec):
    x = jax.reshard(x, jax.sharding.PartitionSpec())
  return x


def _shape(x) -> tuple:
  return tuple(np.shape(x))


def as_float_array(x: ArrayLike, name: str) -> jax.Array:
  """Converts to a float32 jax array (bf16/f16 inputs are upcast; accumulation is float32)."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    x = np.asarray(x)
    dtype = x.dtype
  if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
          or dtype == bool):
    raise ValueError(f"{name} must be a real-valued array, got dtype {dtype}.")
  return unsharded(jnp.asarray(x, jnp.float32))


def as_int_array(x: ArrayLike, name: str) -> jax.Array:
  """Converts integer class indices to int32; float or bool labels are rejected."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    x = np.asarray(x)
    dtype = x.dtype
  if not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"{name} must hold integer class indices, got dtype {dtype}.")
  return unsharded(jnp.asarray(x, jnp.int32))


def as_bool_array(x: ArrayLike, name: str) -> jax.Array:
  """Converts a bool (or 0/1 integer) array to bool."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    x = np.asarray(x)
    dtype = x.dtype
  if not (dtype == bool or jnp.issubdtype(dtype, jnp.integer)):
    raise ValueError(f"{name} must be a bool array, got dtype {dtype}.")
  return unsharded(jnp.asarray(x).astype(bool))


def check_num_classes(num_classes) -> int:
  if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
  return num_classes


def check_num_bins(num_bins) -> int:
  if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
    raise ValueError(f"num_bins must be a positive Python int, got {num_bins!r}.")
  return int(num_bins)


def flatten_probs_labels(probs: ArrayLike, labels: ArrayLike,
                         mask: Optional[ArrayLike]):
  """Validates `probs [..., C]`, `labels [...]`, `mask [...]` and flattens the leading dims.

  Returns `(probs [N, C] f32, labels [N] i32, mask [N] bool or None)`.
  """
  p_shape, l_shape = _shape(probs), _shape(labels)
  if len(p_shape) < 2:
    raise ValueError(f"probs must have shape [..., C] with at least 2 dims, got {p_shape}.")
  if p_shape[:-1] != l_shape:
    raise ValueError(
        f"labels shape {l_shape} must equal the leading shape of probs {p_shape[:-1]}.")
  num_classes = p_shape[-1]
  if num_classes < 1:
    raise ValueError(f"probs has no classes (shape {p_shape}).")
  n = int(np.prod(l_shape))
  if n == 0:
    raise ValueError(f"empty input: probs has shape {p_shape}; metrics need >= 1 sample.")
  probs = as_float_array(probs, "probs").reshape(n, num_classes)
  labels = as_int_array(labels, "labels").reshape(n)
  mask = flatten_mask(mask, l_shape)
  check_label_values(labels, num_classes, mask)
  return probs, labels, mask


def flatten_mask(mask: Optional[ArrayLike], leading_shape: tuple) -> Optional[jax.Array]:
  """Validates a bool mask of shape `leading_shape`, flattens it, and checks it is non-empty."""
  if mask is None:
    return None
  if _shape(mask) != tuple(leading_shape):
    raise ValueError(f"mask shape {_shape(mask)} must equal {tuple(leading_shape)}.")
  mask = as_bool_array(mask, "mask").reshape(-1)
  if is_concrete(mask) and not bool(jnp.any(mask)):
    raise ValueError("mask selects no entries; metrics of an empty set are undefined.")
  return mask


@jax.jit
def _any_out_of_range(labels, mask, num_classes):
  # A boolean any() is ~8x faster than an integer min/max reduction on XLA:CPU.
  bad = (labels < 0) | (labels >= num_classes)
  return jnp.any(bad if mask is None else bad & mask)


def check_label_values(labels: jax.Array, num_classes: int, mask: Optional[jax.Array]) -> None:
  """Raises when a valid label lies outside [0, num_classes) (only for concrete values)."""
  if not is_concrete(labels, mask):
    return
  if not bool(_any_out_of_range(labels, mask, num_classes)):
    return
  values = np.asarray(labels) if mask is None else np.asarray(labels)[np.asarray(mask)]
  bad = values[(values < 0) | (values >= num_classes)][0]
  raise ValueError(
      f"label {bad} at a valid position is outside [0, {num_classes}); mask out ignored "
      "entries (e.g. ignore_index=255) with `mask`.")


def flatten_scores_correct(scores: ArrayLike, correct: ArrayLike, mask: Optional[ArrayLike]):
  """Validates selective-classification inputs `scores [...]`, `correct [...]`; flattens them."""
  s_shape, c_shape = _shape(scores), _shape(correct)
  if s_shape != c_shape:
    raise ValueError(f"scores shape {s_shape} must equal correct shape {c_shape}.")
  n = int(np.prod(s_shape))
  if n == 0:
    raise ValueError("empty input: selective-classification metrics need >= 1 sample.")
  scores = as_float_array(scores, "scores").reshape(n)
  correct = as_bool_array(correct, "correct").reshape(n)
  return scores, correct, flatten_mask(mask, s_shape)

def _argmax_block(num_classes: int) -> int:
  """A divisor of C in [16, 64] for the blocked argmax (0 when C is small or has none)."""
  if num_classes < 256:
    return 0
  for b in range(64, 15, -1):
    if num_classes % b == 0:
      return b
  return 0


def first_argmax(probs: jax.Array) -> jax.Array:
  """`argmax` over the last axis (first index on ties), blocked for large C.

  XLA:CPU vectorises max-reductions but not arg-reductions, so for C ≥ 256 the row is cut
  into contiguous blocks: a max per block, an argmax over the block maxima (the first block
  holding the row max), then an argmax inside that block — the same first index, ~2x faster.
  """
  num_classes = probs.shape[-1]
  b = _argmax_block(num_classes)
  if not b:
    return jnp.argmax(probs, axis=-1).astype(jnp.int32)
  blocks = probs.reshape(probs.shape[:-1] + (num_classes // b, b))
  block = jnp.argmax(jnp.max(blocks, axis=-1), axis=-1)
  inside = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]
  return (block * b + jnp.argmax(inside, axis=-1)).astype(jnp.int32)


def prediction_and_confidence(probs: jax.Array):
  """Argmax (first index on ties) and the max probability.

  The max is the same value as the entry at the argmax. Below the blocked-argmax size it is
  taken by a max-reduction (fused with the argmax's pass; the gather did not fuse with the
  binning scatters that follow on XLA:CPU); for large C the gather of one entry per row is
  cheaper than a second pass over the row.
  """
  pred = first_argmax(probs)
  if not _argmax_block(probs.shape[-1]):
    return pred, jnp.max(probs, axis=-1)
  return pred, jnp.take_along_axis(probs, pred[..., None], axis=-1)[..., 0]
