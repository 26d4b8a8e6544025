"""A trainee's training inputs from the host: one seed's stream, and the resident split.

With `config.data.on_device` the devices hold the processed training split (read once,
`resident_split`) and the host sends example positions only; otherwise it sends batches. Both
trainees read their streams here, so the choice is made in one place.
"""
from collections.abc import Iterator, Mapping

import jax
import numpy as np

from calib_jax.experiment import Experiment
from calib_jax.training import parallel


def resident_split(experiment: Experiment) -> dict[str, jax.Array]:
  """The experiment's processed training split on every device of its mesh
  (`config.data.on_device`), read once from the host (`DataRecipe.resident_train_split`)."""
  mesh = experiment.mesh
  host = experiment.data.resident_train_split(parallel.device_memory_bytes(mesh))
  return parallel.replicate(host, mesh)


def seed_stream(experiment: Experiment, start_step: int,
                seed: int) -> Iterator[Mapping[str, np.ndarray]]:
  """The training stream of `seed` from batch `start_step`: positions into the resident split
  (`data.on_device`) or batches (with their positions when CRL needs them)."""
  config = experiment.config
  if config.data.on_device:
    return experiment.data.train_order(start_step, seed)
  return experiment.data.train_stream(start_step, seed, return_index=config.crl_weight > 0)
