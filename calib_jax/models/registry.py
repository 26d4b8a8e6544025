"""The model registry: names -> Flax module constructors, and `get` to build one by name.

`calib_jax.models` re-exports `get`, `names`, `register`, `unregister` and `valid_kwargs`; the
converters of `torch_import` read the registry from here, below the package's `__init__`.
"""
import dataclasses
import inspect
import operator
import typing
from functools import partial
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
from calib_jax.models import vgg
from calib_jax.models import vit

# Constructor fields a user never passes: Flax's own, and num_classes (`get`'s argument).
_NOT_CONFIGURABLE = ("parent", "name", "num_classes")
# Fields a registry entry sets as a *default* the user may change: a ViT's input side (its
# patch size suggests one) and DeepLabv3+'s feature stride (16, as the paper trains it). Every
# other field an entry sets (depth, width, patch size, ...) is what its name means, so `get`
# refuses to change it.
_OVERRIDABLE_DEFAULTS = ("image_size", "output_stride")


class ModelConfigError(ValueError, TypeError):
  """Unknown model keyword argument (a ValueError, and a TypeError like any bad keyword)."""


# name -> constructor `ctor(num_classes=..., **kwargs) -> nn.Module`: a Flax module class, a
# `functools.partial` of one (as Flax's `ResNet50 = partial(ResNet, ...)`), or a factory.
_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    **{f"resnet{d}": partial(resnet.ResNet, depth=d) for d in resnet.RESNET_CONFIGS},
    **{f"cifar_resnet{d}": partial(cifar_resnet.CifarResNet, depth=d)
       for d in (20, 32, 44, 56, 110)},
    "cifar_resnet56_v2": partial(cifar_resnet.CifarPreActResNet, depth=56),
    **{f"vit_{variant}{patch}": partial(vit.ViT, patch_size=patch, hidden_size=hidden,
                                         depth=depth, num_heads=heads, mlp_dim=mlp_dim,
                                         image_size=image_size)
       for variant, (hidden, depth, heads, mlp_dim) in vit.VIT_VARIANTS.items()
       for patch, image_size in ((16, 224), (4, 32))},
    # ResNet-34: MbLS Table 5.
    **{f"deeplabv3_resnet{d}": partial(deeplab.DeepLab, depth=d, plus=False)
       for d in (34, 50, 101)},
    **{f"deeplabv3plus_resnet{d}": partial(deeplab.DeepLab, depth=d, plus=True,
                                           output_stride=16)
       for d in (34, 50, 101)},
    "mlp": mlp.MLP,
    "densenet_bc100_12": partial(densenet.DenseNetBC, depth=100, growth_rate=12),
    "vgg16": vgg.VGG16,
    "gpool_cnn": text_cnn.gpool_cnn,
    "small_cnn": small_cnn.SmallCNN,
}


def _fields(cls: type) -> tuple[str, ...]:
  return tuple(f.name for f in dataclasses.fields(cls)
               if f.init and f.name not in _NOT_CONFIGURABLE)


def _accepted_kwargs(ctor: Callable[..., nn.Module]) -> tuple[str, ...]:
  """The keyword arguments `ctor` takes from a user.

  A module class: its dataclass fields. A partial: its function's, less the fields it fixes
  (except `_OVERRIDABLE_DEFAULTS`). A factory: its keyword parameters, plus, when it forwards
  `**kwargs` to the module class its return annotation names, that class's fields.
  """
  fixed: tuple[str, ...] = ()
  if isinstance(ctor, partial):
    fixed = tuple(k for k in ctor.keywords if k not in _OVERRIDABLE_DEFAULTS)
    ctor = ctor.func
  if dataclasses.is_dataclass(ctor):
    accepted = _fields(ctor)
  else:
    params = inspect.signature(ctor).parameters.values()
    accepted = tuple(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                     and p.name not in _NOT_CONFIGURABLE)
    returned = typing.get_type_hints(ctor).get("return")
    if (any(p.kind == p.VAR_KEYWORD for p in params) and isinstance(returned, type)
        and dataclasses.is_dataclass(returned)):
      accepted += tuple(f for f in _fields(returned) if f not in accepted)
  return tuple(k for k in accepted if k not in fixed)


def names() -> list[str]:
  """Sorted names accepted by `get`."""
  return sorted(_REGISTRY)


def register(name: str, ctor: Callable[..., nn.Module], *, overwrite: bool = False) -> None:
  """Makes a model of your own buildable by name (`config.model = name`).

  `get(name, num_classes, **kw)` then calls `ctor(num_classes=num_classes, **kw)`. `ctor` is a
  Flax module class with a `num_classes` field, a `functools.partial` of one (the fields it sets
  are fixed for this name), or a factory function taking `num_classes`; the accepted
  `model_kwargs` are the remaining fields / keyword parameters (`valid_kwargs(name)`). The model
  is called as `model.apply(variables, x, train=...)` and returns logits, as the zoo's do.

  Raises:
    ValueError: `name` is taken (pass `overwrite=True` to replace it) or `ctor` takes no
      `num_classes`.
  """
  if name in _REGISTRY and not overwrite:
    raise ValueError(f"model name {name!r} is already registered; pass overwrite=True to "
                     "replace it")
  target = ctor.func if isinstance(ctor, partial) else ctor
  if dataclasses.is_dataclass(target):
    takes_num_classes = "num_classes" in {f.name for f in dataclasses.fields(target)}
  else:
    try:
      takes_num_classes = "num_classes" in inspect.signature(target).parameters
    except (TypeError, ValueError):  # not introspectable: not a constructor we can check
      takes_num_classes = False
  if not takes_num_classes:
    raise ValueError(f"{getattr(target, '__name__', target)!r} needs a `num_classes` field "
                     "(or parameter) to be registered as a model")
  _REGISTRY[name] = ctor


def unregister(name: str) -> None:
  """Removes a model `register` added (no-op for a name not registered)."""
  _REGISTRY.pop(name, None)


def _lookup(name: str) -> Callable[..., nn.Module]:
  if name not in _REGISTRY:
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(names())}")
  return _REGISTRY[name]


def valid_kwargs(name: str) -> tuple[str, ...]:
  """Keyword arguments `get(name, ...)` accepts."""
  return tuple(sorted(_accepted_kwargs(_lookup(name))))


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
  ctor = _lookup(name)
  if not _is_positive_int(num_classes):
    raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
  num_classes = operator.index(num_classes)
  valid = valid_kwargs(name)
  unknown = sorted(set(kw) - set(valid))
  if unknown:
    fixed = [k for k in unknown if isinstance(ctor, partial) and k in ctor.keywords]
    why = f" ({', '.join(fixed)} fixed by the name)" if fixed else ""
    raise ModelConfigError(f"unknown argument(s) {unknown} for model {name!r}{why}; valid: "
                           f"{', '.join(valid)}")
  return ctor(num_classes=num_classes, **{k: _normalise(k, v) for k, v in kw.items()})
