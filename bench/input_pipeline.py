"""Input-pipeline throughput of calib_jax.data: images/s per host core.

Workloads (``--which``; the recipes are the library's own, through `data.make_dataset`):
  * cifar: clutter_objects (32x32 PNGs read from tfrecords), with the CIFAR recipe (pad-4 crop
    + flip) and with the ALS recipe (box-aware inception crop + exact objectness + 15 % context
    samples, and the 'mask' variant); a generated Tiny-ImageNet-like dataset (64x64 JPEGs)
    with its recipe (pad-8 crop + flip).
  * cache: the CIFAR-style stream in the epochs after the first, without and with the training
    stream's in-memory caches ('decoded' with augmentation, 'processed' without).
  * imagenet: a generated ImageNet-like dataset (JPEGs of 300..500 px with 1-3 boxes),
    inception crop to 224x224 + flip; with objectness + context samples, and with the ALS
    recipe's 'mask' variant.
  * voc: a generated VOC-like dataset (500x375 JPEGs, PNG label maps) through the
    ``voc2012_seg`` recipe: random scale 0.5-2, pad, 512x512 crop, flip.
  * cityscapes: a generated Cityscapes-like dataset (2048x1024 PNG images, labelId PNGs)
    through the ``cityscapes`` recipe: labelIds -> trainIds, random scale 0.5-2, pad,
    512x1024 crop, flip.
  * segmentation: voc and cityscapes; all: everything.
The generated datasets (`bench_datasets`) are prepared once in ``--data_dir``; the big ones are
read with ``cache='none'``, as the real datasets are (too large for the automatic cache).

Every workload runs in its own process pinned to ``n`` cores for each ``n`` of ``--cores``
(the last ``n`` CPUs this process may use; as ``taskset -c 1`` for n = 1), so tf.data's thread
pool and AUTOTUNE see ``n`` cores. Images/s per core is the pinned throughput divided by ``n``.

Usage:
  python bench/input_pipeline.py [--batches 30] [--repeats 3] [--cores 1,2]
      [--which cifar|cache|imagenet|voc|cityscapes|segmentation|all]
      [--data_dir /tmp/calib_bench_tfds] [--compare_with REV]

``--compare_with=REV`` runs every row also with the calib_jax of git revision REV (exported
to a temporary folder), right before the working tree's, so that before/after are side by side
in one run.

Prints one markdown row per configuration and core count: the best and the median of
``--repeats`` timed runs (fresh pipeline each), the best per core, the CPU time other
processes took on the pinned cores while it was timed (in cores; from /proc/stat minus this
run's own CPU time) and the 1-minute load average at the row's end. A row whose others' share
exceeds ``--max_others`` is run again (up to ``--retries`` times) and the quietest attempt kept.
The first batches (warm-up, shuffle-buffer fill) are not timed.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, NamedTuple

from absl import app, flags

_BATCHES = flags.DEFINE_integer("batches", 30, "timed batches per run")
_REPEATS = flags.DEFINE_integer("repeats", 3, "runs of each configuration (fresh pipeline each)")
_DATA_DIR = flags.DEFINE_string("data_dir", "/tmp/calib_bench_tfds",
                                "where the generated datasets are prepared")
_WHICH = flags.DEFINE_enum(
    "which", "all", ["cifar", "imagenet", "cache", "voc", "cityscapes", "segmentation", "all"],
    "which workloads to time")
_CORES = flags.DEFINE_list("cores", ["1", "2"], "core counts each workload is pinned to")
_MAX_OTHERS = flags.DEFINE_float(
    "max_others", 0.2, "rerun a row when other processes used more than this many of its cores")
_RETRIES = flags.DEFINE_integer("retries", 2, "reruns of a row that was disturbed")
_COMPARE_WITH = flags.DEFINE_string(
    "compare_with", None, "git revision whose calib_jax is timed beside the working tree's")
_WORKER = flags.DEFINE_string("worker", None, "internal: time this configuration and print JSON")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Config(NamedTuple):
  label: str
  name: str  # registry name
  kw: dict[str, Any]
  after_epoch: bool = False  # time the epochs after the first (the caches are filled by then)
  batch_divisor: int = 1  # time --batches // batch_divisor batches (slow workloads)


def _configs(which: str, data_dir: str) -> dict[str, Config]:
  configs: dict[str, Config] = {}
  if which in ("cifar", "all"):
    common = dict(batch_size=256, train=True, data_dir=data_dir)
    configs.update({
        "cifar_pad": Config("CIFAR-style 32x32: pad-4 crop + flip", "clutter_objects",
                            dict(common, crop="pad", flip=True)),
        "cifar_inception": Config("CIFAR-style 32x32: inception crop", "clutter_objects",
                                  dict(common)),
        "cifar_als": Config("CIFAR-style 32x32: inception crop + objectness + 15% context",
                            "clutter_objects", dict(common, objectness=True, context_rate=0.15)),
        "cifar_mask": Config("CIFAR-style 32x32: + mask variant", "clutter_objects",
                             dict(common, mask_variant=True, context_rate=0.15)),
        "tiny_imagenet": Config(
            "Tiny-ImageNet-style 64x64 JPEG: pad-8 crop + flip", "tiny_imagenet",
            dict(common, tfds_name="bench_tiny_imagenet_like", cache="none")),
    })
  if which in ("cache", "all"):
    common = dict(batch_size=256, train=True, data_dir=data_dir)
    augmented = dict(common, crop="pad", flip=True)
    plain = dict(common, crop="none", flip=False)
    configs.update({
        "cache_aug_none": Config("CIFAR-style, pad-4 crop + flip, after epoch 1: no cache",
                                 "clutter_objects", dict(augmented, cache="none"), True),
        "cache_aug_decoded": Config(
            "CIFAR-style, pad-4 crop + flip, after epoch 1: cache='decoded'", "clutter_objects",
            dict(augmented, cache="decoded"), True),
        "cache_plain_none": Config("CIFAR-style, no augmentation, after epoch 1: no cache",
                                   "clutter_objects", dict(plain, cache="none"), True),
        "cache_plain_processed": Config(
            "CIFAR-style, no augmentation, after epoch 1: cache='processed'", "clutter_objects",
            dict(plain, cache="processed"), True),
    })
  if which in ("imagenet", "all"):
    common = dict(batch_size=64, train=True, data_dir=data_dir, tfds_name="bench_imagenet_like",
                  shuffle_buffer=256)
    configs.update({
        "imagenet": Config("ImageNet-style 224x224: inception crop + flip",
                           "imagenet2012_boxes", dict(common)),
        "imagenet_context": Config("ImageNet-style 224x224: + objectness + 15% context",
                                   "imagenet2012_boxes",
                                   dict(common, objectness=True, context_rate=0.15)),
        "imagenet_als": Config("ImageNet-style 224x224: ALS recipe (objectness + mask variant)",
                               "imagenet2012_boxes",
                               dict(common, objectness=True, mask_variant=True)),
    })
  if which in ("voc", "segmentation", "all"):
    configs["voc"] = Config(
        "VOC-style 500x375 JPEG + PNG -> 512x512: scale, pad, crop, flip", "voc2012_seg",
        dict(batch_size=8, train=True, data_dir=data_dir, tfds_name="bench_voc_like",
             shuffle_buffer=256, cache="none"))
  if which in ("cityscapes", "segmentation", "all"):
    configs["cityscapes"] = Config(
        "Cityscapes-style 2048x1024 PNG + PNG -> 512x1024: label map, scale, pad, crop, flip",
        "cityscapes",
        dict(batch_size=4, train=True, data_dir=data_dir, tfds_name="bench_cityscapes_like",
             shuffle_buffer=64, cache="none"), batch_divisor=4)
  return configs


# --------------------------------------------------------------------------------------------
# The worker: one configuration, in a process pinned to its cores.


def _cpu_seconds(cpus: set[int]) -> float:
  """Busy CPU seconds of ``cpus`` since boot (/proc/stat: all but idle and iowait)."""
  busy = 0
  with open("/proc/stat") as f:
    for line in f:
      name, *ticks = line.split()
      if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
        values = [int(t) for t in ticks]
        busy += sum(values) - values[3] - values[4]
  return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
  t = os.times()
  return t.user + t.system


def _time_one(make, batches: int, warmup: int, after_epoch: bool) -> tuple[float, float]:
  """(examples/s, CPU seconds other processes took on this process's cores) of one run."""
  it = make()
  if after_epoch:  # The caches are filled by the first epoch: time the later ones.
    warmup += it.batches_per_epoch
  for _ in range(warmup):
    batch = next(it)
  size = len(batch["label"])
  cpus = os.sched_getaffinity(0)
  busy, own, start = _cpu_seconds(cpus), _own_seconds(), time.perf_counter()
  for _ in range(batches):
    next(it)
  elapsed = time.perf_counter() - start
  others = max(0.0, (_cpu_seconds(cpus) - busy) - (_own_seconds() - own))
  return batches * size / elapsed, others / elapsed


def _worker(key: str) -> None:
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  import bench_datasets  # noqa: F401  # pylint: disable=g-import-not-at-top  (registers them)
  from calib_jax import data  # pylint: disable=g-import-not-at-top
  config = _configs("all", _DATA_DIR.value)[key]

  def make():
    return data.make_dataset(config.name, "train[:100%]", process_index=0, process_count=1,
                             **config.kw)

  batches = max(3, _BATCHES.value // config.batch_divisor)
  runs = [_time_one(make, batches, 3, config.after_epoch) for _ in range(_REPEATS.value)]
  print(json.dumps({"rates": [r for r, _ in runs], "others": max(o for _, o in runs),
                    "cores_seen": len(os.sched_getaffinity(0)),
                    "calib_jax": os.path.dirname(data.__file__)}))


# --------------------------------------------------------------------------------------------
# The driver: prepares the data, runs every configuration pinned, prints the rows.


def _export(rev: str) -> str:
  """A folder holding calib_jax as of git revision ``rev``."""
  folder = tempfile.mkdtemp(prefix=f"calib_jax_{rev}_")
  archive = subprocess.run(["git", "-C", _ROOT, "archive", rev, "calib_jax"], check=True,
                           capture_output=True).stdout
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    tar.extractall(folder, filter="data")
  return folder


def _run_pinned(key: str, cpus: set[int], calib_root: str) -> dict[str, Any]:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [calib_root, os.path.dirname(os.path.abspath(__file__))]))
  args = [sys.executable, os.path.abspath(__file__), f"--worker={key}",
          f"--batches={_BATCHES.value}", f"--repeats={_REPEATS.value}",
          f"--data_dir={_DATA_DIR.value}"]
  done = subprocess.run(args, env=env, capture_output=True, text=True,
                        preexec_fn=lambda: os.sched_setaffinity(0, cpus))
  if done.returncode:
    raise RuntimeError(f"worker {key} failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def _prepare(which: str, data_dir: str) -> None:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  import bench_datasets  # noqa: F401  # pylint: disable=g-import-not-at-top
  for w, name in (("cifar", "bench_tiny_imagenet_like"), ("imagenet", "bench_imagenet_like"),
                  ("voc", "bench_voc_like"), ("cityscapes", "bench_cityscapes_like")):
    if which in (w, "all") or (which == "segmentation" and w in ("voc", "cityscapes")):
      tfds.builder(name, data_dir=data_dir).download_and_prepare()


# What each recipe of calib_jax/configs reads (a workload above) and the dry run's estimates of
# its step (docs/results/accelerators/<name>.json), with the host vCPUs per chip of the machine
# that hosts such chips (docs/accelerators.md; BENCHMARKS.md cites the public figures).
RECIPES = (
    ("ImageNet ResNet-50 ACLS", "imagenet", ("imagenet_resnet50_acls_v5e-4x8_dtype-bfloat16",
                                             "imagenet_resnet50_acls_h100-8_dtype-bfloat16")),
    ("ImageNet ResNet-50 LS-SC", "imagenet", ("imagenet_resnet50_ls_sc_v5e-4x8_dtype-bfloat16",)),
    ("ImageNet ViT-S/16 SAM", "imagenet", ("imagenet_vit_s16_sam_v5e-4x8",
                                           "imagenet_vit_s16_sam_h100-8")),
    ("ImageNet boxes ALS ResNet-50", "imagenet_als",
     ("imagenet_boxes_resnet50_als_v5e-4x8_dtype-bfloat16",)),
    ("VOC DeepLabV3 ResNet-50", "voc", ("voc2012_deeplabv3_resnet50_v5e-2x4_dtype-bfloat16",
                                        "voc2012_deeplabv3_resnet50_h100-8_dtype-bfloat16")),
    ("Cityscapes DeepLabV3+ ResNet-101", "cityscapes",
     ("cityscapes_deeplabv3plus_resnet101_v5e-2x2_dtype-bfloat16",
      "cityscapes_deeplabv3plus_resnet101_h100-4_dtype-bfloat16")),
    ("CIFAR-10 ResNet-50", "cifar_pad", ("cifar10_resnet50_v5e-2x4", "cifar10_resnet50_h100-1")),
    ("Tiny ImageNet ResNet-50", "tiny_imagenet", ("tiny_imagenet_resnet50_v5e-2x4",)),
)
HOST_VCPUS_PER_CHIP = {"v5e": 224 / 8, "h100": 208 / 8}  # ct5lp-hightpu-8t; a3-highgpu-8g


def _print_cores_per_chip(per_core: dict[str, float]) -> None:
  """Host cores each chip needs: the chip's images/s (global batch / chips / estimated step
  time) over the pipeline's images/s on one pinned core."""
  print("\n| recipe | topology (dtype) | chip images/s (dry run) | pipeline images/s per core "
        "| cores needed per chip | host vCPUs per chip |")
  print("|---|---|---|---|---|---|")
  for recipe, workload, runs in RECIPES:
    if workload not in per_core:
      continue
    for run in runs:
      with open(os.path.join(_ROOT, "docs", "results", "accelerators", run + ".json")) as f:
        est = json.load(f)
      chip_rate = est["global_batch"] / est["chips"] / est["step_seconds_estimate"]
      vcpus = HOST_VCPUS_PER_CHIP[est["topology"].split(":")[0]]
      print(f"| {recipe} | {est['topology']} ({est.get('dtype', 'float32')}) | {chip_rate:,.0f} "
            f"| {per_core[workload]:,.1f} | {chip_rate / per_core[workload]:,.1f} "
            f"| {vcpus:.0f} |")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if _WORKER.value:
    _worker(_WORKER.value)
    return
  import numpy as np  # pylint: disable=g-import-not-at-top
  available = sorted(os.sched_getaffinity(0))
  try:
    counts = [int(c) for c in _CORES.value]
  except ValueError:
    raise app.UsageError(f"--cores must be integers, got {_CORES.value}") from None
  if not counts or min(counts) < 1 or max(counts) > len(available):
    raise app.UsageError(f"--cores must be in 1..{len(available)} (CPUs available), got "
                         f"{_CORES.value}")
  _prepare(_WHICH.value, _DATA_DIR.value)
  versions = [("working tree", _ROOT)]
  if _COMPARE_WITH.value:
    versions.insert(0, (_COMPARE_WITH.value, _export(_COMPARE_WITH.value)))

  print(f"CPUs available: {available}, load average: {os.getloadavg()[0]:.2f}")
  print("| pipeline | calib_jax | batch | cores | images/s (best) | images/s (median) "
        "| per core (best) | others on these cores | load avg |")
  print("|---|---|---|---|---|---|---|---|---|")
  per_core = {}  # the working tree's images/s pinned to one core, by workload
  for key, config in _configs(_WHICH.value, _DATA_DIR.value).items():
    for n in counts:
      cpus = set(available[-n:])
      for version, root in versions:
        attempts = []
        for _ in range(1 + _RETRIES.value):
          attempts.append(_run_pinned(key, cpus, root))
          if attempts[-1]["others"] <= _MAX_OTHERS.value:
            break
        result = min(attempts, key=lambda r: r["others"])
        rates = result["rates"]
        rerun = f" ({len(attempts)} attempts)" if len(attempts) > 1 else ""
        print(f"| {config.label} | {version} | {config.kw['batch_size']} | {n} "
              f"| {max(rates):,.1f} | {np.median(rates):,.1f} | {max(rates) / n:,.1f} "
              f"| {result['others']:.2f}{rerun} | {os.getloadavg()[0]:.2f} |", flush=True)
        if n == 1 and root == _ROOT:
          per_core[key] = max(rates)
  _print_cores_per_chip(per_core)


if __name__ == "__main__":
  app.run(main)
