"""Checks shared by the ensemble functions: member-stacked logits `[M, ..., C]` and their
samples' labels `[...]`.

The checks run eagerly, on shapes and concrete values, before each public function hands the
arrays to its jitted program; they slice or reshape nothing on the device (outside `jit`, each
such operation compiles a program of its own per shape).
"""
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import arrays


def stack_members(members: Sequence[jax.typing.ArrayLike]) -> jax.Array:
  """Stacks M members' logits `[..., C]` into `[M, ..., C]` (float32).

  Members that disagree in shape raise a one-line ValueError naming the first one that differs.
  """
  if len(members) == 0:
    raise ValueError("an ensemble needs at least one member; got an empty sequence.")
  shapes = [tuple(np.shape(m)) for m in members]
  for index, shape in enumerate(shapes):
    if shape != shapes[0]:
      raise ValueError(f"ensemble members disagree in shape: member {index} has logits "
                       f"{shape} but member 0 has {shapes[0]}; all members need the same shape.")
  return jnp.stack([arrays.as_float_array(m, "logits") for m in members])


def member_logits(logits, min_members: int = 1) -> jax.Array:
  """Validates member-stacked logits `[M, ..., C]` (M >= `min_members`); float32.

  A list or tuple of per-member arrays is stacked first (`stack_members`).
  """
  if isinstance(logits, (list, tuple)):
    logits = stack_members(logits)
  shape = tuple(np.shape(logits))
  if len(shape) < 2:
    raise ValueError(f"member-stacked logits must have shape [M, ..., C] with at least 2 dims, "
                     f"got {shape}.")
  if shape[-1] < 1 or 0 in shape[1:-1]:
    raise ValueError(f"empty input: member-stacked logits have shape {shape}; need >= 1 sample "
                     "and class.")
  if shape[0] < min_members:
    raise ValueError(f"this needs at least {min_members} ensemble members (axis 0 of "
                     f"[M, ..., C]); got M = {shape[0]} (logits shape {shape}).")
  return arrays.as_float_array(logits, "logits")


def member_labels(logits: jax.Array, labels: jax.typing.ArrayLike,
                  mask: jax.typing.ArrayLike | None = None
                  ) -> tuple[jax.Array, jax.Array | None]:
  """Validates the labels `[...]` (and bool mask `[...]`) of member-stacked logits `[M, ..., C]`
  as `arrays.flatten_probs_labels` does for one member's `[..., C]`: the shape, and on concrete
  values (with its messages) the labels in `[0, C)` and a mask that selects something.

  Returns `(labels [N] int32, mask [N] bool or None)`, N the samples of `[...]`.
  """
  sample_shape, l_shape = tuple(logits.shape[1:-1]), tuple(np.shape(labels))
  if l_shape != sample_shape:
    raise ValueError(f"labels shape {l_shape} must equal the sample shape {sample_shape} of "
                     f"member-stacked logits {tuple(logits.shape)}.")
  labels = arrays.as_int_array(labels, "labels").reshape(int(np.prod(sample_shape)))
  mask = arrays.flatten_mask(mask, sample_shape)
  arrays.check_label_values(labels, logits.shape[-1], mask)
  return labels, mask
