"""tf.data input pipelines yielding host-local numpy batches.

Determinism and exact resume: the training stream is a pure function of ``seed``. Epoch ``e``
is the host's shard shuffled with seed ``(seed, e)`` and cut to a whole number of batches;
every random augmentation of an example is drawn from stateless ops seeded with
``(seed, e, global example index)``, so neither thread scheduling nor where the stream was
started changes a single pixel. ``start_batch=k`` therefore starts at epoch ``k // B_e`` and
skips ``k % B_e`` batches of *undecoded* records (``B_e`` batches per epoch).

Evaluation is one pass in file order; every host yields the same number of batches (the last
ones padded with ``mask=False`` examples) so that metrics summed over hosts are exact.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from calib_jax.data import boxes as boxes_lib
from calib_jax.data import builders  # noqa: F401  (registers the local tfds builders)
from calib_jax.data import checks
from calib_jax.data import prepare, registry

__all__ = ["PipelineOptions", "make_dataset"]

_SPLIT_ALIASES = ("train", "val", "test")
_CROPS = ("pad", "inception", "resize_crop", "none")
_EVAL_RESIZE_RATIO = 0.875  # 224/256: eval images are resized to size/0.875, centre-cropped.


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
  """Options of `make_dataset` (passed as keyword arguments).

  Attributes:
    objectness: add 'objectness' float32 [B] (needs boxes): fraction of the crop covered by
      the union of the object boxes (SPEC §4); -1 marks context-only samples.
    context_rate: fraction of *training* samples turned into context-only samples (all
      object boxes filled with the dataset's mean pixel, objectness -1; ALS uses 0.15).
      Implies ``objectness``.
    mask_variant: ALS 'mask' variant (training): keep one object (drawn per example and
      epoch), fill the other boxes with the mean pixel; objectness from the kept box only.
      Implies ``objectness``.
    remove_objects: fill every object box with the mean pixel (ALS Table 1 context-only eval
      images); objectness, when requested, is then -1.
    image_size: int or (H, W) overriding the dataset's model input size.
    max_examples: read only the first ``max_examples`` examples of the split.
    crop: override the training crop: 'pad', 'inception', 'resize_crop' or 'none'.
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

  @classmethod
  def create(cls, meta: registry.DatasetMeta, options: dict[str, Any]) -> "PipelineOptions":
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
    return self.objectness or self.context_rate > 0 or self.mask_variant

  def _validate(self, meta: registry.DatasetMeta) -> None:
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
    if self.crop is not None and self.crop not in _CROPS:
      raise ValueError(f"{name}: crop must be one of {_CROPS}, got {self.crop!r}.")
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
    if self.image_size is not None and meta.task == "text":
      raise ValueError(f"{name} is a text dataset; use max_length, not image_size.")
    if self.image_size is not None:
      size = _pair(self.image_size)
      if size is None or min(size) < 2:
        raise ValueError(f"{name}: image_size must be an int or (H, W) >= 2, got "
                         f"{self.image_size!r}.")


def _pair(value) -> tuple[int, int] | None:
  if isinstance(value, (int, np.integer)):
    return int(value), int(value)
  try:
    h, w = value
    return int(h), int(w)
  except (TypeError, ValueError):
    return None


# --------------------------------------------------------------------------------------------
# Reading.


def _resolve_split(meta: registry.DatasetMeta, split: str) -> str:
  if split == "train":
    return meta.train_split
  if split in meta.eval_splits:
    return meta.eval_splits[split]
  if not isinstance(split, str) or not split:
    raise ValueError(f"{meta.name}: split must be one of {_SPLIT_ALIASES} or a tfds split "
                     f"string, got {split!r}.")
  return split  # A raw tfds split string such as 'train[:10%]'.


def _decoders(source: registry._Source) -> dict[str, Any]:
  keys = [k for k in (source.image_key, source.seg_key) if k]
  return {k: tfds.decode.SkipDecoding() for k in keys}


def _load(spec: registry._Spec, split: str, data_dir: str | None, opts: PipelineOptions
          ) -> tuple[tf.data.Dataset, tfds.core.DatasetBuilder]:
  """Undecoded examples of ``split`` and their builder, preparing the dataset on first use."""
  builder = prepare.prepared_builder(
      spec, data_dir, tfds_name=opts.tfds_name, download=opts.download,
      download_retries=opts.download_retries, manual_dir=opts.manual_dir)
  # tfds caches small splits in memory; `take(max_examples)` after that cache would make
  # tf.data discard the unfinished cache every epoch (and warn each time).
  return builder.as_dataset(
      split=split, decoders=_decoders(spec.source), shuffle_files=False,
      read_config=tfds.ReadConfig(try_autocache=opts.max_examples is None)), builder


def _static_image_shape(builder, key: str | None) -> tuple[int, ...] | None:
  """The stored image shape when every image of the dataset has it (e.g. CIFAR), else None."""
  try:
    shape = tuple(builder.info.features[key].shape)
  except (KeyError, TypeError, AttributeError):
    return None
  return shape if len(shape) == 3 and None not in shape else None


def _num_examples(ds: tf.data.Dataset) -> int:
  n = int(ds.cardinality())
  if n < 0:  # Unknown or infinite: count the (undecoded) records once.
    n = int(ds.reduce(np.int64(0), lambda count, _: count + 1))
  return n


# --------------------------------------------------------------------------------------------
# Per-example processing.


def _image_size(spec: registry._Spec, opts: PipelineOptions) -> tuple[int, int]:
  if opts.image_size is not None:
    return _pair(opts.image_size)
  return spec.meta.image_shape[0], spec.meta.image_shape[1]


def _decode_image(data: tf.Tensor, channels: int, static_shape=None, index=None) -> tf.Tensor:
  if data.dtype == tf.string:
    data = tf.io.decode_image(data, channels=channels, expand_animations=False)
  data = tf.convert_to_tensor(data)
  data.set_shape([None, None, channels])
  if static_shape is not None and static_shape[-1] == channels:
    if index is None:
      data = tf.ensure_shape(data, static_shape)
    else:  # Names the example when an image has another shape.
      data = checks.with_shape(data, tuple(static_shape), index)
  return data


def _cityscapes_lut() -> tf.Tensor:
  lut = np.full(256, 255, np.int32)
  for label_id, train_id in registry.CITYSCAPES_LABEL_TO_TRAIN_ID.items():
    lut[label_id] = train_id
  return tf.constant(lut)


def _canonical(spec: registry._Spec, ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """tfds example -> {'image' (encoded or uint8 [H,W,C]) | 'text', 'label' | 'seg' [H,W,1],
  'boxes' [K,4]}."""
  src, meta = spec.source, spec.meta
  out = {}
  if src.text_key:
    out["text"] = ex[src.text_key]
  elif src.seg_key:
    out["image"] = _decode_image(ex[src.image_key], meta.image_shape[-1])
  else:  # Classification decodes lazily: inception crops decode only the crop of a JPEG.
    out["image"] = ex[src.image_key]
  if src.seg_key:
    seg = tf.cast(_decode_image(ex[src.seg_key], 1), tf.int32)
    if src.label_map == "cityscapes":
      seg = tf.gather(_cityscapes_lut(), seg)
    out["seg"] = seg
  else:
    out["label"] = tf.cast(ex[src.label_key], tf.int32)
  if src.boxes_key:
    if "/" in src.boxes_key:
      outer, inner = src.boxes_key.split("/")
      b = ex[outer][inner]
    else:
      b = ex[src.boxes_key][None, :]
    out["boxes"] = tf.reshape(tf.cast(b, tf.float32), [-1, 4])
  return out


def _choose_one(boxes: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Bool [K]: one box drawn uniformly among those with positive area (none if all empty)."""
  valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
  count = tf.reduce_sum(tf.cast(valid, tf.int32))
  pick = tf.minimum(tf.cast(tf.random.stateless_uniform([], seed) * tf.cast(count, tf.float32),
                            tf.int32), count - 1)
  rank = tf.cumsum(tf.cast(valid, tf.int32)) - 1
  return valid & tf.equal(rank, pick)


class _Processor:
  """Per-example preprocessing of one dataset, split kind (train/eval) and option set."""

  def __init__(self, spec: registry._Spec, opts: PipelineOptions, train: bool,
               stored_shape: tuple[int, ...] | None = None):
    self.spec, self.opts, self.train = spec, opts, train
    self.stored_shape = stored_shape
    meta = spec.meta
    self.task = meta.task
    if meta.mean is not None:
      self.mean = tf.constant(meta.mean, tf.float32)
      self.std = tf.constant(meta.std, tf.float32)
      self.mean_pixel = self.mean * 255.0
    if self.task != "text":
      self.size = _image_size(spec, opts)
      self.channels = meta.image_shape[-1]
    recipe = spec.recipe
    self.flip = recipe.flip if opts.flip is None else opts.flip
    self.crop = (opts.crop or recipe.train_crop) if train else recipe.eval_crop
    self.scale = opts.crop_scale or recipe.scale
    self.ratio = opts.crop_ratio or recipe.ratio
    if recipe.resize is not None and opts.image_size is None:
      self.resize = recipe.resize
    else:
      self.resize = int(round(max(self.size) / _EVAL_RESIZE_RATIO)) if self.task != "text" else 0

  def __call__(self, ex: dict[str, tf.Tensor], seed: tf.Tensor,
               index: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    self._index = index  # The example's position (traced), for the image shape check.
    ex = _canonical(self.spec, ex)
    if self.task == "text":
      return self._text(ex)
    if self.task == "segmentation":
      return self._segmentation(ex, seed)
    return self._classification(ex, seed)

  # -- classification ---------------------------------------------------------------------------
  def _classification(self, ex, seed):
    opts = self.opts
    seeds = tf.random.experimental.stateless_split(seed, 4)
    out = {"label": ex["label"], "mask": tf.constant(True)}
    boxes = ex.get("boxes")
    objectness_boxes, keep = boxes, None
    is_context = tf.constant(False)
    if boxes is not None and self.train and opts.mask_variant:
      keep = _choose_one(boxes, seeds[0])
      objectness_boxes = tf.where(keep[:, None], boxes, tf.zeros_like(boxes))
    if boxes is not None and self.train and opts.context_rate > 0:
      is_context = tf.random.stateless_uniform([], seeds[1]) < opts.context_rate
    if boxes is not None and opts.remove_objects:
      is_context = tf.constant(True)
    may_fill_all = boxes is not None and (
        (self.train and opts.context_rate > 0) or opts.remove_objects)

    def fill(image, image_boxes):
      """Mean-pixel fills; ``image_boxes`` are the boxes in ``image``'s own coordinates."""
      if keep is not None:
        image = boxes_lib.fill_boxes(image, image_boxes, self.mean_pixel, keep=keep)
      if may_fill_all:
        image = tf.cond(is_context,
                        lambda: boxes_lib.fill_boxes(image, image_boxes, self.mean_pixel),
                        lambda: image)
      return image

    if self.crop in ("inception", "pad", "none"):
      # Pixel-aligned crops: crop first (decoding only the crop of a JPEG), then fill the boxes
      # mapped into the crop - the same pixels as filling before cropping - then resize.
      image, window = self._crop_first(ex["image"], seeds[2])
      if boxes is not None:
        image = fill(image, boxes_lib.transform_boxes(boxes, window))
      image = self._resize_to(image, self.size)
    else:  # Resize-then-crop recipes: fill at full resolution first.
      image = tf.cast(self._decode(ex["image"]), tf.float32)
      if boxes is not None:
        image = fill(image, boxes)
      image, window = self._crop(image, seeds[2])

    flip = boxes_lib.random_flip(seeds[3]) if (self.train and self.flip) else tf.constant(False)
    image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
    image.set_shape([self.size[0], self.size[1], self.channels])
    out["image"] = (image / 255.0 - self.mean) / self.std

    if boxes is not None and opts.wants_objectness:
      # Objectness is computed for the whole batch at once (`_finish_batch`): far cheaper than
      # one small graph per example.
      out.update(_objectness_boxes=objectness_boxes, _window=window, _context=is_context)
    if boxes is not None and opts.return_boxes:
      moved = boxes_lib.transform_boxes(objectness_boxes, window)
      moved = tf.cond(flip, lambda: boxes_lib.flip_boxes(moved), lambda: moved)
      moved = moved[:opts.return_boxes]
      moved = tf.pad(moved, [[0, opts.return_boxes - tf.shape(moved)[0]], [0, 0]])
      moved.set_shape([opts.return_boxes, 4])
      out["boxes"] = moved
    return out

  def _crop_first(self, image, seed):
    """Pixel-aligned crop at the input resolution: (float crop, window)."""
    if self.crop == "inception":
      if image.dtype == tf.string:
        crop, window = boxes_lib.decode_inception_crop(image, self.channels, seed, self.scale,
                                                       self.ratio)
      else:
        begin, size, window = boxes_lib.sample_inception_crop(tf.shape(image), seed, self.scale,
                                                              self.ratio)
        crop = tf.slice(image, begin, size)
      return tf.cast(crop, tf.float32), window
    image = tf.cast(self._decode(image), tf.float32)
    if self.crop == "pad":
      return boxes_lib.pad_crop(image, seed, self.spec.recipe.pad)
    return image, tf.constant(boxes_lib.FULL_WINDOW, tf.float32)

  def _decode(self, image):
    return _decode_image(image, self.channels, self.stored_shape, getattr(self, "_index", None))

  def _crop(self, image, seed):
    """Resize-then-crop recipes: (float image of self.size, crop window)."""
    if self.crop == "resize_crop":
      return boxes_lib.resize_crop(image, seed, self.resize, self.size)
    if self.crop == "center":
      return boxes_lib.center_crop(image, self.resize, self.size)
    raise ValueError(f"Unexpected crop {self.crop!r}.")

  @staticmethod
  def _resize_to(image, size, method="bilinear"):
    static = image.shape[:2]
    if static[0] == size[0] and static[1] == size[1]:
      return image
    out = tf.image.resize(image, size, method=method)
    return tf.cast(out, image.dtype) if method == "nearest" else out

  # -- segmentation -------------------------------------------------------------------------------
  def _segmentation(self, ex, seed):
    image = tf.cast(ex["image"], tf.float32)
    seg = ex["seg"]
    if self.train:
      image, seg = self._scale_crop(image, seg, seed)
    else:
      image, seg = self._fit_and_pad(image, seg)
    seg = seg[:, :, 0]
    ignore = self.spec.meta.ignore_label
    mask = tf.not_equal(seg, ignore)
    return {"image": (image / 255.0 - self.mean) / self.std,
            "label": tf.where(mask, seg, tf.zeros_like(seg)), "mask": mask}

  def _pad_to(self, image, seg, height, width):
    """Pads bottom/right to at least (height, width): image with the mean pixel, labels with
    the ignore label."""
    shape = tf.shape(image)
    pad_h = tf.maximum(height - shape[0], 0)
    pad_w = tf.maximum(width - shape[1], 0)
    paddings = [[0, pad_h], [0, pad_w], [0, 0]]
    image = tf.pad(image - self.mean_pixel, paddings) + self.mean_pixel
    seg = tf.pad(seg, paddings, constant_values=self.spec.meta.ignore_label)
    return image, seg

  def _scale_crop(self, image, seg, seed):
    seeds = tf.random.experimental.stateless_split(seed, 4)
    lo, hi = self.spec.recipe.seg_scale
    scale = tf.random.stateless_uniform([], seeds[0], lo, hi)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    new = tf.cast(tf.round(shape * scale), tf.int32)
    image = tf.image.resize(image, new, method="bilinear")
    seg = tf.image.resize(seg, new, method="nearest")
    crop_h, crop_w = self.size
    image, seg = self._pad_to(image, seg, crop_h, crop_w)
    shape = tf.shape(image)
    oy = tf.random.stateless_uniform([], seeds[1], 0, shape[0] - crop_h + 1, dtype=tf.int32)
    ox = tf.random.stateless_uniform([], seeds[2], 0, shape[1] - crop_w + 1, dtype=tf.int32)
    image = image[oy:oy + crop_h, ox:ox + crop_w]
    seg = seg[oy:oy + crop_h, ox:ox + crop_w]
    if self.flip:
      flip = boxes_lib.random_flip(seeds[3])
      image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
      seg = tf.cond(flip, lambda: tf.reverse(seg, axis=[1]), lambda: seg)
    image.set_shape([crop_h, crop_w, self.channels])
    seg.set_shape([crop_h, crop_w, 1])
    return image, seg

  def _fit_and_pad(self, image, seg):
    """Eval: images larger than the eval size are shrunk to fit (aspect kept), then padded."""
    if self.opts.image_size is not None:
      height, width = self.size
    else:
      height, width = registry._SEG_EVAL_SHAPE.get(self.spec.meta.name, self.size)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    factor = tf.minimum(1.0, tf.minimum(height / shape[0], width / shape[1]))
    new = tf.minimum(tf.cast(tf.math.ceil(shape * factor - 1e-3), tf.int32), [height, width])

    def shrink():
      return (tf.image.resize(image, new, method="bilinear"),
              tf.image.resize(seg, new, method="nearest"))

    image, seg = tf.cond(factor < 1.0, shrink, lambda: (image, seg))
    image, seg = self._pad_to(image, seg, height, width)
    image.set_shape([height, width, self.channels])
    seg.set_shape([height, width, 1])
    return image, seg

  # -- text ---------------------------------------------------------------------------------------
  def _text(self, ex):
    meta = self.spec.meta
    length = self.opts.max_length or meta.image_shape[0]
    vocab = self.opts.vocab_size or meta.vocab_size
    text = tf.strings.regex_replace(tf.strings.lower(ex["text"]), "[^a-z0-9]+", " ")
    words = tf.strings.split(text)[:length]
    ids = tf.strings.to_hash_bucket_fast(words, vocab - 1) + 1
    ids = tf.pad(ids, [[0, length - tf.shape(ids)[0]]])
    ids.set_shape([length])
    return {"tokens": tf.cast(ids, tf.int32), "label": ex["label"], "mask": tf.constant(True)}


# --------------------------------------------------------------------------------------------
# Streams.


def _finish_batch(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """Batch-level work: objectness of every example from its (zero-padded) boxes and window."""
  batch = dict(batch)
  if "_window" in batch:
    value = boxes_lib.objectness_tf(batch.pop("_objectness_boxes"), batch.pop("_window"))
    batch["objectness"] = tf.where(batch.pop("_context"), tf.constant(-1.0), value)
  return batch


def _batch(ds: tf.data.Dataset, batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
  # padded_batch: the per-example box lists differ in length; zero rows are padding boxes.
  ds = ds.padded_batch(batch_size, drop_remainder=drop_remainder)
  return ds.map(_finish_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _epoch_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
  return tf.constant(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def _tf_options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = True
  return options


def _with_index(example: dict[str, tf.Tensor], index: tf.Tensor, opts: PipelineOptions
                ) -> dict[str, tf.Tensor]:
  # '_index' (always) names a bad example in errors; the iterators remove it.
  return {**example, "_index": index, **({"index": index} if opts.return_index else {})}


def _train_stream(examples, processor, *, num_examples, batch_size, seed, start_batch,
                  process_count, opts, name) -> tf.data.Dataset:
  per_host = num_examples // process_count
  batches_per_epoch = per_host // batch_size
  if batches_per_epoch < 1:
    raise ValueError(f"{name}: {num_examples} examples over {process_count} host(s) cannot fill "
                     f"one batch of {batch_size} per host.")
  per_epoch = batches_per_epoch * batch_size
  first_epoch, offset = divmod(start_batch, batches_per_epoch)
  buffer = min(opts.shuffle_buffer, per_host + 1)

  def epoch(e):
    shuffled = examples.shuffle(buffer, seed=_epoch_seed(seed, e), reshuffle_each_iteration=False)
    return shuffled.take(per_epoch).map(lambda index, ex: (e, index, ex))

  def process(e, index, ex):
    return _with_index(processor(ex, tf.stack([_epoch_seed(seed, e), index]), index), index,
                       opts)

  ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch)
  ds = ds.skip(offset * batch_size)
  ds = ds.map(process, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = _batch(ds, batch_size, drop_remainder=True)
  return ds.prefetch(opts.prefetch).with_options(_tf_options())


def _eval_stream(examples, processor, *, batch_size, opts) -> tf.data.Dataset:
  def process(index, ex):
    return _with_index(processor(ex, tf.stack([tf.constant(0, tf.int64), index]), index), index,
                       opts)

  ds = examples.map(process, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = _batch(ds, batch_size, drop_remainder=False)
  return ds.prefetch(opts.prefetch).with_options(_tf_options())


def _pad_batch(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  n = batch["mask"].shape[0]
  if n == batch_size:
    return batch
  return {k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def _empty_batch(element_spec, batch_size: int) -> dict[str, np.ndarray]:
  return {k: np.zeros((batch_size,) + tuple(s.shape[1:]), s.dtype.as_numpy_dtype)
          for k, s in element_spec.items() if k != "_index"}


def _checked(ds, name, split, num_classes, shape) -> Iterator[dict[str, np.ndarray]]:
  """The host batches, each checked (labels; tf.data errors as one line) before it is returned."""
  for batch in checks.iterate(ds, name, split, shape):
    index = batch.pop("_index")
    checks.check_labels(name, split, batch, index, num_classes)
    yield batch


def _iterate_eval(batches, ds, batch_size, num_batches) -> Iterator[dict[str, np.ndarray]]:
  count = 0
  for batch in batches:
    yield _pad_batch(batch, batch_size)
    count += 1
  for _ in range(num_batches - count):  # Hosts with a smaller shard pad to the common count.
    yield _empty_batch(ds.element_spec, batch_size)


def _process_layout(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"Need 0 <= process_index < process_count, got {process_index}, "
                     f"{process_count}.")
  return int(process_index), int(process_count)


def make_dataset(name: str, split: str, *, batch_size: int, train: bool, seed: int = 0,
                 data_dir: str | None = None, start_batch: int = 0,
                 process_index: int | None = None, process_count: int | None = None,
                 **options) -> Iterator[dict[str, np.ndarray]]:
  """Host-local numpy batches of a registered dataset.

  Args:
    name: registry key (see `names()`).
    split: 'train', 'val', 'test' (mapped through `info(name)`) or a raw tfds split string.
    batch_size: examples per host batch.
    train: True: infinite, shuffled, augmented stream, whole batches only. False: one
      deterministic pass, the last batch padded to ``batch_size`` with ``mask=False``.
    seed: seed of the training stream (shuffling and augmentation).
    data_dir: tfds data dir (default: tfds' default, ``~/tensorflow_datasets`` or
      ``$TFDS_DATA_DIR``).
    start_batch: training: resume exactly at batch ``start_batch`` of the stream.
    process_index: this host's index (default ``jax.process_index()``).
    process_count: number of hosts (default ``jax.process_count()``).
    **options: see `PipelineOptions`.

  Yields:
    dicts with 'image' float32 [B,H,W,C] normalised (text: 'tokens' int32 [B,T]), 'label'
    int32 [B] (segmentation [B,H,W]), 'mask' bool shaped like 'label', plus 'objectness'
    float32 [B] / 'boxes' float32 [B,K,4] when requested.

  Raises:
    ValueError: unknown dataset or option, or bad values.
    checks.DataError (a ValueError): an out-of-range label, an image of the wrong shape, an
      empty split (one line naming dataset, split and example).
    FileNotFoundError: the data are not available offline (the message says how to get them).
  """
  spec = registry.spec(name)
  opts = PipelineOptions.create(spec.meta, options)
  for arg, value, low in (("batch_size", batch_size, 1), ("start_batch", start_batch, 0),
                          ("seed", seed, 0)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
      raise ValueError(f"{name}: {arg} must be an int >= {low}, got {value!r}.")
  if not train and start_batch:
    raise ValueError(f"{name}: start_batch only applies to training streams.")
  process_index, process_count = _process_layout(process_index, process_count)
  examples, builder = _load(spec, _resolve_split(spec.meta, split), data_dir, opts)
  if opts.max_examples is not None:
    examples = examples.take(opts.max_examples)
  num_examples = _num_examples(examples)
  checks.check_not_empty(name, split, num_examples)
  # Indices are global (before sharding) so augmentation does not depend on the host count.
  examples = examples.enumerate().shard(process_count, process_index)
  stored_shape = _static_image_shape(builder, spec.source.image_key)
  processor = _Processor(spec, opts, train, stored_shape)
  num_classes = spec.meta.num_classes
  if train:
    ds = _train_stream(examples, processor, num_examples=num_examples, batch_size=batch_size,
                       seed=int(seed), start_batch=int(start_batch),
                       process_count=process_count, opts=opts, name=f"{name} split {split!r}")
    return _checked(ds, name, split, num_classes, stored_shape)
  ds = _eval_stream(examples, processor, batch_size=batch_size, opts=opts)
  num_batches = math.ceil(math.ceil(num_examples / process_count) / batch_size)
  return _iterate_eval(_checked(ds, name, split, num_classes, stored_shape), ds, batch_size,
                       num_batches)
