"""DenseNet-BC (Huang et al. 2017) for 32x32 inputs; DenseNet-BC-100-12 has about 0.8 M parameters.

Depth L = 6n+4: a 3x3 conv with 2k filters, three dense blocks of n bottleneck layers
(BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3(k), output concatenated to the input), transitions
BN-ReLU-conv1x1(floor(theta*c))-avgpool2 between blocks (theta = 0.5), then BN-ReLU, global
average pool and a Dense 'head'. The label-relaxation code builds the same network.
"""
import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array


class DenseLayer(nn.Module):
  """Bottleneck layer producing `growth_rate` new feature maps, concatenated to its input."""
  growth_rate: int
  dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    bn = lambda name: layers.batch_norm(train, self.dtype, self.axis_name, name=name)
    dropout = nn.Dropout(self.dropout_rate, deterministic=not train)
    y = layers.conv(4 * self.growth_rate, 1, dtype=self.dtype, name="conv1")(nn.relu(bn("bn1")(x)))
    y = dropout(y)
    y = layers.conv(self.growth_rate, 3, dtype=self.dtype, name="conv2")(nn.relu(bn("bn2")(y)))
    y = dropout(y)
    return jnp.concatenate([x, y], axis=-1)


class Transition(nn.Module):
  """BN-ReLU-conv1x1 compression followed by 2x2 average pooling."""
  features: int
  dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    x = nn.relu(layers.batch_norm(train, self.dtype, self.axis_name, name="bn")(x))
    x = layers.conv(self.features, 1, dtype=self.dtype, name="conv")(x)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.avg_pool(x, (2, 2), strides=(2, 2))


class DenseNetBC(nn.Module):
  """DenseNet-BC-L-k.

  Attributes:
    num_classes: number of output logits.
    depth: L = 6n+4 (100 -> 16 layers per block).
    growth_rate: k.
    compression: theta, the fraction of channels a transition keeps.
    dropout_rate: dropout after each convolution (0 in the paper's data-augmented runs).
    dtype: computation dtype; parameters and logits are float32.
    axis_name: BatchNorm cross-device axis.
  """
  num_classes: int
  depth: int = 100
  growth_rate: int = 12
  compression: float = 0.5
  dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if self.depth < 10 or (self.depth - 4) % 6:
      raise ValueError(f"DenseNet-BC depth must be 6n+4 (e.g. 100), got {self.depth}")
    if not 0.0 < self.compression <= 1.0:
      raise ValueError(f"compression must be in (0, 1], got {self.compression}")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, H, W, 3] to float32 logits [B, num_classes]."""
    layers.check_image_batch(x, "DenseNetBC")
    layers_per_block = (self.depth - 4) // 6
    x = layers.conv(2 * self.growth_rate, 3, dtype=self.dtype, name="stem_conv")(
        x.astype(self.dtype))
    for block in range(3):
      for i in range(layers_per_block):
        x = DenseLayer(self.growth_rate, self.dropout_rate, dtype=self.dtype,
                       axis_name=self.axis_name, name=f"block{block + 1}_layer{i}")(x, train)
      if block < 2:
        x = Transition(int(x.shape[-1] * self.compression), self.dropout_rate, dtype=self.dtype,
                       axis_name=self.axis_name, name=f"transition{block + 1}")(x, train)
    x = nn.relu(layers.batch_norm(train, self.dtype, self.axis_name, name="final_bn")(x))
    x = layers.FeatureMap(name="features")(x)  # What Grad-CAM reads; no variables.
    x = layers.global_avg_pool(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x))
