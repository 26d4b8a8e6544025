"""PASCAL VOC 2012 semantic segmentation (21 classes, 255 = ignore) with object boxes.

tfds' `voc` is detection only, so this builder reads ``VOCtrainval_11-May-2012.tar`` (or its
extracted ``VOCdevkit/VOC2012``) from a manual dir: the 'train' (1,464) and 'val' (1,449)
lists of ``ImageSets/Segmentation``, ``JPEGImages``, the palette PNGs of ``SegmentationClass``
(pixel = class index, 255 on object borders) and the boxes of ``Annotations/*.xml``.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import numpy as np
import tensorflow_datasets as tfds

from calib_jax.data.builders import _manual

CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
           "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
           "sheep", "sofa", "train", "tvmonitor")
_INSTRUCTIONS = ("Place VOCtrainval_11-May-2012.tar "
                 "(http://host.robots.ox.ac.uk/pascal/VOC/voc2012/).")


def parse_annotation(path: str) -> list[tuple[tfds.features.BBox, int]]:
  """Normalised boxes and class ids (1..20) of a VOC annotation XML."""
  root = ET.parse(path).getroot()
  width = float(root.find("size/width").text)
  height = float(root.find("size/height").text)
  objects = []
  for obj in root.findall("object"):
    bb = obj.find("bndbox")
    # VOC pixel coordinates are 1-based and inclusive.
    x0, y0, x1, y1 = (float(bb.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax"))
    box = tfds.features.BBox(ymin=max(0.0, (y0 - 1) / height), xmin=max(0.0, (x0 - 1) / width),
                             ymax=min(1.0, y1 / height), xmax=min(1.0, x1 / width))
    objects.append((box, CLASSES.index(obj.find("name").text.strip())))
  return objects


class Voc2012Segmentation(tfds.core.GeneratorBasedBuilder):
  """PASCAL VOC 2012 segmentation masks and boxes from the manually provided archive."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "segmentation_mask": tfds.features.Image(shape=(None, None, 1),
                                                     encoding_format="png"),
            "objects": tfds.features.Sequence({
                "bbox": tfds.features.BBoxFeature(),
                "label": tfds.features.ClassLabel(names=CLASSES),
            }),
            "file_name": tfds.features.Text(),
        }),
        homepage="http://host.robots.ox.ac.uk/pascal/VOC/voc2012/",
    )

  def _split_generators(self, dl_manager):
    root = _manual.locate(dl_manager, ("VOCtrainval_11-May-2012.tar",), "VOCdevkit",
                          _INSTRUCTIONS)
    root = os.path.join(root, "VOC2012")
    return {"train": self._generate_examples(root, "train"),
            "validation": self._generate_examples(root, "val")}

  def _generate_examples(self, root, image_set):
    from PIL import Image  # pylint: disable=g-import-not-at-top
    with open(os.path.join(root, "ImageSets", "Segmentation", f"{image_set}.txt")) as f:
      ids = [line.strip() for line in f if line.strip()]
    for image_id in ids:
      with Image.open(os.path.join(root, "SegmentationClass", f"{image_id}.png")) as png:
        mask = np.asarray(png)  # Palette indices: class ids and 255.
      if mask.ndim != 2:
        raise ValueError(f"VOC mask {image_id}.png is not a palette image (shape {mask.shape}).")
      objects = parse_annotation(os.path.join(root, "Annotations", f"{image_id}.xml"))
      yield image_id, {
          "image": _manual.rgb_jpeg(os.path.join(root, "JPEGImages", f"{image_id}.jpg")),
          "segmentation_mask": mask[:, :, None].astype(np.uint8),
          "objects": {"bbox": [b for b, _ in objects], "label": [c for _, c in objects]},
          "file_name": image_id,
      }
