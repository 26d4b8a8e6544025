"""`PipelineOptions`: the keyword options of `make_dataset`, validated against a dataset."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from calib_jax.data import crops, registry
from calib_jax.data.registry import DatasetMeta

__all__ = ["CACHE_MODES", "NORMALIZATIONS", "PipelineOptions"]

# In-memory caches of a training stream (`caching`): the processed examples, the decoded
# images, or none; the option's default None chooses automatically.
CACHE_MODES = ("processed", "decoded", "none")

# How pixels become model inputs: 'standardize' = (x/255 - mean) / std with the dataset's
# per-channel statistics (the torchvision convention of the MbLS/ACLS code); 'center' =
# x/255 - mean, no division (the Keras preprocessing of the label-relaxation code, which
# subtracts the training mean only; its Table 1 MLPs were trained on such inputs).
NORMALIZATIONS = ("standardize", "center")


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
  """Options of `make_dataset` (passed as keyword arguments).

  Attributes:
    objectness: add 'objectness' float32 [B] (needs boxes): fraction of the crop covered by
      the object boxes' union (docs/conventions.md#boxes-and-objectness); -1: context-only sample.
    context_rate: fraction of *training* samples turned into context-only samples (all
      object boxes filled with the dataset's mean pixel, objectness -1; ALS uses 0.15).
      Implies ``objectness``.
    mask_variant: ALS 'mask' variant (training): keep one object (drawn per example and
      epoch), fill the other boxes with the mean pixel; objectness from the kept box only.
      Implies ``objectness``.
    remove_objects: fill every object box with the mean pixel (ALS Table 1 context-only eval
      images); objectness, when requested, is then -1.
    image_size: int or (H, W) overriding the dataset's model input size (and a segmentation
      dataset's evaluation shape).
    max_examples: read only the first ``max_examples`` examples of the split.
    crop: override the training crop of a classification dataset: a name of
      `crops.CROPS` ('pad', 'inception', 'resize_crop', 'none', 'center'). Segmentation
      datasets always scale, pad and crop (`crops.scale_pad_crop`); text has no crop.
    crop_scale: (min, max) area fraction of the inception crop (default: the recipe's).
    crop_ratio: (min, max) aspect ratio of the inception crop (default 3/4..4/3).
    flip: override random horizontal flipping in training.
    shuffle_buffer: shuffle buffer (records); the whole shard when it is smaller.
    return_boxes: if > 0, add 'boxes' float32 [B, return_boxes, 4]: the boxes objectness was
      computed from, in output-image coordinates (after crop and flip), zero-padded.
    max_length: text: tokens per document (default: the dataset's).
    vocab_size: text: number of token ids; words are hashed into 1..vocab_size-1, 0 pads.
    manual_dir: where manual archives / local files are looked for when a local builder has
      to be prepared (default: tfds' ``<data_dir>/downloads/manual``).
    tfds_name: read another tfds dataset/config with this dataset's recipe
      (e.g. 'clutter_objects/tiny').
    prefetch: batches prefetched by tf.data.
    return_index: add 'index' int64 [B]: each example's position in the split (before host
      sharding), e.g. to key a per-example history such as CRL's; 0 on eval padding.
    download: a tfds catalogue dataset (cifar10, mnist, caltech_birds2011, voc, ...) that is
      not prepared in data_dir is downloaded and prepared on first use, as `tfds.load` does;
      False fails at once instead.
    download_retries: retries of each download request (tfds' own default is 10 with
      exponential back-off, about 205 s before an offline machine gives up).
    normalize: 'standardize' ((x/255 - mean) / std, the default) or 'center' (x/255 - mean),
      see `NORMALIZATIONS`.
    normalize_as: a registered dataset whose mean and std normalise the images instead of this
      dataset's own (same number of channels): an out-of-distribution set fed to a model as
      its own inputs are (`eval.ood`).
    cache: training: what of the host's shard is kept in memory after the first epoch, so
      later epochs skip that work; the batches are bit-identical either way (`caching`).
      'processed' (model inputs; needs a processing without randomness), 'decoded' (images),
      'none', or None (default): 'processed' if it applies, else 'decoded' unless the crop is
      'inception', each only if the shard fits in `caching.CACHE_MAX_BYTES` (1 GiB).
    raw_images: 'image' is uint8 [B,H,W,C], the processed pixels (crop, fills, padding) rounded
      to grey levels, instead of normalised float32; the model's input is then
      `(image / 255 - mean) / std` with `(mean, std) = input_statistics(meta)`, computed on the
      device, e.g. after corrupting the uint8 images there (`eval.shift`).
  """
  objectness: bool = False
  context_rate: float = 0.0
  mask_variant: bool = False
  remove_objects: bool = False
  image_size: Any = None
  max_examples: int | None = None
  crop: str | None = None
  crop_scale: tuple[float, float] | None = None
  crop_ratio: tuple[float, float] | None = None
  flip: bool | None = None
  shuffle_buffer: int = 50_000
  return_boxes: int = 0
  max_length: int | None = None
  vocab_size: int | None = None
  manual_dir: str | None = None
  tfds_name: str | None = None
  prefetch: int = 2
  return_index: bool = False
  download: bool = True
  download_retries: int = 3
  normalize: str = "standardize"
  normalize_as: str | None = None
  cache: str | None = None
  raw_images: bool = False

  @classmethod
  def create(cls, meta: DatasetMeta, options: dict[str, Any]) -> "PipelineOptions":
    """Validated options; unknown names or bad values raise ValueError."""
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
      raise ValueError(f"Unknown make_dataset option(s) {unknown}; valid options: {valid}.")
    opts = cls(**options)
    opts._validate(meta)
    return opts

  @property
  def wants_objectness(self) -> bool:
    """Whether batches get 'objectness' (asked for, or implied by an ALS option)."""
    return self.objectness or self.context_rate > 0 or self.mask_variant

  def image_hw(self, meta: DatasetMeta) -> tuple[int, int]:
    """(H, W) of the model input: the ``image_size`` option, else the dataset's."""
    if self.image_size is not None:
      return _pair(self.image_size)
    return meta.input_shape[0], meta.input_shape[1]

  def input_statistics(self, meta: DatasetMeta) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`(mean, std)` per channel of [0, 1] pixels that model inputs are normalised with,
    `(x / 255 - mean) / std`: the dataset's (with ``normalize_as`` that dataset's); std is 1
    for ``normalize='center'``."""
    stats = registry.info(self.normalize_as) if self.normalize_as else meta
    std = stats.std if self.normalize == "standardize" else (1.0,) * len(stats.std)
    return tuple(float(m) for m in stats.mean), tuple(float(s) for s in std)

  def _validate(self, meta: DatasetMeta) -> None:
    name = meta.name
    if not 0.0 <= self.context_rate <= 1.0:
      raise ValueError(f"{name}: context_rate must be in [0, 1], got {self.context_rate}.")
    if not isinstance(self.download_retries, int) or self.download_retries < 0:
      raise ValueError(f"{name}: download_retries must be an int >= 0, got "
                       f"{self.download_retries!r}.")
    box_opts = [k for k in ("objectness", "mask_variant", "remove_objects", "return_boxes")
                if getattr(self, k)] + (["context_rate"] if self.context_rate > 0 else [])
    if box_opts and not meta.has_boxes:
      with_boxes = [n for n in registry.names() if registry.info(n).has_boxes]
      raise ValueError(f"{name} has no object boxes, so {box_opts} cannot be used; datasets "
                       f"with boxes: {with_boxes}.")
    if self.cache is not None and self.cache not in CACHE_MODES:
      raise ValueError(f"{name}: cache must be one of {CACHE_MODES} or None (automatic), got "
                       f"{self.cache!r}.")
    if self.normalize not in NORMALIZATIONS:
      raise ValueError(f"{name}: normalize must be one of {NORMALIZATIONS}, got "
                       f"{self.normalize!r}.")
    if self.normalize_as is not None:
      other = registry.info(self.normalize_as)  # Unknown names: ValueError with the names.
      if other.mean is None or len(other.mean) != meta.input_shape[-1]:
        raise ValueError(f"{name}: normalize_as={self.normalize_as!r} has no image statistics "
                         f"for {meta.input_shape[-1]} channel(s).")
    if self.crop is not None and self.crop not in crops.CROPS:
      raise ValueError(f"{name}: crop must be one of {tuple(crops.CROPS)} (crops.CROPS), got "
                       f"{self.crop!r}.")
    for key in ("crop_scale", "crop_ratio"):
      value = getattr(self, key)
      if value is not None and not (len(value) == 2 and 0 < value[0] <= value[1]):
        raise ValueError(f"{name}: {key} must be (min, max) with 0 < min <= max, got {value}.")
    if self.crop_scale is not None and self.crop_scale[1] > 1:
      raise ValueError(f"{name}: crop_scale max must be <= 1, got {self.crop_scale}.")
    for key in ("max_examples", "max_length", "vocab_size"):
      value = getattr(self, key)
      if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
        raise ValueError(f"{name}: {key} must be a positive int, got {value!r}.")
    if self.vocab_size is not None and self.vocab_size < 2:
      raise ValueError(f"{name}: vocab_size must be >= 2, got {self.vocab_size}.")
    if self.shuffle_buffer < 1 or self.return_boxes < 0 or self.prefetch < 0:
      raise ValueError(f"{name}: shuffle_buffer must be >= 1, return_boxes and prefetch >= 0.")
    if self.raw_images and meta.task == "text":
      raise ValueError(f"{name} is a text dataset; raw_images is for images.")
    if self.image_size is not None and meta.task == "text":
      raise ValueError(f"{name} is a text dataset; use max_length, not image_size.")
    if self.image_size is not None:
      size = _pair(self.image_size)
      if size is None or min(size) < 2:
        raise ValueError(f"{name}: image_size must be an int or (H, W) >= 2, got "
                         f"{self.image_size!r}.")


def _pair(value) -> tuple[int, int] | None:
  """``(h, w)`` of an int or a pair, None when ``value`` is neither."""
  if isinstance(value, (int, np.integer)):
    return int(value), int(value)
  try:
    h, w = value
    return int(h), int(w)
  except (TypeError, ValueError):
    return None
