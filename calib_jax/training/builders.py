"""Config -> objects, built one way everywhere: dataset metadata and splits, the model, the loss,
an example input, the training-set size and run length, initial and abstract training states,
abstract model variables, and the variables of weight files (`config.pretrained`, `eval.py
--weights`: our msgpack files, or PyTorch / safetensors files converted for the config's model).

The training loop, the evaluators, `eval.py` and config validation all go through these
functions (and never import each other), so a config that validates builds exactly the model
and loss that training will use.
"""
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from flax import traverse_util

from calib_jax.training import config as config_lib, parallel, state as state_lib
from calib_jax.training import step as step_lib


class WeightFileError(ValueError):
  """A weight file that does not fit the config's model (one line, naming the file)."""

  def __init__(self, field: str, path: str, problem: Exception | str):
    first, *rest = [line.strip() for line in str(problem).splitlines() if line.strip()] or [""]
    super().__init__(f"{field}={path!r}: {first}" + (f" {'; '.join(rest)}" if rest else ""))


def dataset_meta(config: ml_collections.ConfigDict) -> Any:
  """`calib_jax.data.info` of the config's dataset."""
  from calib_jax import data  # Deferred: imports TensorFlow.
  return data.info(config.data.name)


def data_problems(data_config: ml_collections.ConfigDict, num_devices: int) -> list[str]:
  """What is wrong with a config's `data` sub-config (the registry name is checked by
  `config_validation`, which also builds the dataset's metadata)."""
  problems = []
  for field in ("batch_size", "eval_batch_size"):
    value = data_config[field]
    if value <= 0:
      problems.append(f"data.{field} must be > 0, got {value}")
    elif value % num_devices:
      problems.append(f"data.{field}={value} is not divisible by the number of devices "
                      f"({num_devices}); the batch is split evenly across them")
  for role, tfds_split in data_config.splits.items():
    if role not in ("train", "val", "test") or not isinstance(tfds_split, str) or not tfds_split:
      problems.append(f"data.splits.{role}={tfds_split!r}: keys must be 'train', 'val' or "
                      "'test' and values tfds split strings such as 'train[:50000]'")
  return problems


def split(config: ml_collections.ConfigDict, role: str) -> str:
  """The split to read for `role` ('train', 'val' or 'test').

  Unset in `config.data.splits`, the role itself, which `data.make_dataset` maps to the
  dataset's registered split. Set, a tfds split string read as tfds reads it: 'train' is the
  whole tfds train split (Fashion-MNIST's 60,000 images), not the registered 'train[:55000]' of
  the alias (`data.tfds_split`)."""
  if role not in config.data.splits:
    return role
  from calib_jax import data  # Deferred: imports TensorFlow.
  return data.tfds_split(config.data.splits[role])


def model_kwargs(config: ml_collections.ConfigDict, meta: Any) -> dict[str, Any]:
  """Keyword arguments for `models.get`: the config's `model_kwargs`, its `dtype`, and what the
  dataset determines (a text model's vocabulary size) unless the config sets it."""
  from calib_jax import models
  kwargs = dict(config.model_kwargs.to_dict())
  valid = models.valid_kwargs(config.model)
  if "dtype" in valid:
    kwargs.setdefault("dtype", config.dtype)
  vocab_size = getattr(meta, "vocab_size", None)
  if "vocab_size" in valid and vocab_size and "embedding" not in kwargs:
    kwargs.setdefault("vocab_size", vocab_size)
  return kwargs


def build_model(config: ml_collections.ConfigDict, meta: Any) -> nn.Module:
  """The config's model with the dataset's number of classes."""
  from calib_jax import models
  return models.get(config.model, meta.num_classes, **model_kwargs(config, meta))


def build_loss(config: ml_collections.ConfigDict):
  """The config's loss function (`calib_jax.losses.get(loss, **loss_kwargs)`)."""
  from calib_jax import losses
  return losses.get(config.loss, **config.loss_kwargs.to_dict())


def train_data_options(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """`make_dataset` options of the training split: `data.options` (every split) updated with
  `data.train_options` (training only)."""
  return {**config.data.options.to_dict(), **config.data.train_options.to_dict()}


def num_train_examples(config: ml_collections.ConfigDict) -> int:
  """Number of examples in the training split (after the `max_examples` option): the
  `num_examples` of the training stream `loop.open_train_stream` opens, counted by the data
  pipeline itself (`calib_jax.data.num_examples`, same split, data dir and options).

  Prepares a locally built dataset on first use.
  """
  from calib_jax import data  # Deferred: imports TensorFlow.
  return data.num_examples(config.data.name, split(config, "train"), data_dir=config.data.dir,
                           **train_data_options(config))


def resolve_length(config: ml_collections.ConfigDict, num_train_examples: int) -> tuple[int, int]:
  """Returns `(steps_per_epoch, total_steps)` of a run.

  An epoch is what the training stream yields before reshuffling: whole global batches only,
  each process reading its `1/process_count` shard of the examples.
  """
  if config.steps_per_epoch > 0:
    steps_per_epoch = int(config.steps_per_epoch)
  else:
    per_process = num_train_examples // jax.process_count()
    steps_per_epoch = per_process // parallel.local_batch_size(config.data.batch_size)
    if steps_per_epoch < 1:
      raise config_lib.ConfigError(
          f"batch_size={config.data.batch_size} is larger than the {num_train_examples} training "
          "examples")
  if config.num_train_steps > 0:
    total_steps = int(config.num_train_steps)
  else:
    total_steps = max(int(round(config.num_epochs * steps_per_epoch)), 1)
  return steps_per_epoch, total_steps


def example_input(config: ml_collections.ConfigDict) -> np.ndarray:
  """One real training input (its shape and dtype initialise the model); opening the pipeline
  also prepares locally built datasets on first use."""
  from calib_jax import data
  dataset = data.make_dataset(config.data.name, split(config, "train"), batch_size=1,
                              train=False,
                              data_dir=config.data.dir,
                              **{**config.data.options.to_dict(), "max_examples": 1})
  batch = next(iter(dataset))
  return step_lib.model_input(batch)[:1]


def read_weight_file(config: ml_collections.ConfigDict, path: str, field: str,
                     num_classes: int | None) -> dict[str, Any]:
  """The variables in the weight file `path`, for the config's model.

  A path ending in .pth/.pt/.bin/.safetensors (`torch_import.TORCH_SUFFIXES`) is a torchvision
  / timm state dict, converted for `config.model` by `models.import_torch` (a DeepLab gets its
  ImageNet ResNet's 'backbone'; a file with another class count than `num_classes` gives no
  'head'); any other path is our own format (`models.save_variables`), read as it is.

  Args:
    config: the run's config (model, model_kwargs, dataset).
    path: the file, absolute or relative to the working directory.
    field: how the user named the file ('config.pretrained', 'weights'), for messages.
    num_classes: classes of the model the variables are for.

  Raises:
    FileNotFoundError: no file at `path` (one line naming `field` and the path).
    WeightFileError: a PyTorch file for a model without a converter (naming the models with
      one), a state dict or file of another layout, or a .pth file without torch installed.
  """
  from calib_jax import models
  from calib_jax.models import torch_import
  resolved = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"{field}={path!r}: no such file ({resolved})")
  try:
    if torch_import.is_torch_file(resolved):
      return models.import_torch(config.model, resolved, num_classes=num_classes,
                                 model_kwargs=model_kwargs(config, dataset_meta(config)))
    return models.load_variables(resolved)
  except (ValueError, ImportError) as e:
    raise WeightFileError(field, path, e) from e


def restore_pretrained_file(config: ml_collections.ConfigDict, model: nn.Module,
                            variables: dict[str, Any]) -> dict[str, Any]:
  """`variables` with the leaves of the `config.pretrained` file copied in where the paths
  match (modules named in `config.pretrained_skip` keep their values); `variables` itself when
  `config.pretrained` is not set. Raises like `read_weight_file`, and `WeightFileError` for
  shapes that differ outside `pretrained_skip` or a file with no path in common."""
  if not config.pretrained:
    return variables
  from calib_jax import models
  skip = tuple(config.pretrained_skip)
  pretrained = read_weight_file(config, config.pretrained, "config.pretrained",
                                getattr(model, "num_classes", None))
  try:
    variables = models.restore_pretrained(variables, pretrained, skip=skip)
  except ValueError as e:
    raise WeightFileError("config.pretrained", config.pretrained, e) from e
  logging.info("Initialised from %s (kept fresh: %s)", config.pretrained, skip)
  return variables


def weight_file_variables(config: ml_collections.ConfigDict, path: str, model: nn.Module,
                          example: np.ndarray, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """All variables of `model` (params, batch_stats) from the weight file `path` (see
  `read_weight_file`), replicated on `mesh` as a checkpoint's would be: for evaluating weights
  without a training run. Every variable must come from the file (`WeightFileError` lists what
  differs)."""
  from calib_jax import models
  like = abstract_variables(model, example, mesh)
  variables = read_weight_file(config, path, "weights", getattr(model, "num_classes", None))
  try:
    models.weights.check_variables(variables, like, path)
  except ValueError as e:
    raise WeightFileError("weights", path, e) from e
  flat = traverse_util.flatten_dict(dict(variables))
  return traverse_util.unflatten_dict({
      k: jax.device_put(np.asarray(flat[k], s.dtype), s.sharding)
      for k, s in traverse_util.flatten_dict(like).items()})


def initial_variables(model, example: np.ndarray, config: ml_collections.ConfigDict,
                      key: jax.Array) -> dict[str, Any]:
  """Freshly initialised variables, overwritten with `config.pretrained` if given
  (`restore_pretrained_file`)."""
  variables = jax.jit(lambda k, x: model.init({"params": k}, x, train=False))(key, example)
  return restore_pretrained_file(config, model, jax.device_get(variables))


def initial_state(config: ml_collections.ConfigDict, model, tx, example: np.ndarray,
                mesh: jax.sharding.Mesh, crl_num_examples: int) -> state_lib.TrainState:
  """The initial, replicated training state of a run (same for every process)."""
  init_key, run_key = jax.random.split(jax.random.key(config.seed))
  variables = initial_variables(model, example, config, init_key)
  state = state_lib.create(variables, tx, run_key, crl_num_examples=crl_num_examples)
  return parallel.replicate(state, mesh)


def abstract_state(config: ml_collections.ConfigDict, model, tx, example: np.ndarray,
                   mesh: jax.sharding.Mesh, crl_num_examples: int) -> state_lib.TrainState:
  """Shapes, dtypes and shardings of the training state, without computing it (for restores)."""

  def init():
    variables = model.init({"params": jax.random.key(0)}, example, train=False)
    return state_lib.create(variables, tx, jax.random.key(0), crl_num_examples=crl_num_examples)

  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      jax.eval_shape(init))


def abstract_variables(model, example: np.ndarray, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """Shapes, dtypes and shardings of the model variables (params, batch_stats), for restoring
  them alone: no optimiser and no training-set size are needed to read weights."""
  shapes = jax.eval_shape(lambda: model.init({"params": jax.random.key(0)}, example, train=False))
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      dict(shapes))
