"""Model zoo: Flax (linen) networks of the calibration papers behind a name registry.

    model = calib_jax.models.get("resnet50", num_classes=200, stem="cifar", dtype=jnp.bfloat16)
    variables = model.init({"params": key}, x, train=False)
    logits = model.apply(variables, x, train=False)
    logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"],
                                  rngs={"dropout": key})

Every model takes `dtype` (computation dtype; parameters and logits stay float32) and
`axis_name` (BatchNorm cross-device statistics under pmap / shard_map; unused by models without
BatchNorm). Classifiers return float32 logits [B, num_classes] and name their last layer 'head';
DeepLab returns [B, H, W, num_classes] at input resolution.
"""
import dataclasses
import inspect
import operator
from typing import Any, Callable

import flax.linen as nn

from calib_jax.models import cifar_resnet
from calib_jax.models import deeplab
from calib_jax.models import densenet
from calib_jax.models import layers
from calib_jax.models import mlp
from calib_jax.models import resnet
from calib_jax.models import small_cnn
from calib_jax.models import text_cnn
from calib_jax.models import torch_import
from calib_jax.models import vgg
from calib_jax.models import vit
from calib_jax.models import weights
from calib_jax.models.layers import param_count
from calib_jax.models.torch_import import import_torch
from calib_jax.models.weights import load_variables
from calib_jax.models.weights import restore_pretrained
from calib_jax.models.weights import save_variables

__all__ = ["get", "names", "register", "unregister", "valid_kwargs", "param_count",
           "save_variables", "load_variables", "restore_pretrained", "import_torch"]

_NOT_CONFIGURABLE = ("parent", "name", "num_classes")


class ModelConfigError(ValueError, TypeError):
  """Unknown model keyword argument (a ValueError, and a TypeError like any bad keyword)."""


def _module_builder(cls: type[nn.Module], **fixed: Any) -> Callable[..., nn.Module]:
  """A builder for `cls` with `fixed` attributes; its other dataclass fields are the kwargs."""

  def build(num_classes: int, **kw: Any) -> nn.Module:
    return cls(num_classes=num_classes, **kw, **fixed)

  build.valid_kwargs = tuple(f.name for f in dataclasses.fields(cls)
                             if f.init and f.name not in _NOT_CONFIGURABLE and f.name not in fixed)
  return build


def _with_defaults(builder: Callable[..., nn.Module], **defaults: Any) -> Callable[..., nn.Module]:
  """`builder` with other default kwargs (e.g. the ViT image_size that suits its patch size)."""

  def build(num_classes: int, **kw: Any) -> nn.Module:
    return builder(num_classes, **{**defaults, **kw})

  build.valid_kwargs = builder.valid_kwargs
  return build


def _factory_builder(factory: Callable[..., nn.Module],
                     module: type[nn.Module]) -> Callable[..., nn.Module]:
  """A builder from a factory function whose extra kwargs are attributes of `module`."""
  own = tuple(p.name for p in inspect.signature(factory).parameters.values()
              if p.kind == p.KEYWORD_ONLY)

  def build(num_classes: int, **kw: Any) -> nn.Module:
    return factory(num_classes, **kw)

  build.valid_kwargs = own + tuple(
      f for f in _module_builder(module).valid_kwargs if f not in own)
  return build


def _registry() -> dict[str, Callable[..., nn.Module]]:
  reg: dict[str, Callable[..., nn.Module]] = {}
  for depth in resnet.RESNET_CONFIGS:
    reg[f"resnet{depth}"] = _module_builder(resnet.ResNet, depth=depth)
  for depth in (20, 32, 44, 56, 110):
    reg[f"cifar_resnet{depth}"] = _module_builder(cifar_resnet.CifarResNet, depth=depth)
  reg["cifar_resnet56_v2"] = _module_builder(cifar_resnet.CifarPreActResNet, depth=56)
  for variant, (hidden, depth, heads, mlp_dim) in vit.VIT_VARIANTS.items():
    for patch, image_size in ((16, 224), (4, 32)):
      reg[f"vit_{variant}{patch}"] = _with_defaults(
          _module_builder(vit.ViT, patch_size=patch, hidden_size=hidden, depth=depth,
                          num_heads=heads, mlp_dim=mlp_dim), image_size=image_size)
  for depth in (34, 50, 101):  # ResNet-34: MbLS Table 5
    reg[f"deeplabv3_resnet{depth}"] = _module_builder(deeplab.DeepLab, depth=depth, plus=False)
    reg[f"deeplabv3plus_resnet{depth}"] = _with_defaults(
        _module_builder(deeplab.DeepLab, depth=depth, plus=True), output_stride=16)
  reg["mlp"] = _module_builder(mlp.MLP)
  reg["densenet_bc100_12"] = _module_builder(densenet.DenseNetBC, depth=100, growth_rate=12)
  reg["vgg16"] = _module_builder(vgg.VGG16)
  reg["gpool_cnn"] = _factory_builder(text_cnn.gpool_cnn, text_cnn.GPoolCNN)
  reg["small_cnn"] = _module_builder(small_cnn.SmallCNN)
  return reg


_REGISTRY = _registry()


def names() -> list[str]:
  """Sorted names accepted by `get`."""
  return sorted(_REGISTRY)


def register(name: str, module: type[nn.Module], *, overwrite: bool = False) -> None:
  """Makes a Flax module class of your own buildable by name (`config.model = name`).

  `get(name, num_classes, **kw)` then builds `module(num_classes=num_classes, **kw)`; its
  dataclass fields (other than `num_classes`) are the accepted `model_kwargs`. The module is
  called as `module.apply(variables, x, train=...)` and returns logits, as the zoo's models do.

  Raises:
    ValueError: `name` is taken (pass `overwrite=True` to replace it) or `module` has no
      `num_classes` field.
  """
  if name in _REGISTRY and not overwrite:
    raise ValueError(f"model name {name!r} is already registered; pass overwrite=True to "
                     "replace it")
  if not (dataclasses.is_dataclass(module)
          and "num_classes" in {f.name for f in dataclasses.fields(module)}):
    raise ValueError(f"{getattr(module, '__name__', module)!r} needs a `num_classes` field to "
                     "be registered as a model")
  _REGISTRY[name] = _module_builder(module)


def unregister(name: str) -> None:
  """Removes a model `register` added (no-op for a name not registered)."""
  _REGISTRY.pop(name, None)


def _lookup(name: str) -> Callable[..., nn.Module]:
  if name not in _REGISTRY:
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(names())}")
  return _REGISTRY[name]


def valid_kwargs(name: str) -> tuple[str, ...]:
  """Keyword arguments `get(name, ...)` accepts."""
  return tuple(sorted(_lookup(name).valid_kwargs))


def _normalise(key: str, value: Any) -> Any:
  """Config-friendly values: dtype names -> jnp dtypes, lists -> tuples (modules must hash)."""
  if key == "dtype":
    return layers.canonical_dtype(value)
  if isinstance(value, list):
    return tuple(value)
  return value


def _is_positive_int(value: Any) -> bool:
  if isinstance(value, bool):
    return False
  try:
    return operator.index(value) >= 1
  except TypeError:
    return False


def get(name: str, num_classes: int, **kw: Any) -> nn.Module:
  """Builds the registered model `name` with `num_classes` outputs.

  Args:
    name: one of `names()`.
    num_classes: number of logits (classes per pixel for DeepLab).
    **kw: model options, see `valid_kwargs(name)`; e.g. dtype (jnp.float32 / jnp.bfloat16 or their
      names), axis_name, stem, image_size, dropout_rate, output_stride.

  Raises:
    ValueError: unknown name (listing `names()`), unknown keyword (listing the valid ones) or
      invalid values.
  """
  builder = _lookup(name)
  if not _is_positive_int(num_classes):
    raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
  num_classes = operator.index(num_classes)
  unknown = sorted(set(kw) - set(builder.valid_kwargs))
  if unknown:
    raise ModelConfigError(f"unknown argument(s) {unknown} for model {name!r}; valid: "
                           f"{', '.join(sorted(builder.valid_kwargs))}")
  return builder(num_classes, **{k: _normalise(k, v) for k, v in kw.items()})
