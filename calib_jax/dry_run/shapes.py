"""Abstract inputs of a config's steps, from the dataset registry alone: no data is read.

The batch a step sees is what `calib_jax.data.processors` produce (images float32 `[B, H, W, C]`
at the options' `image_size`, tokens int32 `[B, L]`, labels int32 `[B]` or `[B, H, W]`, a bool
`mask` of the labels' shape, `objectness` float32 `[B]` when an ALS option asks for it, `index`
for CRL). The training-set size, which sets the run length (and CRL's history), comes from the
published split sizes in `SPLIT_SIZES` and the config's tfds split string.
"""
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from calib_jax.data import registry
from calib_jax.data.builders import digits, newsgroups20
from calib_jax.data.options import PipelineOptions

# Examples per tfds split of each registered dataset (tfds catalogue pages and the local
# builders of calib_jax/data/builders). 'imagenet2012_boxes' trains on the 544,546 ILSVRC-2012
# training images that have box annotations (the builder drops the others).
SPLIT_SIZES: dict[str, dict[str, int]] = {
    "cifar10": {"train": 50_000, "test": 10_000},
    "cifar100": {"train": 50_000, "test": 10_000},
    "mnist": {"train": 60_000, "test": 10_000},
    "fashion_mnist": {"train": 60_000, "test": 10_000},
    "digits": dict(digits.SPLIT_SIZES),
    "clutter_objects": {"train": 10_000, "validation": 2_000, "test": 2_000},
    "clutter_objects_seg": {"train": 10_000, "validation": 2_000, "test": 2_000},
    "tiny_imagenet": {"train": 90_000, "validation": 10_000, "test": 10_000},
    "imagenet2012": {"train": 1_281_167, "validation": 50_000},
    "imagenet2012_boxes": {"train": 544_546, "validation": 50_000},
    "cub200": {"train": 5_994, "test": 5_794},
    "voc2012_seg": {"train": 1_464, "validation": 1_449},
    "cityscapes": {"train": 2_975, "validation": 500, "test": 1_525},
    "newsgroups20": dict(newsgroups20.SPLIT_SIZES),
}

_SLICE = re.compile(r"^(\w+)(?:\[(-?\d*)(%?):(-?\d*)(%?)\])?$")


def split_size(dataset: str, tfds_split: str) -> int:
  """Examples in `tfds_split` ('train', 'train[:45000]', 'train[99%:]') of `dataset`.

  Percent bounds round to the nearest example, as tfds' default rounding does.
  """
  sizes = SPLIT_SIZES.get(dataset)
  match = _SLICE.match(tfds_split.replace(" ", ""))
  if sizes is None or match is None or match.group(1) not in sizes:
    raise ValueError(f"no known size for split {tfds_split!r} of {dataset!r}; pass "
                     "--num_train_examples=N")
  total = sizes[match.group(1)]
  if match.group(2) is None:
    return total

  def bound(text: str, percent: str, default: int) -> int:
    if not text:
      return default
    value = int(text)
    value = int(round(value * total / 100)) if percent else value
    return value + total if value < 0 else min(value, total)

  start = bound(match.group(2), match.group(3), 0)
  stop = bound(match.group(4), match.group(5), total)
  return max(stop - start, 0)


def num_train_examples(config: ml_collections.ConfigDict) -> int:
  """Training examples the config's run reads (after the `max_examples` option)."""
  meta = registry.info(config.data.name)
  tfds_split = config.data.splits.get("train", meta.train_split)
  count = split_size(config.data.name, tfds_split)
  options = {**config.data.options.to_dict(), **config.data.train_options.to_dict()}
  if options.get("max_examples"):
    count = min(count, int(options["max_examples"]))
  return count


def _options(config: ml_collections.ConfigDict, train: bool) -> PipelineOptions:
  meta = registry.info(config.data.name)
  options = config.data.options.to_dict()
  if train:
    options.update(config.data.train_options.to_dict())
  return PipelineOptions.create(meta, options)


def batch_shapes(config: ml_collections.ConfigDict, batch_size: int, *,
                 train: bool) -> dict[str, tuple[tuple[int, ...], Any]]:
  """`{key: (shape, dtype)}` of one global batch of the training or evaluation stream."""
  meta = registry.info(config.data.name)
  opts = _options(config, train)
  spec = registry.spec(config.data.name)
  if meta.task == "text":
    length = opts.max_length or meta.max_length
    shapes = {"tokens": ((batch_size, length), jnp.int32)}
    label_shape = (batch_size,)
  else:
    height, width = opts.image_hw(meta)
    if meta.task == "segmentation" and not train and opts.image_size is None and \
        spec.recipe.eval_shape is not None:
      height, width = spec.recipe.eval_shape
    shapes = {"image": ((batch_size, height, width, meta.input_shape[-1]), jnp.float32)}
    label_shape = (batch_size, height, width) if meta.task == "segmentation" else (batch_size,)
  shapes["label"] = (label_shape, jnp.int32)
  shapes["mask"] = (label_shape, jnp.bool_)
  if train and meta.has_boxes and opts.wants_objectness:
    shapes["objectness"] = ((batch_size,), jnp.float32)
  if train and config.crl_weight > 0:
    shapes["index"] = ((batch_size,), jnp.int32)  # int64 in tf.data, int32 in JAX without x64
  return shapes


def abstract_batch(config: ml_collections.ConfigDict, batch_size: int, sharding: Any, *,
                   train: bool) -> dict[str, jax.ShapeDtypeStruct]:
  """`batch_shapes` as ShapeDtypeStructs with `sharding` (the leading axis over the chips)."""
  return {k: jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)
          for k, (shape, dtype) in batch_shapes(config, batch_size, train=train).items()}


def model_input(config: ml_collections.ConfigDict) -> jax.ShapeDtypeStruct:
  """One example's model input as the model is initialised with (batch of 1)."""
  shapes = batch_shapes(config, 1, train=True)
  key = "tokens" if "tokens" in shapes else "image"
  shape, dtype = shapes[key]
  return jax.ShapeDtypeStruct(shape, np.dtype(dtype))
