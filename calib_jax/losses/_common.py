"""Input checking and reductions shared by every loss.

Losses see float32 logits `[..., C]`, int labels `[...]` that are safe to index with (labels at
masked positions are replaced by 0), and float32 weights `[...]` (1 = valid, 0 = ignored).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class LossInputs(NamedTuple):
  logits: jax.Array       # float32 [..., C]
  labels: jax.Array       # int32 [...], in [0, C) wherever weights > 0
  weights: jax.Array      # float32 [...], 1.0 valid / 0.0 ignored
  objectness: jax.Array | None  # float32 [...] or None


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def prepare(name: str, logits, labels, mask, objectness) -> LossInputs:
  """Checks shapes/dtypes and converts to the canonical float32 form.

  Shape and dtype errors are raised even under `jit` (shapes are static). Value errors (labels out
  of range, objectness > 1) are raised when the arrays are concrete; under tracing an out-of-range
  label at a valid position turns the loss into NaN so it cannot pass silently (the trainer stops on
  a non-finite loss).
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  if logits.ndim < 2:
    raise ValueError(f"{name}: logits must be [..., C] with at least one batch dim, got shape "
                     f"{logits.shape}")
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise TypeError(f"{name}: logits must be floating point, got {logits.dtype}")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f"{name}: labels must be integer class indices, got {labels.dtype}")
  if labels.shape != logits.shape[:-1]:
    raise ValueError(f"{name}: labels shape {labels.shape} must equal logits shape without the class "
                     f"axis {logits.shape[:-1]}")
  num_classes = logits.shape[-1]
  if num_classes < 2:
    raise ValueError(f"{name}: logits must have at least 2 classes on the last axis, got "
                     f"shape {logits.shape}")

  if mask is None:
    valid = jnp.ones(labels.shape, bool)
  else:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise TypeError(f"{name}: mask must be boolean, got {mask.dtype}")
    if mask.shape != labels.shape:
      raise ValueError(f"{name}: mask shape {mask.shape} must equal labels shape {labels.shape}")
    valid = mask

  in_range = (labels >= 0) & (labels < num_classes)
  if _is_concrete(labels) and _is_concrete(valid):
    bad = np.asarray(valid & ~in_range)
    if bad.any():
      value = np.asarray(labels)[bad].flat[0]
      raise ValueError(f"{name}: label {value} out of range [0, {num_classes}) at a valid position "
                       "(mask it out, e.g. for an ignore index)")

  if objectness is not None:
    objectness = _broadcast_objectness(name, objectness, labels.shape)

  logits = logits.astype(jnp.float32)
  poison = jnp.where(valid & ~in_range, jnp.nan, 0.0)  # only reachable under tracing
  logits = logits + poison[..., None]
  return LossInputs(logits=logits,
                    labels=jnp.where(valid & in_range, labels, 0).astype(jnp.int32),
                    weights=valid.astype(jnp.float32),
                    objectness=objectness)


def _broadcast_objectness(name: str, objectness, label_shape) -> jax.Array:
  objectness = jnp.asarray(objectness)
  if not jnp.issubdtype(objectness.dtype, jnp.floating):
    raise TypeError(f"{name}: objectness must be floating point, got {objectness.dtype}")
  shape = objectness.shape
  if shape != tuple(label_shape[:len(shape)]):
    raise ValueError(f"{name}: objectness shape {shape} must equal the labels shape {label_shape} "
                     "or a leading part of it (e.g. [B] for per-pixel labels [B, H, W])")
  if _is_concrete(objectness) and bool(np.any(np.asarray(objectness) > 1.0)):
    raise ValueError(f"{name}: objectness must be in [0, 1] (or < 0 for context-only samples), got "
                     f"max {float(np.max(np.asarray(objectness)))}")
  objectness = objectness.astype(jnp.float32).reshape(shape + (1,) * (len(label_shape) - len(shape)))
  return jnp.broadcast_to(objectness, label_shape)


def masked_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
  """Mean of `values` over entries with weight 1; 0.0 (not NaN) when nothing is valid."""
  # `where`, not a product: an invalid entry's value may be inf/NaN (e.g. a padding example).
  total = jnp.sum(jnp.where(weights > 0, values, 0.0))
  return total / jnp.maximum(jnp.sum(weights), 1.0)


def take_label(values: jax.Array, labels: jax.Array) -> jax.Array:
  """`values[..., y]` along the class axis (e.g. `log p_y`); the gradient reaches entry y only."""
  return jnp.take_along_axis(values, labels[..., None], axis=-1)[..., 0]


def predicted_logit(logits: jax.Array) -> jax.Array:
  """`z_ŷ` with ŷ = argmax (first index on ties); its gradient goes to ŷ alone, as torch.max does."""
  top = jnp.argmax(logits, axis=-1)
  return jnp.take_along_axis(logits, top[..., None], axis=-1)[..., 0]
