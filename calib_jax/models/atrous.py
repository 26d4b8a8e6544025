"""Dilated ("atrous") convolutions, computed on GPUs as undilated ones on phase sub-grids.

A stride-1 k×k convolution with dilation d only ever combines pixels whose coordinates agree
modulo d:

    y[i, j] = Σ_{a,b} x[i + d·(a − c), j + d·(b − c)] · w[a, b]        c = k // 2

so it is the same as splitting the image into its d×d phase sub-grids (space-to-batch: pixel
(i, j) goes to sub-grid (i mod d, j mod d) at (i div d, j div d)), convolving every sub-grid with
the same kernel undilated, and interleaving the results back (batch-to-space). This is
TensorFlow's `atrous_conv2d` (and Yu & Koltun 2016, "Multi-scale context aggregation by dilated
convolutions"). The image is zero-padded at its end to a multiple of d first: those zeros stand
where the dilated convolution reads its own zero padding, and their outputs are dropped. The two
forms give the same values up to float rounding (the order of the sums).

Why: on an H200 in bfloat16, XLA ran the gradients of a dilated convolution about 6x slower
than those of the undilated convolution of the same FLOPs (64x64 maps, 512 and 2048 channels:
2.8-4.9 ms against 0.4-0.8 ms; the whole dilated step through PyTorch's cuDNN 0.6-2.1 ms;
BENCHMARKS.md), and DeepLabV3 at output stride 8 ran at 7.6x its roofline, 1.25x torchvision's
step. The sub-grid form runs only undilated convolutions, plus two transposes.

Status: `dilated_conv` uses the sub-grid form where the program is lowered for an NVIDIA GPU
(`jax.lax.platform_dependent`: decided when the program is compiled, also for the dry run's GPU
targets without a GPU), and XLA's own dilated convolution elsewhere. Timed on an H200
(`bench/dilated_conv.py`, bfloat16, 2026-11-26): the DeepLabV3-ResNet-50 step at output stride 8
takes 25.4 ms with the sub-grid form, 50.5 ms with XLA's dilated convolution and 40.2 ms in
torchvision; one ASPP branch (2048 -> 256 on 64x64, forward and both gradients) 1.4-1.7 ms
against 5.2-5.6 ms (cuDNN: 1.3-2.1 ms). Hence `GPU_FORM = "phases"`.
"""
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

_NHWC = ("NHWC", "HWIO", "NHWC")


def _check(kernel: jax.Array, dilation: int) -> None:
  if kernel.shape[0] != kernel.shape[1] or kernel.shape[0] % 2 == 0:
    raise ValueError(f"dilated convolutions take a square, odd-sized kernel, got "
                     f"{kernel.shape[:2]}")
  if dilation < 1:
    raise ValueError(f"dilation must be >= 1, got {dilation}")


def direct(x: jax.Array, kernel: jax.Array, dilation: int) -> jax.Array:
  """XLA's dilated convolution: NHWC `x`, HWIO `kernel`, stride 1, PyTorch's symmetric padding
  `(k // 2) * dilation` (the output has the input's height and width)."""
  _check(kernel, dilation)
  pad = (kernel.shape[0] // 2) * dilation
  return jax.lax.conv_general_dilated(x, kernel, (1, 1), ((pad, pad), (pad, pad)),
                                      rhs_dilation=(dilation, dilation),
                                      dimension_numbers=_NHWC)


def by_phases(x: jax.Array, kernel: jax.Array, dilation: int) -> jax.Array:
  """The same convolution as `direct`, as an undilated one on the d×d phase sub-grids."""
  _check(kernel, dilation)
  d = dilation
  batch, height, width, channels = x.shape
  rows, cols = -(-height // d), -(-width // d)  # each sub-grid's size after end-padding
  x = jnp.pad(x, ((0, 0), (0, rows * d - height), (0, cols * d - width), (0, 0)))
  # [B, rows, d, cols, d, C] -> [d, d, B, rows, cols, C]: sub-grid (p, q) holds (i·d+p, j·d+q).
  x = x.reshape(batch, rows, d, cols, d, channels).transpose(2, 4, 0, 1, 3, 5)
  x = x.reshape(d * d * batch, rows, cols, channels)
  pad = kernel.shape[0] // 2
  y = jax.lax.conv_general_dilated(x, kernel, (1, 1), ((pad, pad), (pad, pad)),
                                   dimension_numbers=_NHWC)
  out = y.shape[-1]
  y = y.reshape(d, d, batch, rows, cols, out).transpose(2, 3, 0, 4, 1, 5)
  return y.reshape(batch, rows * d, cols * d, out)[:, :height, :width]


# The form on NVIDIA GPUs, read when a program is traced: "phases" (`by_phases`) or "direct"
# (XLA's dilated convolution, as on TPU and CPU). "phases": 2x faster on an H200 (module
# docstring, bench/dilated_conv.py).
GPU_FORM = "phases"
_FORMS = {"phases": by_phases, "direct": direct}


def dilated_conv(x: jax.Array, kernel: jax.Array, dilation: int) -> jax.Array:
  """`direct(x, kernel, dilation)`, computed as `GPU_FORM` says when lowered for an NVIDIA
  GPU."""
  if dilation == 1:
    return direct(x, kernel, 1)
  if GPU_FORM not in _FORMS:
    raise ValueError(f"atrous.GPU_FORM must be one of {sorted(_FORMS)}, got {GPU_FORM!r}")
  return jax.lax.platform_dependent(
      x, kernel, cuda=functools.partial(_FORMS[GPU_FORM], dilation=dilation),
      default=functools.partial(direct, dilation=dilation))


class AtrousConv(nn.Module):
  """A stride-1 dilated convolution with `nn.Conv`'s parameters ('kernel' HWIO, 'bias') and
  dtype promotion, computed by `dilated_conv`.

  Attributes:
    features: output channels.
    kernel_size: k of the k×k kernel (odd).
    dilation: the atrous rate d.
    use_bias: add a bias.
    dtype: computation dtype (parameters stay float32).
    kernel_init, bias_init: initialisers.
  """
  features: int
  kernel_size: int
  dilation: int
  use_bias: bool = False
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    k = self.kernel_size
    kernel = self.param("kernel", self.kernel_init, (k, k, x.shape[-1], self.features),
                        jnp.float32)
    bias = (self.param("bias", self.bias_init, (self.features,), jnp.float32)
            if self.use_bias else None)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    y = dilated_conv(x, kernel, self.dilation)
    return y if bias is None else y + bias
