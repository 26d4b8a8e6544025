"""clutter_objects: real handwritten digits at varied sizes on cluttered backgrounds.

Every image (32x32x3) shows one or two instances of its class - real scikit-learn digit
glyphs (8x8, see `digits.py`), rescaled to 5..28 px, coloured and alpha-blended - on a
background of smooth colour fields, pixel noise, random strokes and *distractor fragments*
(cropped pieces of other digits). Small instances are genuinely ambiguous (a 5-px digit among
digit-like fragments), large ones are easy, so the fraction of the crop covered by the object
(objectness) predicts how much a label can be trusted: what adaptive label smoothing needs.

Annotations: the class label, the tight box of every instance (pixels with ink alpha > 0.2,
normalised edge coordinates), and a segmentation mask (0 background, 1 + class where alpha >=
0.4, 255 = ignore on the anti-aliased rim 0.2 < alpha < 0.4).

Glyphs never cross splits: train images use glyphs from the `digits` train split only, and so
on. Everything is a pure function of (config seed, split), so the dataset is reproducible.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from calib_jax.data.builders import digits

IMAGE_SIZE = 32
NUM_CLASSES = 10
IGNORE = 255
_SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}
INK_THRESHOLD = 0.2
FOREGROUND_THRESHOLD = 0.4


@functools.lru_cache(maxsize=None)
def _interp_matrix(n_out: int, n_in: int) -> np.ndarray:
  """Bilinear (half-pixel centres, edge clamp) resampling matrix ``[n_out, n_in]``."""
  pos = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
  pos = np.clip(pos, 0, n_in - 1)
  lo = np.floor(pos).astype(int)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = pos - lo
  m = np.zeros((n_out, n_in), np.float32)
  m[np.arange(n_out), lo] += 1 - frac
  m[np.arange(n_out), hi] += frac
  return m


def _resize(a: np.ndarray, h: int, w: int) -> np.ndarray:
  """Bilinear resize of a ``[H, W]`` or ``[H, W, C]`` array."""
  my, mx = _interp_matrix(h, a.shape[0]), _interp_matrix(w, a.shape[1])
  if a.ndim == 2:
    return my @ a @ mx.T
  return np.stack([my @ a[:, :, c] @ mx.T for c in range(a.shape[2])], axis=-1)


def _background(rng: np.random.Generator) -> np.ndarray:
  base = rng.uniform(0.2, 0.8, size=3)
  field = _resize(rng.normal(0.0, 0.15, size=(4, 4, 3)), IMAGE_SIZE, IMAGE_SIZE)
  noise = rng.normal(0.0, 0.05, size=(IMAGE_SIZE, IMAGE_SIZE, 3))
  return (base + field + noise).astype(np.float32)


_YY, _XX = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float32) + 0.5


def _blend(image: np.ndarray, alpha: np.ndarray, color: np.ndarray, top: int = 0,
           left: int = 0) -> None:
  """Alpha-blends ``color`` into the ``alpha``-sized region of ``image`` at (top, left)."""
  h, w = alpha.shape
  region = image[top:top + h, left:left + w]
  a = alpha[:, :, None]
  region *= 1.0 - a
  region += a * color.astype(np.float32)


def _draw_stroke(image: np.ndarray, rng: np.random.Generator) -> None:
  p = rng.uniform(-4, IMAGE_SIZE + 4, size=2).astype(np.float32)
  q = rng.uniform(-4, IMAGE_SIZE + 4, size=2).astype(np.float32)
  d = q - p
  t = np.clip(((_YY - p[0]) * d[0] + (_XX - p[1]) * d[1]) / max(float(d @ d), 1e-6), 0, 1)
  dist = np.hypot(_YY - (p[0] + t * d[0]), _XX - (p[1] + t * d[1]))
  alpha = np.clip(np.float32(rng.uniform(0.5, 1.2)) - dist, 0, 1)
  _blend(image, alpha * np.float32(rng.uniform(0.3, 0.7)), rng.uniform(0, 1, size=3))


def _draw_fragment(image: np.ndarray, glyph: np.ndarray, rng: np.random.Generator) -> None:
  """A cropped piece of some digit: digit-like strokes that are not an object."""
  gh, gw = rng.integers(3, 6, size=2)
  gy, gx = rng.integers(0, 8 - gh + 1), rng.integers(0, 8 - gw + 1)
  piece = glyph[gy:gy + gh, gx:gx + gw]
  h, w = (int(v) for v in rng.integers(4, 11, size=2))
  patch = np.clip(_resize(piece, h, w), 0, 1) * np.float32(rng.uniform(0.4, 0.8))
  top = int(rng.integers(0, IMAGE_SIZE - h + 1))
  left = int(rng.integers(0, IMAGE_SIZE - w + 1))
  _blend(image, patch, rng.uniform(0, 1, size=3), top, left)


def _contrasting_color(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
  """A random colour whose brightness differs from the background's by at least 0.4."""
  color = rng.uniform(0, 1, size=3)
  if abs(color.mean() - background.mean()) < 0.4:
    color = 1.0 - 0.4 * (1.0 - color) if background.mean() < 0.5 else 0.4 * color
  return color


def render_example(rng: np.random.Generator, label: int, glyphs_of_class: np.ndarray,
                   all_glyphs: np.ndarray) -> dict[str, np.ndarray]:
  """Renders one image of class ``label``.

  Returns:
    dict with 'image' uint8 [32,32,3], 'boxes' float32 [K,4], 'segmentation_mask' uint8
    [32,32,1].
  """
  image = _background(rng)
  for _ in range(rng.integers(1, 4)):
    _draw_stroke(image, rng)
  for _ in range(rng.integers(0, 3)):
    _draw_fragment(image, all_glyphs[rng.integers(len(all_glyphs))], rng)

  seg = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.uint8)
  boxes = []
  num_objects = 1 if rng.uniform() < 0.7 else 2
  for _ in range(num_objects):
    glyph = glyphs_of_class[rng.integers(len(glyphs_of_class))]
    height = int(np.round(np.exp(rng.uniform(np.log(5), np.log(28)))))
    width = max(4, int(np.round(height * rng.uniform(0.7, 1.0))))
    top = int(rng.integers(0, IMAGE_SIZE - height + 1))
    left = int(rng.integers(0, IMAGE_SIZE - width + 1))
    alpha = np.clip(_resize(glyph, height, width), 0, 1)
    color = _contrasting_color(rng, image[top:top + height, left:left + width])
    _blend(image, alpha * np.float32(rng.uniform(0.9, 1.0)), color, top, left)
    ink = alpha > INK_THRESHOLD
    rows, cols = np.nonzero(ink.any(axis=1))[0], np.nonzero(ink.any(axis=0))[0]
    boxes.append([(top + rows[0]) / IMAGE_SIZE, (left + cols[0]) / IMAGE_SIZE,
                  (top + rows[-1] + 1) / IMAGE_SIZE, (left + cols[-1] + 1) / IMAGE_SIZE])
    seg_region = seg[top:top + height, left:left + width]
    seg_region[ink] = IGNORE
    seg_region[alpha >= FOREGROUND_THRESHOLD] = label + 1
  image = np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)
  return {"image": image, "boxes": np.asarray(boxes, np.float32),
          "segmentation_mask": seg[:, :, None]}


def generate_split(split: str, num_examples: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
  """Yields ``num_examples`` examples of ``split``; a pure function of its arguments."""
  glyphs, labels = digits.load_glyphs()
  pool = digits.split_indices()[split]
  pool_glyphs, pool_labels = glyphs[pool], labels[pool]
  by_class = [pool_glyphs[pool_labels == c] for c in range(NUM_CLASSES)]
  rng = np.random.default_rng([seed, _SPLIT_IDS[split]])
  for _ in range(num_examples):
    label = int(rng.integers(NUM_CLASSES))
    example = render_example(rng, label, by_class[label], pool_glyphs)
    example["label"] = label
    yield example


@dataclasses.dataclass
class ClutterConfig(tfds.core.BuilderConfig):
  """Split sizes and seed of a clutter_objects variant."""
  sizes: dict = dataclasses.field(default_factory=dict)
  seed: int = 0


class ClutterObjects(tfds.core.GeneratorBasedBuilder):
  """Digits on cluttered backgrounds with boxes and segmentation masks (generated)."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
      "1.0.0": "Initial release.",
      "1.1.0": "Fainter strokes and fragments, objects at least 0.4 brighter/darker than their "
               "background: a small CNN now generalises (about 50 % test accuracy after 1,500 "
               "steps, from 17 % on the smallest objects to 71 % on the largest).",
  }
  BUILDER_CONFIGS = [
      ClutterConfig(name="default", description="10k/2k/2k images.",
                    sizes={"train": 10000, "validation": 2000, "test": 2000}, seed=0),
      ClutterConfig(name="tiny", description="256/64/64 images for smoke tests.",
                    sizes={"train": 256, "validation": 64, "test": 64}, seed=0),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3)),
            "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
            "objects": tfds.features.Sequence({"bbox": tfds.features.BBoxFeature()}),
            "segmentation_mask": tfds.features.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 1)),
        }),
        supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Generated: nothing to download.
    return {split: self._generate_examples(split, n)
            for split, n in self.builder_config.sizes.items()}

  def _generate_examples(self, split, num_examples):
    for i, ex in enumerate(generate_split(split, num_examples, self.builder_config.seed)):
      yield i, {
          "image": ex["image"],
          "label": ex["label"],
          "objects": {"bbox": [tfds.features.BBox(*map(float, b)) for b in ex["boxes"]]},
          "segmentation_mask": ex["segmentation_mask"],
      }
