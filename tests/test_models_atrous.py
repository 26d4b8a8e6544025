"""`models.atrous`: a dilated convolution as an undilated one on phase sub-grids (on GPUs),
equal to XLA's dilated convolution in values, gradients and parameters."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.models import atrous, layers


@pytest.mark.parametrize("shape, dilation, kernel_size", [
    ((2, 12, 12, 3), 2, 3),    # sizes a multiple of d
    ((2, 13, 17, 4), 3, 3),    # not a multiple: end-padding
    ((1, 9, 7, 2), 12, 3),     # d larger than the image: every tap but the centre is padding
    ((2, 20, 11, 3), 4, 5)])   # a 5x5 kernel
def test_by_phases_equals_the_dilated_convolution_in_values_and_gradients(shape, dilation,
                                                                          kernel_size):
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], shape)
  kernel = jax.random.normal(keys[1], (kernel_size, kernel_size, shape[-1], 5))
  g = jax.random.normal(keys[2], shape[:3] + (5,))
  expected = atrous.direct(x, kernel, dilation)
  got = atrous.by_phases(x, kernel, dilation)
  assert got.shape == expected.shape == shape[:3] + (5,)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

  def loss(form):
    return lambda x, k: jnp.sum(form(x, k, dilation) * g)

  for got_grad, expected_grad in zip(jax.grad(loss(atrous.by_phases), (0, 1))(x, kernel),
                                     jax.grad(loss(atrous.direct), (0, 1))(x, kernel)):
    np.testing.assert_allclose(got_grad, expected_grad, rtol=1e-4, atol=1e-4)


def test_the_dilated_layer_keeps_nn_conv_parameters_and_values():
  x = jax.random.normal(jax.random.key(1), (2, 10, 10, 4), jnp.float32)
  new = layers.conv(6, 3, dilation=2, dtype=jnp.bfloat16)
  pad = 2
  old = nn.Conv(6, (3, 3), padding=((pad, pad), (pad, pad)), kernel_dilation=(2, 2),
                use_bias=False, dtype=jnp.bfloat16, kernel_init=layers.conv_kernel_init)
  assert isinstance(new, atrous.AtrousConv)
  variables = old.init(jax.random.key(2), x)
  assert (jax.tree.map(jnp.shape, new.init(jax.random.key(2), x)) ==
          jax.tree.map(jnp.shape, variables))
  y_new, y_old = new.apply(variables, x), old.apply(variables, x)
  assert y_new.dtype == y_old.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y_new, np.float32), np.asarray(y_old, np.float32))


def _stablehlo(platform: str, dilation: int) -> str:
  x = jax.ShapeDtypeStruct((1, 16, 16, 2), jnp.float32)
  kernel = jax.ShapeDtypeStruct((3, 3, 2, 2), jnp.float32)
  fn = jax.jit(lambda x, k: atrous.dilated_conv(x, k, dilation))
  return jax.export.export(fn, platforms=[platform])(x, kernel).mlir_module()


def test_the_form_is_chosen_by_the_platform_the_program_is_lowered_for(monkeypatch):
  # XLA's dilated convolution carries the rate as the kernel's dilation; the sub-grid form
  # convolves undilated after a transpose.
  monkeypatch.setattr(atrous, "GPU_FORM", "phases")
  assert "rhs_dilate = [4, 4]" in _stablehlo("cpu", 4)
  assert "rhs_dilate = [4, 4]" in _stablehlo("tpu", 4)
  cuda = _stablehlo("cuda", 4)
  assert "rhs_dilate = [4, 4]" not in cuda and "stablehlo.transpose" in cuda


def test_a_kernel_of_even_size_is_one_line():
  with pytest.raises(ValueError, match=r"square, odd-sized kernel, got \(2, 2\)"):
    atrous.by_phases(jnp.zeros((1, 4, 4, 1)), jnp.zeros((2, 2, 1, 1)), 2)


def test_gpu_form_phases_the_default_and_direct_keeps_xlas_dilated_convolution(monkeypatch):
  assert atrous.GPU_FORM == "phases"  # measured 2x faster on an H200 (BENCHMARKS.md)
  assert "rhs_dilate = [4, 4]" not in _stablehlo("cuda", 4)
  monkeypatch.setattr(atrous, "GPU_FORM", "direct")
  assert "rhs_dilate = [4, 4]" in _stablehlo("cuda", 4)
  monkeypatch.setattr(atrous, "GPU_FORM", "fast")
  with pytest.raises(ValueError,
                     match=r"GPU_FORM must be one of \['direct', 'phases'\], got 'fast'"):
    _stablehlo("cuda", 4)
