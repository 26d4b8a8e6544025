"""Generated tfds datasets shaped like the real ones, for `input_pipeline.py` only (not a program).

* ``bench_imagenet_like``: JPEGs of 300..500 px (ImageNet's train images average about 400x350)
  with 1-3 object boxes, read with the ``imagenet2012_boxes`` recipe.
* ``bench_tiny_imagenet_like``: 64x64 JPEGs with one box, read with the ``tiny_imagenet``
  recipe.
* ``bench_voc_like``: 500x375 JPEGs (VOC 2012's usual size) with palette-style PNG label maps
  (classes 0..20, 255 on object borders), read with the ``voc2012_seg`` recipe.
* ``bench_cityscapes_like``: 2048x1024 images with labelId PNGs (0..33), read with the
  ``cityscapes`` recipe. The images are PNGs, as Cityscapes' leftImg8bit files and tfds'
  ``cityscapes`` dataset store them (a PNG of that size decodes far slower than a JPEG); one
  compresses to about 2.5 MB, the order of the real files.

The content is smooth random colour (compresses like a photo, unlike white noise) and label maps
are blocky regions; none of it is meant to be learnt.
"""
from __future__ import annotations

import io

import numpy as np
import tensorflow_datasets as tfds

IMAGENET_LIKE_EXAMPLES = 768
TINY_IMAGENET_LIKE_EXAMPLES = 4096
VOC_LIKE_EXAMPLES = 256
CITYSCAPES_LIKE_EXAMPLES = 32


def _photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
  """uint8 [h, w, 3]: coarse random colours upsampled bilinearly."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.uint8)
  return np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))


def _regions(rng: np.random.Generator, h: int, w: int, values: np.ndarray, block: int
             ) -> np.ndarray:
  """uint8 [h, w, 1]: blocks of ``block`` px, each one of ``values``."""
  coarse = rng.choice(values, (h // block + 1, w // block + 1)).astype(np.uint8)
  return np.repeat(np.repeat(coarse, block, 0), block, 1)[:h, :w, None]


def _encode(image: np.ndarray, fmt: str) -> bytes:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  pil = Image.fromarray(image[:, :, 0] if image.shape[-1] == 1 else image)
  pil.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
  return buf.getvalue()


class BenchImagenetLike(tfds.core.GeneratorBasedBuilder):
  """ImageNet-like JPEGs with boxes, generated for benchmarking only."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=1000),
            "objects": tfds.features.Sequence({"bbox": tfds.features.BBoxFeature()}),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(IMAGENET_LIKE_EXAMPLES)}

  def _generate_examples(self, n):
    rng = np.random.default_rng(0)
    for i in range(n):
      h, w = int(rng.integers(300, 500)), int(rng.integers(300, 500))
      image = _photo(rng, h, w)
      boxes = []
      for _ in range(int(rng.integers(1, 4))):
        lo = rng.uniform(0, 0.6, 2)
        hi = lo + rng.uniform(0.1, 0.4, 2)
        boxes.append(tfds.features.BBox(lo[0], lo[1], min(hi[0], 1.0), min(hi[1], 1.0)))
      yield i, {"image": _encode(image, "JPEG"), "label": int(rng.integers(1000)),
                "objects": {"bbox": boxes}}


class BenchTinyImagenetLike(tfds.core.GeneratorBasedBuilder):
  """Tiny-ImageNet-like 64x64 JPEGs with one box, generated for benchmarking only."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(64, 64, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=200),
            "objects": tfds.features.Sequence({"bbox": tfds.features.BBoxFeature()}),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(TINY_IMAGENET_LIKE_EXAMPLES)}

  def _generate_examples(self, n):
    rng = np.random.default_rng(3)
    for i in range(n):
      lo = rng.uniform(0, 0.5, 2)
      box = tfds.features.BBox(lo[0], lo[1], lo[0] + 0.5, lo[1] + 0.5)
      yield i, {"image": _encode(_photo(rng, 64, 64), "JPEG"), "label": int(rng.integers(200)),
                "objects": {"bbox": [box]}}


class BenchVocLike(tfds.core.GeneratorBasedBuilder):
  """VOC-like 500x375 JPEGs with PNG label maps, generated for benchmarking only."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "segmentation_mask": tfds.features.Image(shape=(None, None, 1),
                                                     encoding_format="png"),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(VOC_LIKE_EXAMPLES)}

  def _generate_examples(self, n):
    rng = np.random.default_rng(1)
    for i in range(n):
      h, w = (375, 500) if i % 4 else (500, 375)  # VOC has portrait images too.
      mask = _regions(rng, h, w, np.r_[np.arange(21), 255], 25)
      yield i, {"image": _encode(_photo(rng, h, w), "JPEG"),
                "segmentation_mask": _encode(mask, "PNG")}


class BenchCityscapesLike(tfds.core.GeneratorBasedBuilder):
  """Cityscapes-like 2048x1024 PNG images and labelId PNGs, generated for benchmarking only."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image_left": tfds.features.Image(shape=(1024, 2048, 3), encoding_format="png"),
            "segmentation_label": tfds.features.Image(shape=(1024, 2048, 1),
                                                      encoding_format="png"),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(CITYSCAPES_LIKE_EXAMPLES)}

  def _generate_examples(self, n):
    rng = np.random.default_rng(2)
    for i in range(n):
      yield i, {"image_left": _encode(_photo(rng, 1024, 2048), "PNG"),
                "segmentation_label": _encode(_regions(rng, 1024, 2048, np.arange(34), 64),
                                              "PNG")}
