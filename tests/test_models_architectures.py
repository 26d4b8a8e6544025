"""The zoo's architectures are the papers': parameter counts against the published ones,
stem strides, ViT position embeddings, DeepLab's output stride and atrous rates (traced only).
"""
import jax
import jax.numpy as jnp
import pytest

from calib_jax import models
from calib_jax.models import resnet
from test_models import KEY, abstract_model  # the traced-model helper of the zoo tests


@pytest.mark.parametrize("name,expected", [
    ("resnet18", 11_689_512), ("resnet50", 25_557_032), ("resnet101", 44_549_160)])
def test_resnet_parameter_counts_match_published(name, expected):
  _, variables, _ = abstract_model(name, 1000, (1, 64, 64, 3))
  assert models.param_count(variables["params"]) == expected


@pytest.mark.parametrize("name,expected", [("vit_b16", 86_567_656), ("vit_s16", 22_050_664)])
def test_vit_parameter_counts_match_published(name, expected):
  _, variables, _ = abstract_model(name, 1000, (1, 224, 224, 3))
  assert models.param_count(variables["params"]) == expected


def cifar_resnet_v1_count(depth, num_classes, shortcut="A"):
  """Parameters of He et al.'s CIFAR ResNet, counted from the architecture description."""
  n = (depth - 2) // 6
  count = 3 * 9 * 16 + 2 * 16  # stem conv + BN
  width_in = 16
  for width in (16, 32, 64):
    for _ in range(n):
      count += width_in * 9 * width + 2 * width + width * 9 * width + 2 * width
      if shortcut == "B" and width_in != width:
        count += width_in * width + 2 * width
      width_in = width
  return count + 64 * num_classes + num_classes


def densenet_bc_count(depth, k, num_classes):
  """Parameters of DenseNet-BC-L-k (Huang et al.), counted from the architecture description."""
  n = (depth - 4) // 6
  channels = 2 * k
  count = 3 * 9 * channels
  for block in range(3):
    for _ in range(n):
      count += 2 * channels + channels * 4 * k + 2 * 4 * k + 4 * k * 9 * k
      channels += k
    if block < 2:
      count += 2 * channels + channels * (channels // 2)
      channels //= 2
  return count + 2 * channels + channels * num_classes + num_classes


@pytest.mark.parametrize("name,depth,published", [
    ("cifar_resnet20", 20, 0.27e6), ("cifar_resnet56", 56, 0.85e6),
    ("cifar_resnet110", 110, 1.7e6)])
def test_cifar_resnet_parameter_counts(name, depth, published):
  _, variables, _ = abstract_model(name, 10, (1, 32, 32, 3))
  count = models.param_count(variables["params"])
  assert count == cifar_resnet_v1_count(depth, 10)
  assert abs(count - published) / published < 0.02


def test_cifar_resnet_option_b_adds_projections():
  _, variables, _ = abstract_model("cifar_resnet20", 10, (1, 32, 32, 3), shortcut="B")
  assert models.param_count(variables["params"]) == cifar_resnet_v1_count(20, 10, "B")
  assert "downsample_conv" in variables["params"]["stage2_block0"]
  _, variables_a, _ = abstract_model("cifar_resnet20", 10, (1, 32, 32, 3))
  assert "downsample_conv" not in variables_a["params"]["stage2_block0"]


def test_densenet_bc_100_12_parameter_count():
  _, variables, _ = abstract_model("densenet_bc100_12", 10, (1, 32, 32, 3))
  count = models.param_count(variables["params"])
  assert count == densenet_bc_count(100, 12, 10)
  assert abs(count - 0.8e6) / 0.8e6 < 0.05


def test_resnet56_v2_is_the_keras_preactivation_bottleneck_net():
  _, variables, _ = abstract_model("cifar_resnet56_v2", 10, (1, 32, 32, 3))
  params = variables["params"]
  assert len([k for k in params if k.startswith("stage")]) == 3 * 6  # 9n+2 = 56
  # Bottleneck widths 16 -> 64, 64 -> 128, 128 -> 256 with 1x1-conv projections per stage.
  for stage, (width, out) in enumerate(((16, 64), (64, 128), (128, 256)), start=1):
    block = params[f"stage{stage}_block0"]
    assert block["conv2"]["kernel"].shape == (3, 3, width, width)
    assert block["conv3"]["kernel"].shape == (1, 1, width, out)
    assert "shortcut_conv" in block and "shortcut_conv" not in params[f"stage{stage}_block1"]
  assert "bn1" not in params["stage1_block0"]  # first unit reuses the stem's BN-ReLU
  assert "bn1" in params["stage2_block0"]
  assert params["head"]["kernel"].shape == (256, 10)


@pytest.mark.parametrize("depth", [18, 50])
def test_resnet_stems_output_strides(depth):
  block, stage_sizes = resnet.RESNET_CONFIGS[depth]
  x = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
  for stem, stride1, stride4, stem_kernel in (("cifar", 1, 8, 3), ("imagenet", 4, 32, 7)):
    backbone = resnet.ResNetBackbone(stage_sizes, block=block, stem=stem)
    features, variables = jax.eval_shape(
        lambda x: backbone.init_with_output({"params": KEY}, x), x)
    assert features["stage1"].shape[1:3] == (64 // stride1,) * 2
    assert features["stage4"].shape[1:3] == (64 // stride4,) * 2
    assert variables["params"]["stem_conv"]["kernel"].shape == (stem_kernel, stem_kernel, 3, 64)
  model = models.get(f"resnet{depth}", 10, stem="cifar")
  assert model.stem == "cifar"


def test_vit_position_embeddings_follow_image_size():
  _, variables, _ = abstract_model("vit_ti4", 10, (1, 64, 64, 3), image_size=64)
  assert variables["params"]["pos_embedding"].shape == (1, 16 * 16 + 1, 192)
  model = models.get("vit_ti4", 10)  # default 32 px
  with pytest.raises(ValueError, match="32x32"):
    jax.eval_shape(lambda x: model.init({"params": KEY}, x),
                   jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32))


# ---------------------------------------------------------------- DeepLab

def conv_dilations(jaxpr):
  """Set of rhs (kernel) dilations of every convolution in `jaxpr` (of `jax.make_jaxpr`)."""
  found = set()

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        found.add(tuple(eqn.params["rhs_dilation"]))
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else (value,):
          if hasattr(sub, "jaxpr"):
            walk(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr)
          elif hasattr(sub, "eqns"):
            walk(sub)

  walk(jaxpr.jaxpr)
  assert all(d[0] == d[1] for d in found)
  return {d[0] for d in found}


@pytest.mark.parametrize("name,output_stride,dilations", [
    ("deeplabv3_resnet34", 8, {1, 2, 4, 12, 24, 36}),
    ("deeplabv3_resnet50", 8, {1, 2, 4, 12, 24, 36}),
    ("deeplabv3_resnet50", 16, {1, 2, 6, 12, 18}),
    ("deeplabv3plus_resnet50", 16, {1, 2, 6, 12, 18}),
])
def test_deeplab_output_stride_and_atrous_rates(name, output_stride, dilations):
  model, variables, _ = abstract_model(name, 21, (1, 64, 96, 3), output_stride=output_stride)
  x = jax.ShapeDtypeStruct((1, 64, 96, 3), jnp.float32)
  # One trace of the eval forward pass gives both the output shapes and the convolutions (the
  # intermediates it also returns add no operation).
  jaxpr, (logits, state) = jax.make_jaxpr(
      lambda v, x: model.apply(v, x, train=False, mutable=["intermediates"]),
      return_shape=True)(variables, x)
  assert logits.shape == (1, 64, 96, 21) and logits.dtype == jnp.float32
  (features,) = state["intermediates"]["features"]
  channels = 512 if "resnet34" in name else 2048  # basic vs bottleneck blocks
  assert features.shape == (1, 64 // output_stride, 96 // output_stride, channels)
  if "plus" in name:
    (low_level,) = state["intermediates"]["low_level"]
    assert low_level.shape == (1, 16, 24, 256)
  assert conv_dilations(jaxpr) == dilations
  assert "image_pooling" in variables["params"]["aspp"]


def test_deeplab_defaults():
  assert models.get("deeplabv3_resnet50", 21).output_stride == 8
  assert models.get("deeplabv3plus_resnet50", 21).output_stride == 16
