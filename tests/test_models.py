"""Tests of the model zoo: registry, shapes, dtypes, BatchNorm and dropout (parameter counts and
geometry: test_models_architectures.py).

Big models are only traced (`jax.eval_shape`, `jax.make_jaxpr`); real forwards run on the small
models with tiny inputs.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import models
from calib_jax.models import vit

KEY = jax.random.key(0)


@functools.lru_cache(maxsize=None)
def abstract_model(name, num_classes, input_shape, input_dtype="float32", **kw):
  """(model, abstract variables, abstract eval logits) for `name`, traced only."""
  model = models.get(name, num_classes, **kw)
  x = jax.ShapeDtypeStruct(input_shape, jnp.dtype(input_dtype))
  # One trace: init's own forward pass in eval mode is `apply(variables, x, train=False)`.
  logits, variables = jax.eval_shape(
      lambda x: model.init_with_output({"params": KEY}, x, train=False), x)
  return model, variables, logits


def drawn_variables(model, x, seed=0):
  """(abstract, drawn) variables of `model` for inputs like `x`: init's tree, traced only, with
  numpy values drawn as init draws them (signed fan-in-scaled kernels, zero biases, BatchNorm's
  initial scale and statistics), for tests that need no init values: compiling init's random
  numbers was ~3 of 4.5 CPU-s of a ResNet-18 forward and Grad-CAM (2026-11-29)."""
  abstract = jax.eval_shape(lambda x: model.init({"params": KEY}, x, train=False), x)
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    if path[-1].key == "kernel":
      return rng.standard_normal(leaf.shape, np.float32) / np.sqrt(leaf.size / leaf.shape[-1],
                                                                   dtype=np.float32)
    return (np.ones if path[-1].key in ("scale", "var") else np.zeros)(leaf.shape, leaf.dtype)

  return abstract, jax.tree_util.tree_map_with_path(draw, abstract)


def tiny_input(name):
  """A small valid input shape (and dtype) for the registered model `name`."""
  if name == "gpool_cnn":
    return (2, 12), "int32"
  if name == "mlp":
    return (2, 28, 28, 1), "float32"
  return (2, 32, 32, 3), "float32"


def tiny_kwargs(name):
  kw = {}
  if name == "gpool_cnn":
    kw["vocab_size"] = 50
  if name.startswith("vit_") and name.endswith("16"):
    kw["image_size"] = 32
  return kw


# ---------------------------------------------------------------- registry

def test_names_cover_the_models_of_the_papers():
  expected = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "cifar_resnet20",
              "cifar_resnet32", "cifar_resnet44", "cifar_resnet56", "cifar_resnet110",
              "cifar_resnet56_v2", "vit_ti16", "vit_s16", "vit_b16", "vit_ti4", "vit_s4",
              "vit_b4", "deeplabv3_resnet34", "deeplabv3_resnet50", "deeplabv3_resnet101",
              "deeplabv3plus_resnet34", "deeplabv3plus_resnet50",
              "deeplabv3plus_resnet101", "mlp", "densenet_bc100_12", "vgg16", "gpool_cnn",
              "small_cnn"}
  assert set(models.names()) == expected
  assert models.names() == sorted(models.names())


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="unknown model 'resnet51'") as info:
    models.get("resnet51", 10)
  for name in models.names():
    assert name in str(info.value)


def test_unknown_kwarg_lists_valid_kwargs():
  with pytest.raises(ValueError, match="stme") as info:
    models.get("resnet18", 10, stme="cifar")
  message = str(info.value)
  for valid in ("stem", "dtype", "axis_name"):
    assert valid in message
  # A bad keyword is also a TypeError, as for any Python call.
  with pytest.raises(TypeError):
    models.get("small_cnn", 10, image_size=32)


@pytest.mark.parametrize("name,kw,match", [
    ("resnet18", {"stem": "tiny"}, "stem"),
    ("deeplabv3_resnet50", {"output_stride": 32}, "output_stride"),
    ("vit_s16", {"image_size": 100}, "multiple of the patch size"),
    ("cifar_resnet20", {"shortcut": "C"}, "shortcut"),
    ("small_cnn", {"dtype": "int8"}, "dtype"),
    ("mlp", {"dropout_rate": 1.0}, "dropout_rate"),
    ("gpool_cnn", {}, "vocab_size"),
])
def test_bad_values_are_rejected_at_construction(name, kw, match):
  with pytest.raises(ValueError, match=match):
    models.get(name, 10, **kw)


@pytest.mark.parametrize("num_classes", [0, -3, 2.5, True, "10"])
def test_bad_num_classes(num_classes):
  with pytest.raises(ValueError, match="num_classes"):
    models.get("small_cnn", num_classes)


def test_config_values_are_normalised():
  model = models.get("mlp", 10, dtype="bfloat16", hidden=[8, 4])
  assert model.dtype == jnp.bfloat16 and model.hidden == (8, 4)
  hash(model)  # modules must stay hashable for jax.jit(model.apply)
  assert models.get("small_cnn", np.int64(7)).num_classes == 7


# ---------------------------------------------------------------- shapes and counts

@pytest.mark.parametrize("name", models.names())
def test_output_shape_and_dtype(name):
  shape, dtype = tiny_input(name)
  _, variables, logits = abstract_model(name, 7, shape, dtype, **tiny_kwargs(name))
  if name.startswith("deeplab"):
    assert logits.shape == (2, 32, 32, 7)
  else:
    assert logits.shape == (2, 7)
  assert logits.dtype == jnp.float32
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(variables))
  assert "head" in variables["params"], "the classifier must be named 'head'"


# ---------------------------------------------------------------- real forwards (small models)

def _run(model, x, dropout_key=KEY):
  """init (jit), eval forward (jit) and one train forward (jit) of `model` on `x`."""
  variables = jax.jit(lambda x: model.init({"params": KEY}, x, train=False))(x)
  eval_fn = jax.jit(lambda v, x: model.apply(v, x, train=False))
  train_fn = jax.jit(lambda v, x, k: model.apply(v, x, train=True, mutable=["batch_stats"],
                                                 rngs={"dropout": k}))
  return variables, eval_fn, train_fn


@pytest.fixture(scope="module")
def small_cnn_run():
  x = np.random.default_rng(1).standard_normal((4, 8, 8, 3), np.float32)
  model = models.get("small_cnn", 5)
  variables, eval_fn, train_fn = _run(model, x)
  logits, updates = train_fn(variables, x, KEY)
  return x, variables, eval_fn(variables, x), logits, updates


def test_small_cnn_size_and_forward(small_cnn_run):
  x, variables, eval_logits, train_logits, updates = small_cnn_run
  assert 0.05e6 < models.param_count(variables["params"]) < 0.3e6
  assert eval_logits.shape == train_logits.shape == (4, 5)
  assert eval_logits.dtype == train_logits.dtype == jnp.float32
  assert np.isfinite(eval_logits).all() and np.isfinite(train_logits).all()
  # Batch statistics differ from the initial running statistics (mean 0, var 1).
  assert not np.allclose(eval_logits, train_logits, atol=1e-4)
  assert set(updates) == {"batch_stats"}


def conv3x3_same(x, kernel):
  """Reference 3x3 convolution, stride 1, zero padding 1, NHWC / HWIO, in numpy."""
  x = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  h, w = x.shape[1] - 2, x.shape[2] - 2
  out = np.zeros(x.shape[:1] + (h, w, kernel.shape[-1]))
  for i in range(3):
    for j in range(3):
      out += np.einsum("bhwc,co->bhwo", x[:, i:i + h, j:j + w], kernel[i, j])
  return out


def test_batchnorm_running_statistics_update(small_cnn_run):
  x, variables, _, _, updates = small_cnn_run
  kernel = np.asarray(variables["params"]["conv0"]["kernel"], np.float64)
  y = conv3x3_same(np.asarray(x, np.float64), kernel)
  batch_mean = y.mean(axis=(0, 1, 2))
  batch_var = y.var(axis=(0, 1, 2))
  stats = updates["batch_stats"]["bn0"]
  # PyTorch momentum 0.1 = flax momentum 0.9, starting from mean 0 and variance 1.
  np.testing.assert_allclose(stats["mean"], 0.1 * batch_mean, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * batch_var, rtol=1e-4, atol=1e-6)


def test_eval_mode_uses_running_statistics(small_cnn_run):
  x, variables, eval_logits, _, _ = small_cnn_run
  model = models.get("small_cnn", 5)
  # The same inputs in a different batch composition give the same eval logits.
  again = model.apply(variables, x[:2], train=False)
  np.testing.assert_allclose(again, eval_logits[:2], rtol=1e-5, atol=1e-5)


def test_batchnorm_axis_name_gives_global_batch_statistics(small_cnn_run):
  x, variables, _, train_logits, updates = small_cnn_run
  n = min(4, len(jax.devices()))  # conftest provides 8 fake CPU devices
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",))
  model = models.get("small_cnn", 5, axis_name="data")
  spec = jax.sharding.PartitionSpec

  def train(v, x):
    return model.apply(v, x, train=True, mutable=["batch_stats"])

  sharded = jax.jit(jax.shard_map(train, mesh=mesh, in_specs=(spec(), spec("data")),
                                  out_specs=(spec("data"), spec())))
  logits, sharded_updates = jax.block_until_ready(sharded(variables, x))
  # Per-device shards of the batch, statistics averaged over the axis = one global batch.
  np.testing.assert_allclose(logits, train_logits, rtol=1e-4, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(sharded_updates), jax.tree_util.tree_leaves(updates)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_mlp_matches_numpy_and_dropout_uses_the_rng():
  x = np.random.default_rng(2).standard_normal((3, 4, 5, 1), np.float32)
  model = models.get("mlp", 6, hidden=(16, 8), dropout_rate=0.5)
  variables, eval_fn, train_fn = _run(model, x)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), variables["params"])
  h = np.asarray(x, np.float64).reshape(3, -1)
  for layer in ("dense0", "dense1"):
    h = np.maximum(h @ p[layer]["kernel"] + p[layer]["bias"], 0.0)
  expected = h @ p["head"]["kernel"] + p["head"]["bias"]
  np.testing.assert_allclose(eval_fn(variables, x), expected, rtol=1e-5, atol=1e-5)
  a, updates = train_fn(variables, x, jax.random.key(3))
  b, _ = train_fn(variables, x, jax.random.key(4))
  c, _ = train_fn(variables, x, jax.random.key(3))
  assert updates == {}  # no BatchNorm, yet mutable=['batch_stats'] works
  assert not np.allclose(a, b) and np.allclose(a, c)


def test_mlp_kernel_init_by_name():
  """The default is Flax's LeCun normal (bit-identical to an MLP built without the option);
  'glorot_uniform' (Keras's default) draws from U(±sqrt(6 / (fan_in + fan_out)))."""
  x = jnp.zeros((2, 784))
  plain = models.get("mlp", 10).init(KEY, x)
  default = models.get("mlp", 10, kernel_init="lecun_normal").init(KEY, x)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, plain, default))
  glorot = models.get("mlp", 10, kernel_init="glorot_uniform").init(KEY, x)["params"]
  for layer, (fan_in, fan_out) in (("dense0", (784, 1024)), ("head", (1024, 10))):
    kernel = np.asarray(glorot[layer]["kernel"])
    limit = np.sqrt(6 / (fan_in + fan_out))
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.99 * limit
    np.testing.assert_allclose(kernel.std(), limit / np.sqrt(3), rtol=0.05)
    assert not glorot[layer]["bias"].any()
  with pytest.raises(ValueError, match=r"kernel_init must be one of \('lecun_normal', "
                                       r"'glorot_uniform', 'he_normal'\), got 'xavier'"):
    models.get("mlp", 10, kernel_init="xavier")


def test_cifar_resnet20_jit_forward_and_train_step():
  x = np.random.default_rng(5).standard_normal((2, 16, 16, 3), np.float32)
  model = models.get("cifar_resnet20", 10)
  _, variables = drawn_variables(model, x)  # the forward and train step are what is tested
  logits, updates = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))(
      variables, x)
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  assert np.isfinite(logits).all()
  old = variables["batch_stats"]["stage3_block2"]["bn2"]["mean"]
  new = updates["batch_stats"]["stage3_block2"]["bn2"]["mean"]
  assert not np.allclose(old, new)


# ---------------------------------------------------------------- bfloat16

def assert_bf16_close(out, ref):
  """bf16-computed logits: float32, finite, close to the float32 ones but not bit-identical."""
  assert out.dtype == jnp.float32, "logits must be float32 whatever the computation dtype"
  assert np.isfinite(out).all()
  scale = float(np.abs(ref).max()) + 1e-3
  assert float(np.abs(out - ref).max()) < 0.1 * scale
  assert not np.array_equal(out, ref), "bf16 computation should round differently from f32"


def assert_float32_params(model, x):
  variables = jax.eval_shape(lambda x: model.init({"params": KEY}, x), x)
  assert {l.dtype for l in jax.tree_util.tree_leaves(variables)} == {jnp.dtype(jnp.float32)}


def test_bf16_small_cnn(small_cnn_run):
  x, variables, eval_logits, _, _ = small_cnn_run
  model = models.get("small_cnn", 5, dtype=jnp.bfloat16)
  assert_bf16_close(model.apply(variables, x, train=False), eval_logits)
  assert_float32_params(model, x)


def test_bf16_vit():
  x = np.random.default_rng(7).standard_normal((2, 8, 8, 3), np.float32)
  kw = dict(num_classes=10, patch_size=4, hidden_size=32, depth=1, num_heads=2, mlp_dim=64,
            image_size=8)
  f32, model = vit.ViT(**kw), vit.ViT(**kw, dtype=jnp.bfloat16)
  _, variables = drawn_variables(f32, x)  # any float32 values: bf16 rounds them differently
  assert_bf16_close(jax.jit(model.apply)(variables, x), jax.jit(f32.apply)(variables, x))
  assert_float32_params(model, x)


# ---------------------------------------------------------------- text CNN

def test_gpool_cnn_embedding_from_array_and_freezing(tmp_path):
  table = np.random.default_rng(0).normal(size=(25, 6)).astype(np.float32)
  tokens = jnp.array([[1, 2, 3, 4, 0, 0, 0], [5, 6, 7, 8, 9, 24, 0]])
  model = models.get("gpool_cnn", 3, embedding=table, filter_sizes=[3, 3], num_filters=4,
                     hidden=0, train_embedding=False)
  assert (model.vocab_size, model.embed_dim) == (25, 6)
  # Jitted, as `_run` above: op by op, each of the model's operations compiles on its own.
  variables = jax.jit(model.init)({"params": KEY}, tokens)
  np.testing.assert_array_equal(variables["params"]["embedding"]["embedding"], table)

  def loss(params):
    return jnp.sum(model.apply({"params": params}, tokens) ** 2)

  grads = jax.jit(jax.grad(loss))(variables["params"])
  assert not np.any(grads["embedding"]["embedding"])
  assert np.any(grads["conv0"]["kernel"])

  bf16 = models.get("gpool_cnn", 3, embedding=table, filter_sizes=[3, 3], num_filters=4,
                    hidden=0, dtype="bfloat16")
  assert_bf16_close(jax.jit(bf16.apply)(variables, tokens), jax.jit(model.apply)(variables, tokens))

  np.save(tmp_path / "glove.npy", table)
  from_file = models.get("gpool_cnn", 3, embedding=str(tmp_path / "glove.npy"))
  assert (from_file.vocab_size, from_file.embed_dim) == (25, 6)
  with pytest.raises(ValueError, match="vocab_size"):
    models.get("gpool_cnn", 3, embedding=table, vocab_size=30)


def test_gpool_cnn_rejects_float_input():
  model = models.get("gpool_cnn", 3, vocab_size=10)
  with pytest.raises(ValueError, match="int tokens"):
    jax.eval_shape(lambda x: model.init({"params": KEY}, x),
                   jax.ShapeDtypeStruct((2, 5), jnp.float32))


def test_register_adds_a_model_by_name_and_refuses_clashes():
  class Two(nn.Module):
    num_classes: int
    width: int = 3

    @nn.compact
    def __call__(self, x, train=False):
      return nn.Dense(self.num_classes, name="head")(nn.Dense(self.width)(x.reshape(len(x), -1)))

  models.register("test_two_layer", Two)
  try:
    assert "test_two_layer" in models.names()
    assert models.valid_kwargs("test_two_layer") == ("width",)
    model = models.get("test_two_layer", num_classes=4, width=5)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((2, 3, 3)))
    assert model.apply(variables, jnp.ones((2, 3, 3))).shape == (2, 4)
    with pytest.raises(ValueError, match="already registered"):
      models.register("test_two_layer", Two)
    with pytest.raises(ValueError, match="already registered"):
      models.register("resnet50", Two)
  finally:
    models.unregister("test_two_layer")
  assert "test_two_layer" not in models.names()
  with pytest.raises(ValueError, match="needs a `num_classes` field"):
    models.register("test_bad", nn.Dense)


def test_register_takes_a_partial_or_a_factory():
  """A `functools.partial` fixes the fields it sets; a factory's keyword parameters are its
  options; both build through `get` like the zoo's entries."""
  models.register("test_mlp_wide", functools.partial(models.mlp.MLP, hidden=(7,)))

  def factory(num_classes: int, *, scale: int = 1) -> nn.Module:
    return models.mlp.MLP(num_classes=num_classes * scale)

  models.register("test_factory", factory)
  try:
    assert "hidden" not in models.valid_kwargs("test_mlp_wide")
    model = models.get("test_mlp_wide", 3, dropout_rate=0.0)
    variables = model.init(KEY, jnp.zeros((2, 4)))
    assert variables["params"]["head"]["kernel"].shape == (7, 3)
    with pytest.raises(ValueError, match="hidden fixed by the name"):
      models.get("test_mlp_wide", 3, hidden=(9,))
    assert models.valid_kwargs("test_factory") == ("scale",)
    assert models.get("test_factory", 2, scale=3).num_classes == 6
    with pytest.raises(ValueError, match="needs a `num_classes`"):
      models.register("test_bad_factory", lambda width: None)
  finally:
    models.unregister("test_mlp_wide")
    models.unregister("test_factory")


def test_entries_set_overridable_defaults_only_where_documented():
  """A ViT's image_size and DeepLabv3+'s output_stride are defaults of their names; depth is not."""
  assert models.get("vit_ti4", 10).image_size == 32
  assert models.get("vit_ti4", 10, image_size=64).image_size == 64
  assert models.get("deeplabv3plus_resnet50", 5).output_stride == 16
  assert models.get("deeplabv3plus_resnet50", 5, output_stride=8).output_stride == 8
  with pytest.raises(ValueError, match="depth fixed by the name"):
    models.get("resnet18", 10, depth=50)
