"""Building blocks shared by the model zoo: PyTorch-equivalent conv / BatchNorm and dtype helpers.

Every convolution pads explicitly and symmetrically (`k // 2 * dilation` on each side), as
PyTorch does, instead of XLA's 'SAME' (which pads stride-2 convolutions asymmetrically); this keeps
feature-map geometry and any converted PyTorch weights exactly equivalent.
"""
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from calib_jax.models import atrous

Dtype = Any
Array = jax.Array

# He-normal with fan-out, the torchvision / Caffe default for convolutions followed by ReLU.
conv_kernel_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")

BN_MOMENTUM = 0.9  # = PyTorch momentum 0.1 (flax weights the old statistic instead).
BN_EPSILON = 1e-5

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def canonical_dtype(dtype: Any) -> Dtype:
  """Returns the jnp dtype for `dtype` (a jnp/np dtype or its name), rejecting non-float types."""
  if isinstance(dtype, str):
    if dtype not in _DTYPES:
      raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]
  try:
    name = jnp.dtype(dtype).name
  except TypeError as e:
    raise ValueError(f"dtype must be a float dtype such as jnp.float32, got {dtype!r}") from e
  if name not in _DTYPES:
    raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}")
  return _DTYPES[name]


def batch_norm(train: bool, dtype: Dtype, axis_name: str | None, name: str | None = None,
               scale_init: Callable = nn.initializers.ones) -> nn.BatchNorm:
  """BatchNorm with PyTorch's defaults: momentum 0.9 (flax convention), epsilon 1e-5.

  Running variance is updated with the biased batch variance (flax), where PyTorch uses the
  unbiased one; the difference is a factor n/(n-1) with n = batch * height * width.

  Args:
    train: normalise with batch statistics and update the running averages.
    dtype: computation dtype; statistics are always reduced in float32.
    axis_name: mapped axis over which to average the batch statistics (pmap / shard_map).
    name: submodule name.
    scale_init: initialiser of the scale (gamma).
  """
  return nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
                      dtype=dtype, axis_name=axis_name, scale_init=scale_init, name=name)


def conv(features: int, kernel_size: int, *, strides: int = 1, dilation: int = 1,
         use_bias: bool = False, dtype: Dtype = jnp.float32, name: str | None = None,
         kernel_init: Callable = conv_kernel_init) -> nn.Conv:
  """Square 2-D convolution with PyTorch-style symmetric padding `(k // 2) * dilation`.

  A dilated stride-1 convolution is an `atrous.AtrousConv` (the same parameters and values),
  which can run on GPUs as an undilated convolution on phase sub-grids (`atrous.GPU_FORM`)."""
  if dilation > 1 and strides == 1 and kernel_size % 2 == 1:
    return atrous.AtrousConv(features, kernel_size, dilation, use_bias=use_bias, dtype=dtype,
                             kernel_init=kernel_init, name=name)
  pad = (kernel_size // 2) * dilation
  return nn.Conv(features, (kernel_size, kernel_size), strides=(strides, strides),
                 padding=((pad, pad), (pad, pad)), kernel_dilation=(dilation, dilation),
                 use_bias=use_bias, dtype=dtype, kernel_init=kernel_init, name=name)


class FeatureMap(nn.Module):
  """The identity, as a parameter-free module: marks the feature map that class activation maps
  read (`calib_jax.explain` differentiates with respect to a module's output). It adds no
  variables, so checkpoints and imported weights are unaffected."""

  @nn.compact
  def __call__(self, x: Array) -> Array:
    return x


def max_pool(x: Array, window: int, strides: int, padding: int = 0) -> Array:
  """Max pooling over H, W with symmetric padding (padded entries never win, like PyTorch)."""
  return nn.max_pool(x, (window, window), strides=(strides, strides),
                     padding=((padding, padding), (padding, padding)))


def global_avg_pool(x: Array) -> Array:
  """Mean over the spatial axes of an NHWC tensor, accumulated in float32."""
  return jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(x.dtype)


def as_logits(x: Array) -> Array:
  """Casts the network output to float32, the dtype every loss and metric expects."""
  return x.astype(jnp.float32)


def check_image_batch(x: Array, model: str) -> None:
  """Raises a clear error unless `x` is a float NHWC image batch."""
  if x.ndim != 4:
    raise ValueError(f"{model} expects images of shape [B, H, W, C], got shape {tuple(x.shape)}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{model} expects float images, got dtype {x.dtype}")


def param_count(tree: Any) -> int:
  """Number of scalars in a pytree of arrays (or ShapeDtypeStructs, e.g. from `jax.eval_shape`)."""
  return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)))
