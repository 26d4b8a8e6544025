"""Config -> objects, built one way everywhere: dataset metadata and splits, the model, the loss,
an example input, the training-set size and run length, initial and abstract training states,
abstract model variables.

The training loop, the evaluators, `eval.py` and config validation all go through these
functions (and never import each other), so a config that validates builds exactly the model
and loss that training will use.
"""
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging

from calib_jax.training import config as config_lib, parallel, state as state_lib
from calib_jax.training import step as step_lib


def dataset_meta(config: ml_collections.ConfigDict) -> Any:
  """`calib_jax.data.info` of the config's dataset."""
  from calib_jax import data  # Deferred: imports TensorFlow.
  return data.info(config.dataset)


def split(config: ml_collections.ConfigDict, role: str) -> str:
  """The split to read for `role` ('train', 'val' or 'test'): `config.splits[role]` if set,
  else the role itself, which `data.make_dataset` maps to the dataset's registered split."""
  return config.splits.get(role, role)


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


def num_train_examples(config: ml_collections.ConfigDict, meta: Any) -> int:
  """Number of examples in the training split (after the `max_examples` option).

  Read from the prepared tfds dataset's metadata; call after the data pipeline has been opened
  once, which prepares locally built datasets.
  """
  import tensorflow_datasets as tfds  # Deferred: slow import.
  from calib_jax.data import prepare
  options = {**config.data_options.to_dict(), **config.train_data_options.to_dict()}
  name = prepare.prepared_tfds_name(meta.name, config.data_dir, options.get("tfds_name"))
  builder = tfds.builder(name, data_dir=config.data_dir)
  train_split = split(config, "train")
  if train_split == "train":
    train_split = meta.train_split
  size = builder.info.splits[train_split].num_examples
  if options.get("max_examples"):
    size = min(size, int(options["max_examples"]))
  return int(size)


def resolve_length(config: ml_collections.ConfigDict, num_train_examples: int) -> tuple[int, int]:
  """Returns `(steps_per_epoch, total_steps)` of a run.

  An epoch is what the training stream yields before reshuffling: whole global batches only,
  each process reading its `1/process_count` shard of the examples.
  """
  if config.steps_per_epoch > 0:
    steps_per_epoch = int(config.steps_per_epoch)
  else:
    per_process = num_train_examples // jax.process_count()
    steps_per_epoch = per_process // parallel.local_batch_size(config.batch_size)
    if steps_per_epoch < 1:
      raise config_lib.ConfigError(
          f"batch_size={config.batch_size} is larger than the {num_train_examples} training "
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
  dataset = data.make_dataset(config.dataset, split(config, "train"), batch_size=1,
                              train=False,
                              data_dir=config.data_dir, **{**config.data_options.to_dict(), "max_examples": 1})
  batch = next(iter(dataset))
  return step_lib.model_input(batch)[:1]


def initial_variables(model, example: np.ndarray, config: ml_collections.ConfigDict,
                      key: jax.Array) -> dict[str, Any]:
  """Freshly initialised variables, overwritten with `config.pretrained` if given."""
  variables = jax.jit(lambda k, x: model.init({"params": k}, x, train=False))(key, example)
  variables = jax.device_get(variables)
  if config.pretrained:
    from calib_jax import models
    variables = models.restore_pretrained(variables, models.load_variables(config.pretrained),
                                          skip=tuple(config.pretrained_skip))
    logging.info("Initialised from %s (kept fresh: %s)", config.pretrained,
                 tuple(config.pretrained_skip))
  return variables


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
