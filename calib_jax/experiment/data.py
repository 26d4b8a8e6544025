"""The data side of an experiment: a config's `data` sub-config bound to its dataset.

`DataRecipe` is built once per run (by `experiment.build`) from `config.data` and the dataset's
metadata, and is the one place that turns them into `calib_jax.data.make_dataset` calls: the
training stream (this process's share, from a data position on), one pass over an evaluation
split as global batches, the training-set size and one example input. The training loop, the
evaluators and the dry run take their streams from it instead of reassembling `config.data.*`.
"""
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np

from calib_jax import data
from calib_jax.config import schema
from calib_jax.data import resident
from calib_jax.training import parallel
from calib_jax.training import step

ROLES = ("train", "val", "test")

# The share of one device's memory a resident training split may take (`data.on_device`): the
# parameters, optimiser state, activations and the batches' temporaries need the rest.
RESIDENT_MAX_SHARE = 0.5


class DataRecipe:
  """Streams of one dataset as a config's `data` sub-config asks for them.

  Attributes:
    config: the `data` sub-config (name, dir, splits, options, train_options, batch sizes).
    meta: `calib_jax.data.info(config.name)`.
  """

  def __init__(self, data_config: ml_collections.ConfigDict, meta: Any):
    self.config, self.meta = data_config, meta
    self._num_train_examples: int | None = None
    self._example: np.ndarray | None = None

  def assume(self, *, num_train_examples: int, example_input: np.ndarray) -> None:
    """Takes the training-set size and an example input as given instead of reading them
    from the data: for compiling a config's programs without its data (`calib_jax.dry_run`)."""
    self._num_train_examples = int(num_train_examples)
    self._example = example_input

  def split(self, role: str) -> str:
    """The split to read for `role` ('train', 'val' or 'test').

    Unset in `data.splits`, the role itself, which `data.make_dataset` maps to the dataset's
    registered split. Set, a tfds split string read as tfds reads it: 'train' is the whole tfds
    train split (Fashion-MNIST's 60,000 images), not the registered 'train[:55000]' of the alias
    (`data.tfds_split`)."""
    if role not in self.config.splits:
      return role
    return data.tfds_split(self.config.splits[role])

  def train_options(self) -> dict[str, Any]:
    """`make_dataset` options of the training split: `options` (every split) updated with
    `train_options` (training only)."""
    return {**self.config.options.to_dict(), **self.config.train_options.to_dict()}

  def num_train_examples(self) -> int:
    """Examples in the training split (after the `max_examples` option), counted by the data
    pipeline itself for the same split, data dir and options as `train_stream`. Prepares a
    locally built dataset on first use."""
    if self._num_train_examples is None:
      self._num_train_examples = data.num_examples(
          self.config.name, self.split("train"), data_dir=self.config.dir,
          **self.train_options())
    return self._num_train_examples

  def example_input(self) -> np.ndarray:
    """One real training input, batch of 1 (its shape and dtype initialise the model)."""
    if self._example is None:
      dataset = data.make_dataset(self.config.name, self.split("train"), batch_size=1,
                                  train=False, data_dir=self.config.dir,
                                  **{**self.config.options.to_dict(), "max_examples": 1})
      self._example = step.model_input(next(iter(dataset)))[:1]
    return self._example

  def train_stream(self, start_step: int, seed: int, *,
                   return_index: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """This process's training batches from data position `start_step` on (host arrays).

    Args:
      start_step: the number of batches already trained on (a resume's step).
      seed: the run's seed (the order of the examples).
      return_index: also yield each example's position in the split (`index`, for CRL).
    """
    options = self.train_options()
    if return_index:
      options["return_index"] = True
    return iter(data.make_dataset(
        self.config.name, self.split("train"),
        batch_size=parallel.local_batch_size(self.config.batch_size), train=True, seed=seed,
        data_dir=self.config.dir, start_batch=start_step, process_index=jax.process_index(),
        process_count=jax.process_count(), **options))

  def train_order(self, start_step: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """This process's share of the training stream as example positions, `{'index': [B]}`
    per batch: `train_stream(..., return_index=True)['index']` without reading an example
    (`data.resident.train_order`), for a training split resident on the devices."""
    return iter(resident.train_order(
        self.config.name, self.split("train"),
        batch_size=parallel.local_batch_size(self.config.batch_size), seed=seed,
        data_dir=self.config.dir, start_batch=start_step, process_index=jax.process_index(),
        process_count=jax.process_count(), **self.train_options()))

  def resident_train_split(self, memory_bytes: int | None) -> dict[str, np.ndarray]:
    """The training split processed once, in split order (`data.resident.processed_split`):
    what `data.on_device` keeps on the devices, read on the host.

    Args:
      memory_bytes: one device's memory (None: unknown, no check).

    Raises:
      ConfigError: the split would take more than `RESIDENT_MAX_SHARE` of `memory_bytes` (one
        line, checked from the shapes before any image is decoded).
    """
    options = {k: v for k, v in self.train_options().items() if k != "return_index"}
    name, split = self.config.name, self.split("train")
    if memory_bytes:
      size = resident.processed_bytes(name, split, data_dir=self.config.dir, **options)
      if size > RESIDENT_MAX_SHARE * memory_bytes:
        schema.raise_if_problems([
            f"data.on_device: the processed training split of {name} ({size / 2**20:,.1f} "
            f"MiB) does not fit in {RESIDENT_MAX_SHARE:.0%} of a device's memory "
            f"({memory_bytes / 2**30:.1f} GiB); set data.on_device=False"])
    return resident.processed_split(name, split, data_dir=self.config.dir, **options)

  def eval_stream(self, role: str, mesh: jax.sharding.Mesh, *, max_examples: int = -1,
                  **extra_options: Any) -> Iterator[dict[str, jax.Array]]:
    """One pass over `role` ('val', 'test' or a tfds split string) as global batches of
    `eval_batch_size` (the last one padded, `mask` False there).

    Args:
      role: the split's role or a tfds split string.
      mesh: the batches are sharded over it.
      max_examples: read only this many examples (-1: all).
      **extra_options: further `make_dataset` options (e.g. `remove_objects=True`).
    """
    options = {**self.config.options.to_dict(), **extra_options}
    yield from self._global_batches(self.config.name, self.split(role), mesh, max_examples,
                                    options)

  def input_statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`(mean, std)` per channel that the pipeline normalises this dataset's images with,
    `(x / 255 - mean) / std` (`PipelineOptions.input_statistics` of `options`): what a step
    applies on the device to the uint8 images of a `raw_images=True` stream."""
    options = data.PipelineOptions.create(self.meta, self.config.options.to_dict())
    return options.input_statistics(self.meta)

  def corrupted_stream(self, dataset: str, corruption: str, severity: int,
                       mesh: jax.sharding.Mesh, *, max_examples: int = -1
                       ) -> Iterator[dict[str, jax.Array]]:
    """One pass over `corruption` at `severity` of the pre-computed corrupted set `dataset`
    ('cifar10_corrupted', 'imagenet2012_corrupted'; `data.corrupted`;
    `eval.shift='dataset:NAME'`) as global batches of the test stream's form, with raw uint8
    images (`raw_images`: the shifted eval step normalises them on the device with
    `input_statistics`, as it does the clean ones): `eval_stream('test', ...)`'s batch size and
    input size, its last batch padded (`mask` False there). The whole test split is read:
    `data.splits.test` names the clean set's examples, not the corrupted set's.

    Raises:
      ValueError: an unknown set or corruption, a severity outside 1..5, or a set that does not
        corrupt this config's dataset (one line each, before anything is read).
      FileNotFoundError: the set is not prepared and cannot be (one line saying how to get it).
    """
    options = data.corrupted.eval_options(dataset, corruption, severity, self.config.name,
                                          self.config.options.to_dict())
    options["raw_images"] = True
    # Returned, not yielded from: bad names fail at the call, not at the first batch.
    return self._global_batches(dataset, "test", mesh, max_examples, options)

  def _global_batches(self, name: str, split: str, mesh: jax.sharding.Mesh, max_examples: int,
                      options: dict[str, Any]) -> Iterator[dict[str, jax.Array]]:
    """One evaluation pass over `name`'s tfds `split`, this host's share of each global batch
    of `eval_batch_size` read here and assembled over `mesh`; the split's pipeline is built on
    the process's first pass and read again by the next ones (a sweep's members, each
    validation, the evaluation after training: `data.eval_pipeline`)."""
    if max_examples > 0:
      options = {**options, "max_examples": int(max_examples)}
    pipeline = data.eval_pipeline(
        name, split, batch_size=parallel.local_batch_size(self.config.eval_batch_size),
        data_dir=self.config.dir, process_index=jax.process_index(),
        process_count=jax.process_count(), **options)
    for batch in pipeline.batches():
      yield parallel.to_global(batch, mesh)

  def ood_stream(self, ood: str, role: str, mesh: jax.sharding.Mesh, *, max_examples: int = -1
                 ) -> Iterator[dict[str, jax.Array]]:
    """One pass over the out-of-distribution set `ood` (`eval.ood`, checked by
    `experiment.checks.ood_problems`) as global batches: 'context' is `role`'s split with
    every object filled with the mean pixel; 'SPLIT' a split of this dataset; 'DATASET:SPLIT'
    another registered dataset's split, at this dataset's input size and normalised with this
    dataset's mean and std, as the model's own inputs are."""
    if ood == "context":
      yield from self.eval_stream(role, mesh, max_examples=max_examples, remove_objects=True)
      return
    name, _, split = ood.rpartition(":")
    if not name:
      yield from self.eval_stream(split, mesh, max_examples=max_examples)
      return
    options: dict[str, Any] = {
        "normalize_as": self.config.name,
        "image_size": self.config.options.get("image_size") or tuple(self.meta.input_shape[:2])}
    if "normalize" in self.config.options:
      options["normalize"] = self.config.options.normalize
    yield from self._global_batches(name, split, mesh, max_examples, options)
