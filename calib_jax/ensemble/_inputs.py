"""Shape checks shared by the ensemble functions: member-stacked logits `[M, ..., C]`."""
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
