"""DeepLabV3 (Chen et al. 2017) and DeepLabV3+ (Chen et al. 2018) on a dilated ResNet.

DeepLabV3: the backbone runs at output stride 8 (stages 3 and 4 dilated) or 16 (stage 4
dilated); ASPP = a 1x1 conv branch, three 3x3 conv branches with atrous rates (12, 24, 36) at
stride 8 or (6, 12, 18) at stride 16, and an image-pooling branch (global average, 1x1 conv,
broadcast back), each with 256 filters + BN + ReLU; concatenation, 1x1 projection + BN + ReLU +
dropout; a 3x3 conv + BN + ReLU and the 1x1 classifier 'head' (torchvision's `DeepLabHead`).
DeepLabV3+: the ASPP output is upsampled to stride 4, concatenated with the stage-1 features
reduced to 48 channels (1x1 conv + BN + ReLU), then two 3x3 conv + BN + ReLU and the 'head'.
Logits are bilinearly resized (half-pixel centres = PyTorch `align_corners=False`) to the input
resolution: float32 [B, H, W, num_classes].

The backbone is `ResNetBackbone` under the name 'backbone', the same subtree as in the `ResNet`
classifier, so ImageNet ResNet weights load with `weights.restore_pretrained`. The backbone's
last feature map is sown as `intermediates/features` (and `intermediates/low_level` for V3+);
read it with `model.apply(..., mutable=['intermediates'])`.
"""
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from calib_jax.models import layers
from calib_jax.models import resnet

Array = layers.Array

# output stride -> (dilate stages 2, 3, 4; ASPP atrous rates)
OUTPUT_STRIDES = {
    8: ((False, True, True), (12, 24, 36)),
    16: ((False, False, True), (6, 12, 18)),
}


class ConvBNReLU(nn.Module):
  """Conv (optionally dilated) + BatchNorm + ReLU."""
  features: int
  kernel_size: int = 1
  dilation: int = 1
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    x = layers.conv(self.features, self.kernel_size, dilation=self.dilation, dtype=self.dtype,
                    name="conv")(x)
    return nn.relu(layers.batch_norm(train, self.dtype, self.axis_name, name="bn")(x))


class ASPP(nn.Module):
  """Atrous spatial pyramid pooling with an image-pooling branch, projected to `features`."""
  rates: Sequence[int]
  features: int = 256
  dropout_rate: float = 0.5
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    block = lambda k, d, name: ConvBNReLU(self.features, k, d, dtype=self.dtype,
                                          axis_name=self.axis_name, name=name)
    branches = [block(1, 1, "conv1x1")(x, train)]
    for i, rate in enumerate(self.rates):
      branches.append(block(3, rate, f"atrous{i}")(x, train))
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2), keepdims=True).astype(x.dtype)
    pooled = block(1, 1, "image_pooling")(pooled, train)
    branches.append(jnp.broadcast_to(pooled, x.shape[:3] + (self.features,)))
    y = block(1, 1, "project")(jnp.concatenate(branches, axis=-1), train)
    return nn.Dropout(self.dropout_rate, deterministic=not train)(y)


def _resize(x: Array, height: int, width: int) -> Array:
  """Bilinear resize of NHWC to (height, width), half-pixel centres, computed in float32."""
  shape = (x.shape[0], height, width, x.shape[3])
  return jax.image.resize(x.astype(jnp.float32), shape, "bilinear").astype(x.dtype)


class DeepLab(nn.Module):
  """DeepLabV3 / V3+ semantic segmentation network.

  Attributes:
    num_classes: classes per pixel (21 for VOC 2012, 19 for Cityscapes).
    depth: backbone ResNet depth (34, 50 or 101 are registered; 18 also works).
    plus: add the V3+ decoder.
    output_stride: 8 or 16 (backbone feature stride; picks the dilations and ASPP rates).
    aspp_features: filters of the ASPP / decoder convolutions.
    low_level_features: filters of the V3+ stage-1 reduction.
    dropout_rate: dropout after the ASPP projection (0.5 as torchvision / the paper's code).
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  depth: int = 50
  plus: bool = False
  output_stride: int = 8
  aspp_features: int = 256
  low_level_features: int = 48
  dropout_rate: float = 0.5
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if self.output_stride not in OUTPUT_STRIDES:
      raise ValueError(f"output_stride must be one of {sorted(OUTPUT_STRIDES)}, got "
                       f"{self.output_stride}")
    if self.depth not in resnet.RESNET_CONFIGS:
      raise ValueError(f"backbone depth must be one of {sorted(resnet.RESNET_CONFIGS)}, got "
                       f"{self.depth}")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, 3] to float32 per-pixel logits [B, H, W, num_classes]."""
    layers.check_image_batch(x, "DeepLab")
    height, width = x.shape[1:3]
    dilate, rates = OUTPUT_STRIDES[self.output_stride]
    block, stage_sizes = resnet.RESNET_CONFIGS[self.depth]
    features = resnet.ResNetBackbone(stage_sizes, block=block, stem="imagenet", dilate=dilate,
                                     dtype=self.dtype, axis_name=self.axis_name,
                                     name="backbone")(x, train)
    self.sow("intermediates", "features", features["stage4"])
    y = ASPP(rates, self.aspp_features, self.dropout_rate, dtype=self.dtype,
             axis_name=self.axis_name, name="aspp")(features["stage4"], train)
    block = lambda k, name: ConvBNReLU(self.aspp_features, k, dtype=self.dtype,
                                       axis_name=self.axis_name, name=name)
    if self.plus:
      low = features["stage1"]
      self.sow("intermediates", "low_level", low)
      low = ConvBNReLU(self.low_level_features, 1, dtype=self.dtype, axis_name=self.axis_name,
                       name="low_level_reduce")(low, train)
      y = _resize(y, low.shape[1], low.shape[2])
      y = jnp.concatenate([y, low], axis=-1)
      y = block(3, "decoder_conv1")(y, train)
      y = block(3, "decoder_conv2")(y, train)
    else:
      y = block(3, "decoder_conv1")(y, train)
    y = nn.Conv(self.num_classes, (1, 1), dtype=self.dtype, name="head")(y)
    return layers.as_logits(_resize(y, height, width))
