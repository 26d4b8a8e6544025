"""The model of an experiment and its weights: fresh, pre-trained or from a weight file.

`ModelRecipe` is what a config says of its model (registry name, classes, keyword arguments);
the functions here read weight files for it (`config.pretrained`, `eval.py --weights`: our
msgpack files, or PyTorch / safetensors state dicts converted for the model) and give the
shapes of its variables without computing them.
"""
import dataclasses
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from flax import traverse_util

from calib_jax import models
from calib_jax.models import torch_import
from calib_jax.training import parallel


class WeightFileError(ValueError):
  """A weight file that does not fit the config's model (one line, naming the file)."""

  def __init__(self, field: str, path: str, problem: Exception | str):
    first, *rest = [line.strip() for line in str(problem).splitlines() if line.strip()] or [""]
    super().__init__(f"{field}={path!r}: {first}" + (f" {'; '.join(rest)}" if rest else ""))


@dataclasses.dataclass(frozen=True)
class ModelRecipe:
  """A model of the registry with its arguments.

  Attributes:
    name: `calib_jax.models` registry name.
    num_classes: classes of the head.
    kwargs: keyword arguments of `models.get` (the config's `model_kwargs`, its `dtype`, and
      what the dataset determines, e.g. a text model's vocabulary size).
  """
  name: str
  num_classes: int
  kwargs: dict[str, Any]

  def build(self) -> nn.Module:
    return models.get(self.name, self.num_classes, **self.kwargs)


def model_recipe(name: str, model_kwargs: ml_collections.ConfigDict, dtype: str,
                 meta: Any) -> ModelRecipe:
  """The recipe of model `name` for the dataset `meta`: `model_kwargs`, the compute `dtype`
  (for models that take one), and the dataset's vocabulary size unless set."""
  kwargs = dict(model_kwargs.to_dict())
  valid = models.valid_kwargs(name)
  if "dtype" in valid:
    kwargs.setdefault("dtype", dtype)
  vocab_size = getattr(meta, "vocab_size", None)
  if "vocab_size" in valid and vocab_size and "embedding" not in kwargs:
    kwargs.setdefault("vocab_size", vocab_size)
  return ModelRecipe(name, meta.num_classes, kwargs)


def read_weight_file(recipe: ModelRecipe, path: str, field: str) -> dict[str, Any]:
  """The variables in the weight file `path`, for the recipe's model.

  A path ending in .pth/.pt/.bin/.ckpt/.safetensors (`torch_import.TORCH_SUFFIXES`) is a
  torchvision / torch-uncertainty / timm state dict (or a Lightning checkpoint of one), converted
  by `models.import_torch` (a DeepLab gets its ImageNet ResNet's
  'backbone'; a file with another class count than the recipe's gives no 'head'); any other
  path is our own format (`models.save_variables`), read as it is.

  Args:
    recipe: the model the variables are for.
    path: the file, absolute or relative to the working directory.
    field: how the user named the file ('config.pretrained', 'weights'), for messages.

  Raises:
    FileNotFoundError: no file at `path` (one line naming `field` and the path).
    WeightFileError: a PyTorch file for a model without a converter (naming the models with
      one), a state dict or file of another layout, or a .pth file without torch installed.
  """
  resolved = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"{field}={path!r}: no such file ({resolved})")
  try:
    if torch_import.is_torch_file(resolved):
      return models.import_torch(recipe.name, resolved, num_classes=recipe.num_classes,
                                 model_kwargs=recipe.kwargs)
    return models.load_variables(resolved)
  except (ValueError, ImportError) as e:
    raise WeightFileError(field, path, e) from e


def restore_pretrained_file(recipe: ModelRecipe, pretrained: str | None, skip: tuple[str, ...],
                            variables: dict[str, Any]) -> dict[str, Any]:
  """`variables` with the leaves of the `pretrained` file copied in where the paths match
  (top-level modules named in `skip` keep their values); `variables` itself without a file.
  Raises like `read_weight_file`, and `WeightFileError` for shapes that differ outside `skip`
  or a file with no path in common."""
  if not pretrained:
    return variables
  loaded = read_weight_file(recipe, pretrained, "config.pretrained")
  try:
    variables = models.restore_pretrained(variables, loaded, skip=tuple(skip))
  except ValueError as e:
    raise WeightFileError("config.pretrained", pretrained, e) from e
  logging.info("Initialised from %s (kept fresh: %s)", pretrained, tuple(skip))
  return variables


def abstract_variables(model: nn.Module, example: np.ndarray,
                       mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """Shapes, dtypes and shardings of the model variables (params, batch_stats), replicated on
  `mesh`: for restoring them alone (no optimiser or training-set size is needed)."""
  shapes = jax.eval_shape(lambda: model.init({"params": jax.random.key(0)}, example, train=False))
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      dict(shapes))


def weight_file_variables(recipe: ModelRecipe, path: str, model: nn.Module,
                          example: np.ndarray, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """All variables of `model` (params, batch_stats) from the weight file `path`, replicated on
  `mesh` as a checkpoint's would be: for evaluating weights without a training run. Every
  variable must come from the file (`WeightFileError` lists what differs)."""
  like = abstract_variables(model, example, mesh)
  variables = read_weight_file(recipe, path, "weights")
  try:
    models.weights.check_variables(variables, like, path)
  except ValueError as e:
    raise WeightFileError("weights", path, e) from e
  flat = traverse_util.flatten_dict(dict(variables))
  return traverse_util.unflatten_dict({
      k: jax.device_put(np.asarray(flat[k], s.dtype), s.sharding)
      for k, s in traverse_util.flatten_dict(like).items()})
