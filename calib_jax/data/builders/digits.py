"""scikit-learn's handwritten digits (UCI optdigits test set, 1,797 real 8x8 images) as tfds.

Source: `sklearn.datasets.load_digits` (ships inside the scikit-learn wheel, BSD-3 licence;
the data are the UCI "Optical Recognition of Handwritten Digits" set, CC BY 4.0). Pixel values
0..16 are stored as uint8 ``round(v * 255 / 16)``. Splits are a fixed seeded permutation:
1,297 train / 200 validation / 300 test.
"""
from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

SPLIT_SIZES = {"train": 1297, "validation": 200, "test": 300}
SPLIT_SEED = 20240607


def split_indices() -> dict[str, np.ndarray]:
  """Indices into `load_digits()` of each split (also used by clutter_objects' glyph pools)."""
  order = np.random.RandomState(SPLIT_SEED).permutation(sum(SPLIT_SIZES.values()))
  out, start = {}, 0
  for split, size in SPLIT_SIZES.items():
    out[split] = np.sort(order[start:start + size])
    start += size
  return out


def load_glyphs() -> tuple[np.ndarray, np.ndarray]:
  """All 1,797 digits as float ``[N, 8, 8]`` in [0, 1] and int labels ``[N]``."""
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  bunch = load_digits()
  return bunch.images.astype(np.float32) / 16.0, bunch.target.astype(np.int64)


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
  """1,797 real 8x8 handwritten digits from scikit-learn; no network needed."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 1)),
            "label": tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=("image", "label"),
        homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ship with scikit-learn.
    return {split: self._generate_examples(idx) for split, idx in split_indices().items()}

  def _generate_examples(self, indices):
    glyphs, labels = load_glyphs()
    for i in indices:
      image = np.round(glyphs[i] * 255.0).astype(np.uint8)[:, :, None]
      yield int(i), {"image": image, "label": int(labels[i])}
