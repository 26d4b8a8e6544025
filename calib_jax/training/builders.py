"""Config -> objects: the model, the loss and the dataset metadata, built one way everywhere.

`train.py`, `eval.py` and config validation all go through these functions, so a config that
validates builds exactly the model and loss that training will use.
"""
from typing import Any

import flax.linen as nn
import ml_collections


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
