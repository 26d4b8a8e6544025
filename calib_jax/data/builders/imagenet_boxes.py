"""ImageNet-2012 with the ILSVRC localisation boxes (for adaptive label smoothing).

Extends tfds' `imagenet2012` builder (same manual archives: ``ILSVRC2012_img_train.tar``,
``ILSVRC2012_img_val.tar``) with an ``objects/bbox`` feature read from the ILSVRC box XMLs in
the same manual dir: ``ILSVRC2012_bbox_train_v2.tar.gz`` and ``ILSVRC2012_bbox_val_v3.tgz``,
or any folders (e.g. extracted ``bbox_train/``, ``bbox_val/``) holding ``*.xml`` files named
after the images. The 'train' split keeps only training images that have boxes (the ~0.5M-image
subset the ALS paper trains on); 'validation' keeps every image (objects empty without XML).
"""
from __future__ import annotations

import os
import tarfile
import xml.etree.ElementTree as ET
from typing import IO, Iterable

import tensorflow_datasets as tfds
from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as tfds_inet
from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

BOX_ARCHIVES = ("ILSVRC2012_bbox_train_v2.tar.gz", "ILSVRC2012_bbox_val_v3.tgz")


def parse_box_xml(f: IO[bytes]) -> tuple[str, list[tfds.features.BBox]]:
  """(image stem, normalised boxes) of one ILSVRC annotation XML."""
  root = ET.parse(f).getroot()
  stem = os.path.splitext(root.find("filename").text.strip())[0]
  width = float(root.find("size/width").text)
  height = float(root.find("size/height").text)
  boxes = []
  for obj in root.findall("object"):
    bb = obj.find("bndbox")
    x0, y0, x1, y1 = (float(bb.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax"))
    ys = sorted((min(max(y0 / height, 0.0), 1.0), min(max(y1 / height, 0.0), 1.0)))
    xs = sorted((min(max(x0 / width, 0.0), 1.0), min(max(x1 / width, 0.0), 1.0)))
    boxes.append(tfds.features.BBox(ymin=ys[0], xmin=xs[0], ymax=ys[1], xmax=xs[1]))
  return stem, boxes


def _xml_files(manual_dir: str) -> Iterable[IO[bytes]]:
  """Yields every box XML found in the box archives or in folders of the manual dir."""
  for name in BOX_ARCHIVES:
    path = os.path.join(manual_dir, name)
    if os.path.exists(path):
      with tarfile.open(path) as tar:
        for member in tar:
          if member.isfile() and member.name.endswith(".xml"):
            yield tar.extractfile(member)
  for dirpath, _, files in os.walk(manual_dir):
    for name in files:
      if name.endswith(".xml"):
        with open(os.path.join(dirpath, name), "rb") as f:
          yield f


def read_boxes(manual_dir: str) -> dict[str, list[tfds.features.BBox]]:
  """Boxes of every image that has an XML, keyed by image file stem."""
  boxes = {}
  for f in _xml_files(manual_dir):
    stem, image_boxes = parse_box_xml(f)
    boxes.setdefault(stem, []).extend(image_boxes)
  return boxes


class Imagenet2012Boxes(tfds_inet.Builder):
  """tfds' imagenet2012 plus ILSVRC bounding boxes; train = images with boxes."""

  name = "imagenet2012_boxes"
  VERSION = tfds.core.Version("1.0.0")
  SUPPORTED_VERSIONS = []
  RELEASE_NOTES = {"1.0.0": "imagenet2012 5.1.0 plus ILSVRC boxes."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = tfds_inet.Builder.MANUAL_DOWNLOAD_INSTRUCTIONS + (
      "\nFor boxes add ILSVRC2012_bbox_train_v2.tar.gz and ILSVRC2012_bbox_val_v3.tgz (or "
      "folders of their XML files).")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(names_file=imagenet_common.label_names_file()),
            "file_name": tfds.features.Text(),
            "objects": tfds.features.Sequence({"bbox": tfds.features.BBoxFeature()}),
        }),
        supervised_keys=("image", "label"),
        homepage="https://image-net.org/",
    )

  def _split_generators(self, dl_manager):
    boxes = read_boxes(os.fspath(dl_manager.manual_dir))
    if not boxes:
      raise FileNotFoundError(
          f"No ILSVRC box XMLs found in {dl_manager.manual_dir}; expected one of "
          f"{BOX_ARCHIVES} or folders of *.xml files.")
    splits = super()._split_generators(dl_manager)
    for split in splits:
      split.gen_kwargs.update(boxes=boxes, require_boxes=(split.name == tfds.Split.TRAIN))
    return splits

  def _generate_examples(self, archive, boxes=None, require_boxes=False, **kwargs):
    for key, record in super()._generate_examples(archive, **kwargs):
      stem = os.path.splitext(os.path.basename(record["file_name"]))[0]
      image_boxes = boxes.get(stem, [])
      if require_boxes and not image_boxes:
        continue
      record["objects"] = {"bbox": image_boxes}
      yield key, record
