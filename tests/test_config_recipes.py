"""Every config in configs/ (and each study's, studies/*/config.py) loads with each of its variants
and resolves against the registries."""
import glob
import os

import jax
import jax.numpy as jnp
import pytest

from calib_jax import data
from calib_jax import experiment
from calib_jax import config as config_lib
from calib_jax.config import variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, "configs")
CONFIG_FILES = (sorted(f for f in glob.glob(os.path.join(CONFIG_DIR, "*.py"))
                       if not os.path.basename(f).startswith("_"))
                + sorted(glob.glob(os.path.join(ROOT, "studies", "*", "config.py"))))


def _module(path):
  return config_lib.load_config_module(path)


def _variants(path):
  return tuple(_module(path).VARIANTS)


def _name(path):
  return os.path.relpath(path, ROOT)


def test_there_is_a_config_per_paper_setting():
  names = {os.path.basename(p)[:-3] for p in CONFIG_FILES}
  expected = {"default", "cifar10_resnet50", "cifar10_resnet101", "tiny_imagenet_resnet50",
              "tiny_imagenet_resnet101", "cub200_resnet101", "voc2012_deeplabv3_resnet50",
              "voc2012_deeplabv3_resnet34",
              "newsgroups20_gpool_cnn", "imagenet_resnet50_acls", "mnist_mlp",
              "fashion_mnist_mlp", "imagenet_resnet50_ls_sc", "imagenet_vit_s16_sam",
              "cityscapes_deeplabv3plus_resnet101", "imagenet_boxes_resnet50_als",
              "imagenet_boxes_resnet101_als"}
  assert expected <= names
  assert {"studies/compare/config.py", "studies/lr_table1/config.py"} <= set(map(_name,
                                                                                CONFIG_FILES))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=_name)
def test_config_builds_for_every_variant(path):
  module = _module(path)
  if not path.endswith("default.py"):
    assert any(word in module.__doc__ for word in ("Table", "Fig")), (
        f"{path}: the docstring must name the paper table/figure it reproduces")
  variants = _variants(path)
  for variant in variants:
    config = config_lib.load_config_file(f"{path}:{variant}")
    # 4 devices divide every paper batch size (Cityscapes uses 12); validation resolves the
    # loss (with its hyper-parameters), dataset and model through their registries.
    experiment.build(config, devices=jax.devices()[:4])
  with pytest.raises(ValueError, match="variant"):
    config_lib.load_config_file(f"{path}:no_such_variant")


# Configs whose model/dataset pairing carries config-specific contracts: text vocabulary, ViT
# image size, dense outputs at the crop size, flat MLP input. (The ResNet configs use the zoo's
# standard classifiers, whose shapes tests/test_models.py checks; tracing them costs seconds.)
SHAPE_CHECKED = ("default", "mnist_mlp", "newsgroups20_gpool_cnn", "imagenet_vit_s16_sam",
                 "voc2012_deeplabv3_resnet50")


@pytest.mark.parametrize("name", SHAPE_CHECKED)
def test_model_accepts_dataset_input_and_outputs_its_classes(name):
  path = os.path.join(CONFIG_DIR, f"{name}.py")
  config = config_lib.load_config_file(f"{path}:{_variants(path)[0]}")
  built = experiment.build(config, devices=jax.devices()[:1])
  meta, model = built.meta, built.model
  dtype = jnp.int32 if meta.task == "text" else jnp.float32
  x = jax.ShapeDtypeStruct((2, *meta.input_shape), dtype)
  variables = jax.eval_shape(lambda v: model.init({"params": jax.random.key(0)}, v, train=False),
                             x)
  logits = jax.eval_shape(lambda v, xx: model.apply(v, xx, train=False), variables, x)
  expected = (2, meta.num_classes) if meta.task != "segmentation" else (
      2, *meta.input_shape[:2], meta.num_classes)
  assert logits.shape == expected and logits.dtype == jnp.float32


@pytest.mark.parametrize("path", CONFIG_FILES, ids=_name)
def test_margin_follows_the_papers(path):
  """MbLS and ACLS use m = 6 on CIFAR-10 and 20 Newsgroups and m = 10 elsewhere."""
  for variant in ("mbls", "acls"):
    if variant not in _variants(path) or path.endswith("default.py"):
      continue
    config = config_lib.load_config_file(f"{path}:{variant}")
    expected = 6.0 if config.data.name in ("cifar10", "newsgroups20") else 10.0
    assert config.loss == variant
    assert config.loss_kwargs.margin == expected


def test_smoothing_level_variants():
  path = os.path.join(CONFIG_DIR, "imagenet_resnet50_ls_sc.py")
  config = config_lib.load_config_file(f"{path}:ls0.2")
  assert config.loss == "ls" and config.loss_kwargs.epsilon == pytest.approx(0.2)
  assert config_lib.load_config_file(path).loss == "ce"
  with pytest.raises(ValueError, match=r"Unknown config variant 'ls1.5'; valid: ce, ls0.05"):
    config_lib.load_config_file(f"{path}:ls1.5")
  with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\)"):
    variants.smoothing_variants((0.1, 1.5))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=_name)
def test_every_variant_is_its_files_default_plus_its_overrides(path):
  """One variant mechanism: `VARIANTS` maps each name to dotted overrides, and the variant's
  config is the file's recipe with exactly those fields changed."""
  table = _module(path).VARIANTS
  assert isinstance(table, dict) and table
  flat = lambda c: {k: v for k, v in c.to_dict().items()}  # noqa: E731
  for name, overrides in table.items():
    config = config_lib.load_config_file(f"{path}:{name}")
    for dotted, value in overrides.items():
      got = config
      for part in dotted.split("."):
        got = got[part]
      got = got.to_dict() if hasattr(got, "to_dict") else got
      assert got == (dict(value) if isinstance(value, dict) else value), (name, dotted)
    assert flat(config) == flat(variants.override(config_lib.load_config_file(
        f"{path}:{name}"), overrides))


def test_override_refuses_unknown_fields_and_mappings_for_locked_groups():
  config = config_lib.base_config()
  variants.override(config, {"optimizer.learning_rate": 0.3, "loss_kwargs": {"epsilon": 0.1},
                             "data.train_options.objectness": True})
  assert config.optimizer.learning_rate == 0.3 and config.loss_kwargs.epsilon == 0.1
  assert config.data.train_options.objectness is True
  with pytest.raises(ValueError, match="did you mean 'optimizer.learning_rate'"):
    variants.override(config, {"optimizer.learning_rat": 0.3})
  with pytest.raises(ValueError, match="only the free-form fields"):
    variants.override(config, {"optimizer": {"name": "adam"}})


def test_configs_use_registered_names_only():
  for path in CONFIG_FILES:
    config = config_lib.load_config_file(f"{path}:{_variants(path)[0]}")
    assert config.data.name in data.names()


# The MbLS and ACLS image/segmentation trainers clip the gradient norm at 2 for every loss of
# their tables; MbLS's text trainer does not clip.
OFFICIAL_CLIP = {"cifar10_resnet50": 2.0, "cifar10_resnet101": 2.0, "tiny_imagenet_resnet50": 2.0,
                 "tiny_imagenet_resnet101": 2.0, "cub200_resnet101": 2.0,
                 "voc2012_deeplabv3_resnet50": 2.0, "voc2012_deeplabv3_resnet34": 2.0,
                 "imagenet_resnet50_acls": 2.0, "newsgroups20_gpool_cnn": 0.0}


@pytest.mark.parametrize("name,clip", sorted(OFFICIAL_CLIP.items()))
def test_mbls_acls_recipes_clip_like_the_official_trainers(name, clip):
  path = os.path.join(CONFIG_DIR, f"{name}.py")
  for variant in _variants(path):
    config = config_lib.load_config_file(f"{path}:{variant}")
    assert config.optimizer.grad_clip_norm == clip, variant


def test_config_modules_load_once_under_readable_names():
  path = os.path.join(CONFIG_DIR, "mnist_mlp.py")
  module = config_lib.load_config_module(path)
  assert module is config_lib.load_config_module(os.path.join(CONFIG_DIR, ".", "mnist_mlp.py"))
  assert module.__name__ == "calib_jax_configs.mnist_mlp"
