"""Input-pipeline throughput (examples/s) of calib_jax.data on this machine.

Three workloads:
  * CIFAR-style: clutter_objects (32x32 PNGs read from tfrecords), with the CIFAR recipe
    (pad-4 crop + flip) and with the ALS recipe (box-aware inception crop + exact objectness
    + 15 % context samples).
  * Caches: the CIFAR-style stream in the epochs after the first, without and with the
    training stream's in-memory caches ('decoded' with augmentation, 'processed' without).
  * ImageNet-style: a generated ImageNet-like tfds dataset (JPEGs of 300..500 px with 1-3
    boxes), inception crop to 224x224 + flip, without and with objectness/context samples.

Usage:
  python bench/input_pipeline.py [--batches 30] [--repeats 3] [--which cifar|cache|imagenet|all]
      [--data_dir /tmp/calib_bench_tfds]

Prints one markdown row per configuration: the best and the median of ``--repeats`` timed
runs (fresh pipeline each). Numbers depend on the CPU cores free at the time - on a shared
machine the best run is the closest to the pipeline's own speed; the first batches (warm-up,
shuffle-buffer fill) are not timed.
"""
from __future__ import annotations

import io
import os
import time

from absl import app, flags, logging
import numpy as np
import tensorflow_datasets as tfds

from calib_jax import data

IMAGENET_LIKE_EXAMPLES = 768
_BATCHES = flags.DEFINE_integer("batches", 30, "timed batches per run")
_REPEATS = flags.DEFINE_integer("repeats", 3, "runs of each configuration (fresh pipeline each)")
_DATA_DIR = flags.DEFINE_string("data_dir", "/tmp/calib_bench_tfds",
                                "where the generated datasets are prepared")
_WHICH = flags.DEFINE_enum("which", "all", ["cifar", "imagenet", "cache", "all"],
                           "which workloads to time")


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
    from PIL import Image  # pylint: disable=g-import-not-at-top
    rng = np.random.default_rng(0)
    for i in range(n):
      h, w = int(rng.integers(300, 500)), int(rng.integers(300, 500))
      # Smooth random content compresses like a photo, unlike white noise.
      coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.uint8)
      image = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))
      buf = io.BytesIO()
      Image.fromarray(image).save(buf, format="JPEG", quality=90)
      boxes = []
      for _ in range(int(rng.integers(1, 4))):
        lo = rng.uniform(0, 0.6, 2)
        hi = lo + rng.uniform(0.1, 0.4, 2)
        boxes.append(tfds.features.BBox(lo[0], lo[1], min(hi[0], 1.0), min(hi[1], 1.0)))
      yield i, {"image": buf.getvalue(), "label": int(rng.integers(1000)),
                "objects": {"bbox": boxes}}


def _throughput(make, batches: int, warmup: int = 3, after_epoch: bool = False) -> float:
  it = make()
  if after_epoch:  # The caches are filled by the first epoch: time the later ones.
    warmup += it.batches_per_epoch
  for _ in range(warmup):
    batch = next(it)
  size = len(batch["label"])
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * size / (time.perf_counter() - start)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  d, which = _DATA_DIR.value, _WHICH.value

  configs = []
  if which in ("cifar", "all"):
    common = dict(batch_size=256, train=True, data_dir=d)
    configs += [
        ("CIFAR-style 32x32: pad-4 crop + flip", "clutter_objects",
         dict(common, crop="pad", flip=True)),
        ("CIFAR-style 32x32: inception crop", "clutter_objects", dict(common)),
        ("CIFAR-style 32x32: inception crop + objectness + 15% context", "clutter_objects",
         dict(common, objectness=True, context_rate=0.15)),
        ("CIFAR-style 32x32: + mask variant", "clutter_objects",
         dict(common, mask_variant=True, context_rate=0.15)),
    ]
  if which in ("cache", "all"):
    # Epochs after the first, with and without the training stream's caches (`data.caching`).
    common = dict(batch_size=256, train=True, data_dir=d)
    augmented = dict(common, crop="pad", flip=True)
    plain = dict(common, crop="none", flip=False)
    configs += [
        ("CIFAR-style 32x32, pad-4 crop + flip, after epoch 1: no cache", "clutter_objects",
         dict(augmented, cache="none"), True),
        ("CIFAR-style 32x32, pad-4 crop + flip, after epoch 1: cache='decoded'",
         "clutter_objects", dict(augmented, cache="decoded"), True),
        ("CIFAR-style 32x32, no augmentation, after epoch 1: no cache", "clutter_objects",
         dict(plain, cache="none"), True),
        ("CIFAR-style 32x32, no augmentation, after epoch 1: cache='processed'",
         "clutter_objects", dict(plain, cache="processed"), True),
    ]
  if which in ("imagenet", "all"):
    tfds.builder("bench_imagenet_like", data_dir=d).download_and_prepare()
    common = dict(batch_size=64, train=True, data_dir=d, tfds_name="bench_imagenet_like",
                  shuffle_buffer=256)
    configs += [
        ("ImageNet-style 224x224: inception crop + flip", "imagenet2012_boxes",
         dict(common)),
        ("ImageNet-style 224x224: + objectness + 15% context", "imagenet2012_boxes",
         dict(common, objectness=True, context_rate=0.15)),
    ]

  print(f"cpu cores visible: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
  print("| pipeline | batch | examples/s (best) | examples/s (median) |")
  print("|---|---|---|---|")
  for label, name, kw, *after_epoch in configs:
    def make(name=name, kw=kw):
      return data.make_dataset(name, "train[:100%]", process_index=0, process_count=1, **kw)
    rates = [_throughput(make, _BATCHES.value, after_epoch=bool(after_epoch))
             for _ in range(_REPEATS.value)]
    print(f"| {label} | {kw['batch_size']} | {max(rates):,.0f} | {np.median(rates):,.0f} |",
          flush=True)


if __name__ == "__main__":
  app.run(main)
