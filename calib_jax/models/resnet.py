"""ResNet v1 (He et al. 2016) for ImageNet-style inputs, with a CIFAR stem and dilation options.

The layout is torchvision's ("v1.5": the stride of a bottleneck block sits on its 3x3
convolution), so parameter counts equal the published ones (ResNet-50: 25,557,032) and the
parameter tree mirrors torchvision's modules one to one.

The classifier is `ResNet = ResNetBackbone (name 'backbone') + global average pool + Dense 'head'`;
DeepLab uses the same `ResNetBackbone` under the same name, so ImageNet weights restore into it
with `weights.restore_pretrained`.
"""
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array

# depth -> (block type, blocks per stage)
RESNET_CONFIGS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
STEMS = ("imagenet", "cifar")
STAGE_WIDTHS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
  """Two 3x3 conv-BN layers with an identity or 1x1-conv-BN projection shortcut."""
  features: int
  strides: int = 1
  dilation: int = 1
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  expansion = 1

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    y = layers.conv(self.features, 3, strides=self.strides, dilation=self.dilation,
                    dtype=self.dtype, name="conv1")(x)
    y = nn.relu(bn("bn1")(y))
    y = layers.conv(self.features, 3, dilation=self.dilation, dtype=self.dtype, name="conv2")(y)
    y = bn("bn2")(y)
    return nn.relu(y + _shortcut(self, x, self.features, train))


class Bottleneck(nn.Module):
  """1x1 (reduce) - 3x3 (strided, dilated) - 1x1 (expand x4) conv-BN block."""
  features: int
  strides: int = 1
  dilation: int = 1
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  expansion = 4

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    y = layers.conv(self.features, 1, dtype=self.dtype, name="conv1")(x)
    y = nn.relu(bn("bn1")(y))
    y = layers.conv(self.features, 3, strides=self.strides, dilation=self.dilation,
                    dtype=self.dtype, name="conv2")(y)
    y = nn.relu(bn("bn2")(y))
    out_features = self.features * self.expansion
    y = layers.conv(out_features, 1, dtype=self.dtype, name="conv3")(y)
    y = bn("bn3")(y)
    return nn.relu(y + _shortcut(self, x, out_features, train))


def _shortcut(block: nn.Module, x: Array, out_features: int, train: bool) -> Array:
  """Identity, or a strided 1x1 conv + BN where the shape changes (option B of He et al.)."""
  if block.strides == 1 and x.shape[-1] == out_features:
    return x
  # Called from inside the block's compact __call__, so these submodules belong to the block.
  x = layers.conv(out_features, 1, strides=block.strides, dtype=block.dtype,
                  name="downsample_conv")(x)
  return layers.batch_norm(train, block.dtype, block.axis_name, name="downsample_bn")(x)


_BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNetBackbone(nn.Module):
  """ResNet stem and four stages; returns every stage's feature map.

  Attributes:
    stage_sizes: blocks per stage (4 entries).
    block: 'basic' or 'bottleneck'.
    stem: 'imagenet' (7x7/2 conv + 3x3/2 max pool, output stride 32) or 'cifar' (3x3/1 conv, no
      pool, output stride 8) for 32x32 / 64x64 inputs.
    dilate: for stages 2, 3, 4, replace the stage's stride 2 by dilation (torchvision's
      `replace_stride_with_dilation`); (False, True, True) gives output stride 8 with the
      ImageNet stem, (False, False, True) gives 16.
    dtype: computation dtype (parameters stay float32).
    axis_name: BatchNorm cross-device axis.
  """
  stage_sizes: Sequence[int]
  block: str = "bottleneck"
  stem: str = "imagenet"
  dilate: tuple[bool, bool, bool] = (False, False, False)
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> dict[str, Array]:
    """Returns {'stem', 'stage1', ..., 'stage4'} feature maps (NHWC, computation dtype)."""
    layers.check_image_batch(x, "ResNet")
    x = x.astype(self.dtype)
    if self.stem == "imagenet":
      x = layers.conv(64, 7, strides=2, dtype=self.dtype, name="stem_conv")(x)
    elif self.stem == "cifar":
      x = layers.conv(64, 3, dtype=self.dtype, name="stem_conv")(x)
    else:
      raise ValueError(f"stem must be one of {STEMS}, got {self.stem!r}")
    x = nn.relu(layers.batch_norm(train, self.dtype, self.axis_name, name="stem_bn")(x))
    if self.stem == "imagenet":
      x = layers.max_pool(x, 3, 2, padding=1)
    features = {"stem": x}

    block_cls = _BLOCKS[self.block]
    dilation = 1
    for stage, (num_blocks, width) in enumerate(zip(self.stage_sizes, STAGE_WIDTHS)):
      strides = 1 if stage == 0 else 2
      # As torchvision: the first block of a dilated stage keeps the previous dilation.
      first_dilation = dilation
      if stage > 0 and self.dilate[stage - 1]:
        dilation *= strides
        strides = 1
      for i in range(num_blocks):
        x = block_cls(width, strides=strides if i == 0 else 1,
                      dilation=first_dilation if i == 0 else dilation, dtype=self.dtype,
                      axis_name=self.axis_name, name=f"stage{stage + 1}_block{i}")(x, train)
      features[f"stage{stage + 1}"] = x
    return features


class ResNet(nn.Module):
  """ResNet-{18,34,50,101,152} classifier: backbone, global average pool, Dense 'head'.

  Attributes:
    num_classes: number of output logits.
    depth: 18, 34, 50, 101 or 152.
    stem: 'imagenet' or 'cifar' (see `ResNetBackbone`).
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  depth: int = 50
  stem: str = "imagenet"
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if self.depth not in RESNET_CONFIGS:
      raise ValueError(f"ResNet depth must be one of {sorted(RESNET_CONFIGS)}, got {self.depth}")
    if self.stem not in STEMS:
      raise ValueError(f"stem must be one of {STEMS}, got {self.stem!r}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, 3] to float32 logits [B, num_classes]."""
    block, stage_sizes = RESNET_CONFIGS[self.depth]
    features = ResNetBackbone(stage_sizes, block=block, stem=self.stem, dtype=self.dtype,
                              axis_name=self.axis_name, name="backbone")(x, train)
    # Marks the map Grad-CAM reads (`calib_jax.explain`); no variables.
    x = layers.global_avg_pool(layers.FeatureMap(name="features")(features["stage4"]))
    x = nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x)
    return layers.as_logits(x)
