"""VGG-16 for CIFAR with BatchNorm (the VGG16 of the label-relaxation experiments).

Thirteen 3x3 conv-BN-ReLU layers in five blocks (64, 64 | 128, 128 | 256 x3 | 512 x3 | 512 x3),
each block followed by a 2x2 max pool, then global average pooling (a 1x1 map for 32x32 inputs,
so the same as flattening), Dense(512)-BN-ReLU-dropout and a Dense 'head'. This is the layout of
the CIFAR VGG the paper's code uses (Geifman's `cifar10vgg`), which also puts dropout
(0.3 / 0.4) between convolutions; set `conv_dropout=True` for that.
"""
import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array

VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


class VGG16(nn.Module):
  """VGG-16 with BatchNorm for small images.

  Attributes:
    num_classes: number of output logits.
    classifier_width: width of the hidden Dense layer.
    dropout_rate: dropout before the head (0.5 as VGG).
    conv_dropout: dropout after every conv except the last of each block (0.3 in the first
      block, 0.4 elsewhere), as Geifman's CIFAR VGG.
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  classifier_width: int = 512
  dropout_rate: float = 0.5
  conv_dropout: bool = False
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, 3] (H, W multiples of 32) to float32 logits [B, num_classes]."""
    layers.check_image_batch(x, "VGG16")
    if x.shape[1] % 32 or x.shape[2] % 32:
      raise ValueError(f"VGG16 halves the resolution five times; H and W must be multiples of 32, "
                       f"got {x.shape[1]}x{x.shape[2]}")
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    x = x.astype(self.dtype)
    for b, widths in enumerate(VGG16_BLOCKS):
      for i, width in enumerate(widths):
        x = layers.conv(width, 3, dtype=self.dtype, name=f"conv{b + 1}_{i + 1}")(x)
        x = nn.relu(bn(f"bn{b + 1}_{i + 1}")(x))
        if self.conv_dropout and i < len(widths) - 1:
          x = nn.Dropout(0.3 if b == 0 else 0.4, deterministic=not train)(x)
      x = layers.max_pool(x, 2, 2)
    x = layers.FeatureMap(name="features")(x)  # What Grad-CAM reads; no variables.
    x = layers.global_avg_pool(x)
    x = nn.Dense(self.classifier_width, dtype=self.dtype, name="fc")(x)
    x = nn.relu(bn("fc_bn")(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x))
