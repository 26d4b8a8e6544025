"""Fully connected ReLU network: the 2x1024 MLP of the label-relaxation MNIST experiments."""
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array

# Initialisers of the Dense kernels, by name (biases start at zero). 'lecun_normal' is Flax's
# default; 'glorot_uniform' is Keras's, which the label-relaxation paper's official MLP uses.
KERNEL_INITS = {
    "lecun_normal": nn.initializers.lecun_normal(),
    "glorot_uniform": nn.initializers.glorot_uniform(),
    "he_normal": nn.initializers.he_normal(),
}


class MLP(nn.Module):
  """Flattens the input, applies Dense-ReLU(-dropout) layers, then a Dense 'head'.

  Attributes:
    num_classes: number of output logits.
    hidden: widths of the hidden layers.
    dropout_rate: dropout after each hidden layer.
    kernel_init: a name of `KERNEL_INITS`, for every Dense kernel.
    dtype: computation dtype; parameters and logits are float32.
    axis_name: accepted for a uniform model interface; unused (no BatchNorm).
  """
  num_classes: int
  hidden: Sequence[int] = (1024, 1024)
  dropout_rate: float = 0.0
  kernel_init: str = "lecun_normal"
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if not self.hidden or any(int(h) < 1 for h in self.hidden):
      raise ValueError(f"hidden must be a non-empty sequence of positive widths, got {self.hidden}")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    if self.kernel_init not in KERNEL_INITS:
      raise ValueError(f"kernel_init must be one of {tuple(KERNEL_INITS)}, got "
                       f"{self.kernel_init!r}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps inputs [B, ...] (e.g. images [B, 28, 28, 1]) to float32 logits [B, num_classes]."""
    if x.ndim < 2:
      raise ValueError(f"MLP expects a batch [B, ...], got shape {tuple(x.shape)}")
    x = x.reshape(x.shape[0], -1).astype(self.dtype)
    init = KERNEL_INITS[self.kernel_init]
    for i, width in enumerate(self.hidden):
      x = nn.relu(nn.Dense(int(width), dtype=self.dtype, kernel_init=init, name=f"dense{i}")(x))
      x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return layers.as_logits(
        nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=init, name="head")(x))
