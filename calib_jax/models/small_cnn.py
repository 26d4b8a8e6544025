"""A small, fast conv net with BatchNorm: the default demo model and the loss-overhead benchmark.

Three stages of 3x3 conv - BN - ReLU (32, 64, 128 filters) with a 2x2 max pool after the first
two, global average pooling and a Dense 'head': about 94 K parameters and 10 M multiply-adds per
32x32x3 image, so a CIFAR-10 epoch takes a few minutes on two CPU cores.
"""
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array


class SmallCNN(nn.Module):
  """conv-BN-ReLU stages, max pool between them, global average pool, Dense 'head'.

  Attributes:
    num_classes: number of output logits.
    widths: filters of each stage.
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  widths: Sequence[int] = (32, 64, 128)
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if not self.widths or any(int(w) < 1 for w in self.widths):
      raise ValueError(f"widths must be a non-empty sequence of positive ints, got {self.widths}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, C] to float32 logits [B, num_classes]."""
    layers.check_image_batch(x, "SmallCNN")
    x = x.astype(self.dtype)
    for i, width in enumerate(self.widths):
      if i > 0:
        x = layers.max_pool(x, 2, 2)
      x = layers.conv(int(width), 3, dtype=self.dtype, name=f"conv{i}")(x)
      x = nn.relu(layers.batch_norm(train, self.dtype, self.axis_name, name=f"bn{i}")(x))
    x = layers.FeatureMap(name="features")(x)  # What Grad-CAM reads (`calib_jax.explain`).
    x = layers.global_avg_pool(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x))
