"""20 Newsgroups (20 topics) from the standard archive in a manual dir.

Reads ``20_newsgroups.tar.gz`` (the original 19,997 posts, folder ``20_newsgroups/<group>/``)
or ``20news-bydate.tar.gz`` (18,846 posts, ``20news-bydate-{train,test}/<group>/``), or their
extracted folders. As in MbLS / Mukhoti et al. (2020) the pooled posts are split by a fixed
seeded permutation into 15,098 / 900 / 3,999 (train / validation / test) - proportionally when
the archive has a different number of posts. The e-mail header (up to the first blank line) is
removed, as in the Keras example the GPool-CNN baselines use. Class ids follow sorted group
names.
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow_datasets as tfds

from calib_jax.data.builders import _manual

SPLIT_SIZES = {"train": 15098, "validation": 900, "test": 3999}
SPLIT_SEED = 20
_INSTRUCTIONS = ("Place 20_newsgroups.tar.gz or 20news-bydate.tar.gz "
                 "(http://qwone.com/~jason/20Newsgroups/).")
# (archives, folder whose parent holds the parts, parts holding <group>/<post> folders)
_LAYOUTS = (
    (("20_newsgroups.tar.gz", "20_newsgroups.tgz"), "20_newsgroups", ("20_newsgroups",)),
    (("20news-bydate.tar.gz",), "20news-bydate-train",
     ("20news-bydate-train", "20news-bydate-test")),
)


def strip_header(raw: str) -> str:
  """Body of a post: everything after the first blank line (the whole text if none)."""
  i = raw.find("\n\n")
  return raw[i + 2:] if i >= 0 else raw


def split_assignment(num_docs: int) -> np.ndarray:
  """Split id (0 train, 1 validation, 2 test) per document, from a fixed permutation."""
  total = sum(SPLIT_SIZES.values())
  sizes = [int(round(s * num_docs / total)) for s in SPLIT_SIZES.values()]
  sizes[0] = num_docs - sizes[1] - sizes[2]
  ids = np.repeat(np.arange(3), sizes)
  return ids[np.argsort(np.random.RandomState(SPLIT_SEED).permutation(num_docs))]


class Newsgroups20(tfds.core.GeneratorBasedBuilder):
  """20 Newsgroups text classification from a manually provided archive."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "label": tfds.features.ClassLabel(num_classes=20),
            "doc_id": tfds.features.Text(),
        }),
        supervised_keys=("text", "label"),
        homepage="http://qwone.com/~jason/20Newsgroups/",
    )

  def _split_generators(self, dl_manager):
    docs = self._find_documents(dl_manager)
    groups = sorted({g for g, _ in docs})
    if len(groups) != 20:
      raise ValueError(f"Expected 20 newsgroups, found {len(groups)}: {groups}.")
    assignment = split_assignment(len(docs))
    label_of = {g: i for i, g in enumerate(groups)}
    return {
        split: self._generate_examples(
            [(label_of[g], p) for (g, p), a in zip(docs, assignment) if a == split_id])
        for split_id, split in enumerate(SPLIT_SIZES)
    }

  @staticmethod
  def _find_documents(dl_manager) -> list[tuple[str, str]]:
    """All ``(group, path)`` posts of the first archive layout found, sorted."""
    errors = []
    for archives, folder, parts in _LAYOUTS:
      try:
        parent = os.path.dirname(_manual.locate(dl_manager, archives, folder, _INSTRUCTIONS))
      except FileNotFoundError as e:
        errors.append(str(e))
        continue
      docs = []
      for part in parts:
        base = os.path.join(parent, part)
        for group in sorted(os.listdir(base)):
          for name in sorted(os.listdir(os.path.join(base, group))):
            docs.append((group, os.path.join(base, group, name)))
      return sorted(docs)
    raise FileNotFoundError(" / ".join(errors))

  def _generate_examples(self, items):
    for label, path in items:
      with open(path, "rb") as f:
        text = strip_header(f.read().decode("latin-1"))
      doc_id = os.path.relpath(path, os.path.dirname(os.path.dirname(os.path.dirname(path))))
      yield doc_id, {"text": text, "label": label, "doc_id": doc_id}
