"""Fashion-MNIST read from local idx files (the Debian package `dataset-fashion-mnist`).

The registry's `fashion_mnist` falls back to this builder when tfds' own `fashion_mnist` cannot
be downloaded (see `calib_jax.data.prepare`).

Debian re-gzipped the original files, so tfds' checksums for its own `fashion_mnist` builder do
not match; this subclass feeds it the local files instead of downloading. Source: Zalando
Research, MIT licence; Debian ships it as `/usr/share/datasets/fashion-mnist/*.gz`.
"""
from __future__ import annotations

import gzip
import os
import struct

import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import mnist as tfds_mnist

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train_data": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_data": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def idx_count(path: str) -> int:
  """Number of items declared in the header of a (gzipped) idx file."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    _, count = struct.unpack(">II", f.read(8))
  return count


def find_files(manual_dir: str | None) -> dict[str, str]:
  """Paths of the four idx files in ``manual_dir`` (if it has them) or the Debian folder."""
  candidates = [d for d in (manual_dir, DEBIAN_DIR) if d]
  for folder in candidates:
    paths = {k: os.path.join(folder, v) for k, v in FILES.items()}
    if all(os.path.exists(p) for p in paths.values()):
      return paths
  raise FileNotFoundError(
      "Fashion-MNIST idx files not found in " + " or ".join(candidates) +
      f"; expected {sorted(FILES.values())}. Install them with "
      "`apt-get install -y dataset-fashion-mnist`.")


def _manual_dir_or_none(dl_manager) -> str | None:
  try:
    return str(dl_manager.manual_dir)
  except (AssertionError, ValueError):  # tfds raises these for a missing/empty manual dir.
    return None


class FashionMnistDebian(tfds_mnist.FashionMNIST):
  """tfds' Fashion-MNIST, prepared from local idx files instead of a download."""

  VERSION = tfds.core.Version("3.0.1")
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Optional: a folder with the four idx .gz files; by default they are read from "
      f"{DEBIAN_DIR} (apt-get install -y dataset-fashion-mnist).")

  def _split_generators(self, dl_manager):
    manual_dir = _manual_dir_or_none(dl_manager)
    paths = find_files(manual_dir)
    files = dl_manager.extract(paths)
    splits = []
    for split, prefix in ((tfds.Split.TRAIN, "train"), (tfds.Split.TEST, "test")):
      num = idx_count(paths[f"{prefix}_data"])
      if idx_count(paths[f"{prefix}_labels"]) != num:
        raise ValueError(f"Fashion-MNIST {prefix}: image and label files disagree in length.")
      splits.append(tfds.core.SplitGenerator(name=split, gen_kwargs=dict(
          num_examples=num, data_path=files[f"{prefix}_data"],
          label_path=files[f"{prefix}_labels"])))
    return splits
