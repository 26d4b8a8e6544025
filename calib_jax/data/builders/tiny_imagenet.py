"""Tiny-ImageNet (200 classes, 64x64) from the standard archive in a manual dir.

Not in the tfds catalogue. Reads ``tiny-imagenet-200.zip`` (or its extracted
``tiny-imagenet-200/`` folder) as distributed by Stanford CS231n:
``wnids.txt``, ``train/<wnid>/images/<wnid>_<k>.JPEG`` with ``train/<wnid>/<wnid>_boxes.txt``,
and ``val/images/*.JPEG`` with ``val/val_annotations.txt``.

Splits (as in Mukhoti et al. 2020 and MbLS): 'train' = training images ``k < 450`` of every
class (90,000), 'validation' = the held-out ``k >= 450`` (50 per class, 10,000), 'test' = the
official validation set (10,000). Every image has one box (pixel ``x0 y0 x1 y1``, inclusive),
stored normalised as ``[y0/64, x0/64, (y1+1)/64, (x1+1)/64]``. Class ids follow sorted wnids.
"""
from __future__ import annotations

import os
import re

import tensorflow_datasets as tfds

from calib_jax.data.builders import _manual

SIZE = 64
HELD_OUT_FROM = 450  # Training images k >= 450 of each class form the validation split.
_INSTRUCTIONS = "Place tiny-imagenet-200.zip (http://cs231n.stanford.edu/tiny-imagenet-200.zip)."


def _box(fields: list[str]) -> tfds.features.BBox:
  x0, y0, x1, y1 = (float(v) for v in fields)
  return tfds.features.BBox(ymin=max(0.0, y0 / SIZE), xmin=max(0.0, x0 / SIZE),
                            ymax=min(1.0, (y1 + 1) / SIZE), xmax=min(1.0, (x1 + 1) / SIZE))


class TinyImagenet(tfds.core.GeneratorBasedBuilder):
  """Tiny-ImageNet-200 with boxes, from a manually provided archive."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(SIZE, SIZE, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=200),
            "objects": tfds.features.Sequence({"bbox": tfds.features.BBoxFeature()}),
            "file_name": tfds.features.Text(),
        }),
        supervised_keys=("image", "label"),
        homepage="http://cs231n.stanford.edu/tiny-imagenet-200.zip",
    )

  def _split_generators(self, dl_manager):
    root = _manual.locate(dl_manager, ("tiny-imagenet-200.zip",), "tiny-imagenet-200",
                          _INSTRUCTIONS)
    with open(os.path.join(root, "wnids.txt")) as f:
      wnids = sorted(line.strip() for line in f if line.strip())
    if len(wnids) != 200:
      raise ValueError(f"{root}/wnids.txt lists {len(wnids)} classes, expected 200.")
    train = self._train_items(root, wnids)
    return {
        "train": self._generate_examples([t for t in train if t[3] < HELD_OUT_FROM]),
        "validation": self._generate_examples([t for t in train if t[3] >= HELD_OUT_FROM]),
        "test": self._generate_examples(self._val_items(root, wnids)),
    }

  @staticmethod
  def _train_items(root, wnids):
    items = []
    for label, wnid in enumerate(wnids):
      with open(os.path.join(root, "train", wnid, f"{wnid}_boxes.txt")) as f:
        for line in f:
          fields = line.split()
          if not fields:
            continue
          index = int(re.search(r"_(\d+)\.", fields[0]).group(1))
          path = os.path.join(root, "train", wnid, "images", fields[0])
          items.append((path, label, _box(fields[1:5]), index))
    return items

  @staticmethod
  def _val_items(root, wnids):
    label_of = {w: i for i, w in enumerate(wnids)}
    items = []
    with open(os.path.join(root, "val", "val_annotations.txt")) as f:
      for line in f:
        fields = line.split()
        if fields:
          path = os.path.join(root, "val", "images", fields[0])
          items.append((path, label_of[fields[1]], _box(fields[2:6]), -1))
    return items

  def _generate_examples(self, items):
    for path, label, box, _ in items:
      name = os.path.basename(path)
      yield name, {"image": _manual.rgb_jpeg(path), "label": label,
                   "objects": {"bbox": [box]}, "file_name": name}
