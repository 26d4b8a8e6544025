"""Per-example processing: one processor per task, chosen from `PROCESSORS` by the dataset's task.

A processor is built once per stream (`make_processor(spec, opts, train, stored_shape)`) and
called inside tf.data as ``processor(example, seed, index)`` on one tfds example (its image
encoded, or decoded by the stream's cache, `caching`), an int64 ``[2]`` stateless seed
(``(epoch seed, example index)``) and the example's position in the split; it returns the
example's model input, 'label' and 'mask'. Every random choice is drawn from ``seed``, so a
stream is a pure function of its seed.

`finish_batch` is the batch-level step after batching (objectness of a whole batch at once).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from calib_jax.data import boxes as boxes_lib
from calib_jax.data import checks, crops, registry
from calib_jax.data.options import PipelineOptions
from calib_jax.data.registry import DatasetSpec

__all__ = ["ClassificationProcessor", "SegmentationProcessor", "TextProcessor", "PROCESSORS",
           "make_processor", "finish_batch", "decode_image"]

Example = dict[str, tf.Tensor]


def graph_fn(fn):
  """`fn` for `tf.data.Dataset.map` as written, not converted by autograph.

  The pipeline's functions are written as graphs already (`tf.cond`; Python `if`s only on
  options and static shapes), so autograph's conversion, which tf.data applies to every mapped
  function, changes nothing in them and costs a program start CPU seconds (~15 % of the CPU of
  test_run_loop and test_data_pipeline, paired). A function that branched in Python on a tensor
  fails when traced, at once ("using a tf.Tensor as a Python bool"), not silently.
  """
  return tf.autograph.experimental.do_not_convert(fn)


def decode_image(data: tf.Tensor, channels: int, static_shape=None, index=None) -> tf.Tensor:
  """uint8 ``[H, W, channels]`` of a stored image (encoded bytes or already decoded).

  With ``static_shape`` (the shape every image of the dataset has), an image of another shape
  fails: with its example ``index`` named when given (`checks.with_shape`).
  """
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


def _choose_one(boxes: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Bool [K]: one box drawn uniformly among those with positive area (none if all empty)."""
  valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
  count = tf.reduce_sum(tf.cast(valid, tf.int32))
  pick = tf.minimum(tf.cast(tf.random.stateless_uniform([], seed) * tf.cast(count, tf.float32),
                            tf.int32), count - 1)
  rank = tf.cumsum(tf.cast(valid, tf.int32)) - 1
  return valid & tf.equal(rank, pick)


def _read_boxes(ex: Example, key: str) -> tf.Tensor:
  """float32 [K, 4] object boxes of a tfds example ('objects/bbox': [K, 4]; 'bbox': [4])."""
  if "/" in key:
    outer, inner = key.split("/")
    b = ex[outer][inner]
  else:
    b = ex[key][None, :]
  return tf.reshape(tf.cast(b, tf.float32), [-1, 4])


def _input_mean(meta, opts: PipelineOptions) -> tf.Tensor:
  """The per-channel mean (of [0, 1] pixels) subtracted (`PipelineOptions.input_statistics`)."""
  return tf.constant(opts.input_statistics(meta)[0], tf.float32)


def _input_std(meta, opts: PipelineOptions) -> tf.Tensor:
  """What centred pixels are divided by (`PipelineOptions.input_statistics`)."""
  return tf.constant(opts.input_statistics(meta)[1], tf.float32)


def _model_image(image: tf.Tensor, mean: tf.Tensor, std: tf.Tensor,
                 opts: PipelineOptions) -> tf.Tensor:
  """The batch's 'image' of a processed float image on 0..255: normalised, or with
  ``raw_images`` rounded to uint8 grey levels (normalised on the device instead)."""
  if opts.raw_images:
    return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 255.0)), tf.uint8)
  return (image / 255.0 - mean) / std


class ClassificationProcessor:
  """Image classification: crop (`crops.CROPS`), flip, normalise; with object boxes also the
  adaptive-label-smoothing options (objectness, context samples, 'mask' variant, removed
  objects) and the boxes in output coordinates."""

  def __init__(self, spec: DatasetSpec, opts: PipelineOptions, train: bool,
               stored_shape: tuple[int, ...] | None = None):
    meta, recipe, source = spec.meta, spec.recipe, spec.source
    self.image_key, self.label_key, self.boxes_key = (source.image_key, source.label_key,
                                                      source.boxes_key)
    self.opts, self.train, self.stored_shape = opts, train, stored_shape
    self.mean = _input_mean(meta, opts)
    self.std = _input_std(meta, opts)
    self.mean_pixel = self.mean * 255.0
    self.size = opts.image_hw(meta)
    self.channels = meta.input_shape[-1]
    self.flip = recipe.flip if opts.flip is None else opts.flip
    crop = (opts.crop or recipe.train_crop) if train else recipe.eval_crop
    if crop not in crops.CROPS:
      raise ValueError(f"{meta.name}: crop must be one of {tuple(crops.CROPS)} (crops.CROPS), "
                       f"got {crop!r}.")
    self.crop = crops.CROPS[crop]
    # What `caching` may keep of this stream: processed examples when processing draws nothing
    # from its seed, decoded images unless the crop decodes only its window of a JPEG.
    # `random_options` names the options that draw (for one-line errors: the 'processed' cache,
    # `data.on_device`).
    self.random_options = [] if not train else [
        *([f"crop={crop!r}"] if crop in crops.RANDOM_CROPS else []),
        *(["flip=True"] if self.flip else []),
        *(["mask_variant=True"] if opts.mask_variant else []),
        *([f"context_rate={opts.context_rate}"] if opts.context_rate > 0 else [])]
    self.is_random = bool(self.random_options)
    self.decodes_window = crop in crops.WINDOW_DECODING_CROPS
    self.pad = recipe.pad
    self.scale = opts.crop_scale or recipe.scale
    self.ratio = opts.crop_ratio or recipe.ratio
    self.resize = crops.resize_side(self.size, recipe.resize, opts.image_size is not None)

  def __call__(self, ex: Example, seed: tf.Tensor, index: tf.Tensor | None = None) -> Example:
    opts, train = self.opts, self.train
    seeds = tf.random.experimental.stateless_split(seed, 4)
    out = {"label": tf.cast(ex[self.label_key], tf.int32), "mask": tf.constant(True)}
    boxes = _read_boxes(ex, self.boxes_key) if self.boxes_key else None
    objectness_boxes, keep = boxes, None
    is_context = tf.constant(False)
    if boxes is not None and train and opts.mask_variant:
      keep = _choose_one(boxes, seeds[0])
      objectness_boxes = tf.where(keep[:, None], boxes, tf.zeros_like(boxes))
    if boxes is not None and train and opts.context_rate > 0:
      is_context = tf.random.stateless_uniform([], seeds[1]) < opts.context_rate
    if boxes is not None and opts.remove_objects:
      is_context = tf.constant(True)
    may_fill_all = boxes is not None and ((train and opts.context_rate > 0) or
                                          opts.remove_objects)

    def fill(image, window):
      """Mean-pixel fills of the boxes, mapped into ``window`` (None: as stored)."""
      if boxes is None:
        return image
      image_boxes = boxes if window is None else boxes_lib.transform_boxes(boxes, window)
      if keep is not None:
        image = boxes_lib.fill_boxes(image, image_boxes, self.mean_pixel, keep=keep)
      if may_fill_all:
        image = tf.cond(is_context,
                        lambda: boxes_lib.fill_boxes(image, image_boxes, self.mean_pixel),
                        lambda: image)
      return image

    def decode(image):
      return decode_image(image, self.channels, self.stored_shape, index)

    args = crops.CropArgs(size=self.size, channels=self.channels, decode=decode, fill=fill,
                          pad=self.pad, resize=self.resize, scale=self.scale, ratio=self.ratio)
    image, window = self.crop(ex[self.image_key], seeds[2], args)

    flip = boxes_lib.random_flip(seeds[3]) if (train and self.flip) else tf.constant(False)
    image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
    image.set_shape([self.size[0], self.size[1], self.channels])
    out["image"] = _model_image(image, self.mean, self.std, opts)

    if boxes is not None and opts.wants_objectness:
      # Objectness is computed for the whole batch at once (`finish_batch`): far cheaper than
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


class SegmentationProcessor:
  """Semantic segmentation: the recipe's random scale, pad and crop in training
  (`crops.scale_pad_crop`), fit-and-pad to its evaluation shape otherwise (`crops.fit_and_pad`);
  stored mask values mapped through the source's ``label_map``; ignored pixels get label 0 and
  ``mask`` False."""

  def __init__(self, spec: DatasetSpec, opts: PipelineOptions, train: bool,
               stored_shape: tuple[int, ...] | None = None):
    del stored_shape  # Segmentation images come in any size.
    meta, recipe, source = spec.meta, spec.recipe, spec.source
    self.image_key, self.seg_key = source.image_key, source.seg_key
    self.train, self.opts = train, opts
    self.random_options = ["the segmentation training crop (random scale, pad and crop)"
                           ] if train else []
    self.is_random = train
    self.decodes_window = False
    self.mean = _input_mean(meta, opts)
    self.std = _input_std(meta, opts)
    self.mean_pixel = self.mean * 255.0
    self.ignore_label = meta.ignore_label
    self.channels = meta.input_shape[-1]
    self.size = opts.image_hw(meta)
    self.eval_shape = (self.size if opts.image_size is not None or recipe.eval_shape is None
                       else tuple(recipe.eval_shape))
    self.flip = recipe.flip if opts.flip is None else opts.flip
    self.seg_scale = recipe.seg_scale
    self.label_lut = None
    if source.label_map:  # Stored mask values are uint8.
      self.label_lut = np.full(256, meta.ignore_label, np.int32)
      for stored, label in source.label_map.items():
        self.label_lut[stored] = label

  def __call__(self, ex: Example, seed: tf.Tensor, index: tf.Tensor | None = None) -> Example:
    del index
    image = decode_image(ex[self.image_key], self.channels)
    seg = decode_image(ex[self.seg_key], 1)
    lut = None if self.label_lut is None else tf.constant(self.label_lut)
    if self.train:  # Crops first, then maps the crop's labels (`crops.scale_pad_crop`).
      image, seg = crops.scale_pad_crop(image, seg, seed, size=self.size, scale=self.seg_scale,
                                        flip=self.flip, mean_pixel=self.mean_pixel,
                                        ignore_label=self.ignore_label, label_lut=lut)
    else:
      image, seg = tf.cast(image, tf.float32), tf.cast(seg, tf.int32)
      if lut is not None:
        seg = tf.gather(lut, seg)
      image, seg = crops.fit_and_pad(image, seg, shape=self.eval_shape,
                                     mean_pixel=self.mean_pixel, ignore_label=self.ignore_label)
    seg = seg[:, :, 0]
    mask = tf.not_equal(seg, self.ignore_label)
    return {"image": _model_image(tf.cast(image, tf.float32), self.mean, self.std, self.opts),
            "label": tf.where(mask, seg, tf.zeros_like(seg)), "mask": mask}


class TextProcessor:
  """Text classification: lower-cased words hashed into token ids ``1..vocab_size-1`` (0 pads),
  cut or padded to ``max_length``."""

  def __init__(self, spec: DatasetSpec, opts: PipelineOptions, train: bool,
               stored_shape: tuple[int, ...] | None = None):
    del train, stored_shape  # Text is not augmented.
    self.is_random = self.decodes_window = False
    self.random_options = []
    meta, source = spec.meta, spec.source
    self.text_key, self.label_key = source.text_key, source.label_key
    self.length = opts.max_length or meta.max_length
    self.vocab = opts.vocab_size or meta.vocab_size

  def __call__(self, ex: Example, seed: tf.Tensor, index: tf.Tensor | None = None) -> Example:
    del seed, index
    text = tf.strings.regex_replace(tf.strings.lower(ex[self.text_key]), "[^a-z0-9]+", " ")
    words = tf.strings.split(text)[:self.length]
    ids = tf.strings.to_hash_bucket_fast(words, self.vocab - 1) + 1
    ids = tf.pad(ids, [[0, self.length - tf.shape(ids)[0]]])
    ids.set_shape([self.length])
    return {"tokens": tf.cast(ids, tf.int32), "label": tf.cast(ex[self.label_key], tf.int32),
            "mask": tf.constant(True)}


PROCESSORS: dict[str, Any] = {
    "classification": ClassificationProcessor,
    "segmentation": SegmentationProcessor,
    "text": TextProcessor,
}


def make_processor(spec: DatasetSpec, opts: PipelineOptions, train: bool,
                   stored_shape: tuple[int, ...] | None = None):
  """The processor of ``spec``'s task (`PROCESSORS`).

  Args:
    spec: the dataset's registry spec.
    opts: validated options.
    train: training (augmented) or evaluation processing.
    stored_shape: the shape every stored image has, checked per example (None: any).
  """
  task = spec.meta.task
  if task not in PROCESSORS:
    raise ValueError(f"{spec.meta.name}: task must be one of {tuple(PROCESSORS)}, got {task!r}.")
  return PROCESSORS[task](spec, opts, train, stored_shape)


def finish_batch(batch: Example) -> Example:
  """Batch-level work: objectness of every example from its (zero-padded) boxes and window."""
  batch = dict(batch)
  if "_window" in batch:
    value = boxes_lib.objectness_tf(batch.pop("_objectness_boxes"), batch.pop("_window"))
    batch["objectness"] = tf.where(batch.pop("_context"), tf.constant(-1.0), value)
  return batch
