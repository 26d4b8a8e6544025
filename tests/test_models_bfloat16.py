"""`dtype=bfloat16` in every model family: the convolutions and matmuls compute in bfloat16,
parameters and logits stay float32 (what `config.dtype='bfloat16'` promises for TPU/GPU)."""
import jax
import jax.numpy as jnp
import pytest

from calib_jax import models

# One model per family, with the smallest input it takes; DeepLab's bilinear resizes are
# float32 dots by design (`deeplab._resize`), counted separately.
CASES = [
    ("cifar_resnet20", (1, 32, 32, 3), 0),
    ("deeplabv3plus_resnet34", (1, 64, 64, 3), 4),
    ("small_cnn", (1, 32, 32, 3), 0),
    ("mlp", (1, 8, 8, 1), 0),
    ("vit_ti4", (1, 32, 32, 3), 0),
    ("gpool_cnn", (1, 16), 0),
]


def _dot_dtypes(jaxpr) -> list[str]:
  """Output dtypes of every dot/convolution of a jaxpr, sub-jaxprs included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
      found.append(str(eqn.outvars[0].aval.dtype))
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", None)
      if inner is not None:
        found += _dot_dtypes(getattr(inner, "jaxpr", inner))
  return found


@pytest.mark.parametrize("name,shape,float32_dots", CASES)
def test_bfloat16_activations_float32_parameters_and_logits(name, shape, float32_dots):
  kwargs = {"dtype": "bfloat16"}
  if "vocab_size" in models.valid_kwargs(name):
    kwargs["vocab_size"] = 100
  model = models.get(name, 10, **kwargs)
  x = jnp.zeros(shape, jnp.int32 if len(shape) == 2 else jnp.float32)
  variables = jax.eval_shape(lambda: model.init({"params": jax.random.key(0)}, x, train=False))
  assert {str(leaf.dtype) for leaf in jax.tree.leaves(variables)} == {"float32"}
  closed = jax.make_jaxpr(lambda v: model.apply(v, x, train=False))(variables)
  assert closed.out_avals[0].dtype == jnp.float32
  dots = _dot_dtypes(closed.jaxpr)
  assert dots.count("float32") == float32_dots
  assert dots.count("bfloat16") == len(dots) - float32_dots > 0
