"""The CIFAR ResNets: v1 (He et al. 2016, Sec. 4.2) and the pre-activation v2 of label relaxation.

v1, depth 6n+2 (20, 32, 44, 56, 110): a 3x3/16 conv, three stages of n basic blocks with
16/32/64 filters (stride 2 at stages 2 and 3), global average pool, Dense 'head'.
Shortcuts use option A by default, as the paper's CIFAR experiments: identity, and where the
shape changes a stride-2 subsample zero-padded to the new width, so no extra parameters
(ResNet-20: 0.27 M, ResNet-56: 0.85 M). Option B (1x1 conv + BN projections) is available.

v2, depth 9n+2 (56 for n=6): the model called "ResNet56 (V2)" by Lienen & Huellermeier (AAAI 2021,
label relaxation). Their code builds the Keras `cifar10_resnet` example's ResNet v2: the
pre-activation ("Identity mappings", He et al. 2016) *bottleneck* network, with
  conv 3x3/16 - BN - ReLU;
  three stages of n units BN-ReLU-conv1x1(w) - BN-ReLU-conv3x3(w) - BN-ReLU-conv1x1(4w|2w),
  stage widths w = 16, 64, 128 and outputs 64, 128, 256; the stride 2 of stages 2 and 3 sits on
  the unit's first 1x1 conv; the first unit of each stage has a 1x1-conv projection shortcut
  applied to the un-normalised input, and the very first unit skips its BN-ReLU (the stem
  already ends with one);
  final BN - ReLU - global average pool - Dense.
Differences from that code: convolutions have no bias (each feeds a BatchNorm, directly or
through the residual sum, so a bias is redundant) and no L2 kernel regulariser (weight decay is
the optimiser's job here).
"""
import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array

SHORTCUTS = ("A", "B")


class CifarBasicBlock(nn.Module):
  """Post-activation basic block with an option A or B shortcut."""
  features: int
  strides: int = 1
  shortcut: str = "A"
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    y = layers.conv(self.features, 3, strides=self.strides, dtype=self.dtype, name="conv1")(x)
    y = nn.relu(bn("bn1")(y))
    y = layers.conv(self.features, 3, dtype=self.dtype, name="conv2")(y)
    y = bn("bn2")(y)
    if self.strides != 1 or x.shape[-1] != self.features:
      if self.shortcut == "A":
        x = x[:, ::self.strides, ::self.strides, :]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, self.features - x.shape[-1])))
      else:
        x = layers.conv(self.features, 1, strides=self.strides, dtype=self.dtype,
                        name="downsample_conv")(x)
        x = bn("downsample_bn")(x)
    return nn.relu(y + x)


class CifarResNet(nn.Module):
  """ResNet-(6n+2) for 32x32 inputs (He et al. 2016, v1).

  Attributes:
    num_classes: number of output logits.
    depth: 6n+2, e.g. 20, 32, 44, 56, 110.
    shortcut: 'A' (parameter-free zero-padding, the paper's CIFAR choice) or 'B' (projection).
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  depth: int = 20
  shortcut: str = "A"
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if self.depth < 8 or (self.depth - 2) % 6:
      raise ValueError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 44, 56, 110), got {self.depth}")
    if self.shortcut not in SHORTCUTS:
      raise ValueError(f"shortcut must be one of {SHORTCUTS}, got {self.shortcut!r}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, 3] to float32 logits [B, num_classes]."""
    layers.check_image_batch(x, "CifarResNet")
    x = layers.conv(16, 3, dtype=self.dtype, name="stem_conv")(x.astype(self.dtype))
    x = nn.relu(layers.batch_norm(train, self.dtype, self.axis_name, name="stem_bn")(x))
    blocks_per_stage = (self.depth - 2) // 6
    for stage, width in enumerate((16, 32, 64)):
      for i in range(blocks_per_stage):
        strides = 2 if stage > 0 and i == 0 else 1
        x = CifarBasicBlock(width, strides=strides, shortcut=self.shortcut, dtype=self.dtype,
                            axis_name=self.axis_name,
                            name=f"stage{stage + 1}_block{i}")(x, train)
    x = layers.FeatureMap(name="features")(x)  # What Grad-CAM reads; no variables.
    x = layers.global_avg_pool(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x))


class PreActBottleneck(nn.Module):
  """Pre-activation bottleneck unit of the Keras ResNet v2 (see the module docstring)."""
  width: int
  out_features: int
  strides: int = 1
  preactivate: bool = True
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    y = nn.relu(bn("bn1")(x)) if self.preactivate else x
    y = layers.conv(self.width, 1, strides=self.strides, dtype=self.dtype, name="conv1")(y)
    y = layers.conv(self.width, 3, dtype=self.dtype, name="conv2")(nn.relu(bn("bn2")(y)))
    y = layers.conv(self.out_features, 1, dtype=self.dtype, name="conv3")(nn.relu(bn("bn3")(y)))
    if self.strides != 1 or x.shape[-1] != self.out_features:
      x = layers.conv(self.out_features, 1, strides=self.strides, dtype=self.dtype,
                      name="shortcut_conv")(x)
    return x + y


class CifarPreActResNet(nn.Module):
  """Pre-activation bottleneck ResNet-(9n+2) for 32x32 inputs ("ResNet56 (V2)", n = 6).

  Attributes:
    num_classes: number of output logits.
    depth: 9n+2 (56 in the label-relaxation paper).
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  depth: int = 56
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if self.depth < 11 or (self.depth - 2) % 9:
      raise ValueError(f"pre-activation CIFAR ResNet depth must be 9n+2 (e.g. 56), got {self.depth}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, 3] to float32 logits [B, num_classes]."""
    layers.check_image_batch(x, "CifarPreActResNet")
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    x = layers.conv(16, 3, dtype=self.dtype, name="stem_conv")(x.astype(self.dtype))
    x = nn.relu(bn("stem_bn")(x))
    units_per_stage = (self.depth - 2) // 9
    width = 16
    for stage in range(3):
      out_features = width * 4 if stage == 0 else width * 2
      for i in range(units_per_stage):
        x = PreActBottleneck(width, out_features, strides=2 if stage > 0 and i == 0 else 1,
                             preactivate=not (stage == 0 and i == 0), dtype=self.dtype,
                             axis_name=self.axis_name,
                             name=f"stage{stage + 1}_block{i}")(x, train)
      width = out_features
    x = layers.FeatureMap(name="features")(nn.relu(bn("final_bn")(x)))  # Read by Grad-CAM.
    x = layers.global_avg_pool(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x))
