"""Speed of calib_jax.shift.corrupt against the reference, images per second (not a test; run it
where `imagecorruptions`, scikit-image and OpenCV are installed, e.g. the cross-check's venv).

calib_jax: one jitted call on a batch (--batch32 / --batch224 images), after a warm-up call
(compilation), median of --repeats calls with block_until_ready. The reference: its function on
each image of the batch in a Python loop (imagecorruptions for the ImageNet-C table at 224 px,
Hendrycks' make_cifar_c.py for the CIFAR-10-C table at 32 px), the median of --repeats passes
over a quarter of the batch (at least 8 images) after one warm-up image. Severity 3. Images are
scikit-image's photographs tiled to the batch (crosscheck/corruptions.py's `photographs`).

  PYTHONPATH=.:crosscheck python bench/corruption_speed.py --names=contrast,pixelate
"""
import os
import statistics
import time

from absl import app, flags
import numpy as np

from calib_jax import shift
from calib_jax.shift import core
from common import machine, median_seconds  # bench/ is the script's folder

import corruptions as crosscheck  # crosscheck/corruptions.py (PYTHONPATH=crosscheck): the reference

_BATCH32 = flags.DEFINE_integer("batch32", 256, "images per call at 32 px")
_BATCH224 = flags.DEFINE_integer("batch224", 16, "images per call at 224 px")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed calib_jax calls after the warm-up")
_NAMES = flags.DEFINE_list("names", [], "corruptions to time (default: all available)")
_SEVERITY = 3


def reference_rate(name, images, table, functions):
  if name in crosscheck.IMAGEMAGICK:  # the script's ImageMagick blur: time imagecorruptions' kernel
    table = "imagenet"
  try:
    crosscheck.reference(name, images[0], _SEVERITY, table, functions)  # warm-up (numba, imports)
  except Exception:  # pylint: disable=broad-except
    # Hendrycks' frost (relative texture paths) and fog (np.float_) fail today: time
    # imagecorruptions' function of the same corruption instead.
    table = "imagenet"
    crosscheck.reference(name, images[0], _SEVERITY, table, functions)
  seconds = []
  for _ in range(_REPEATS.value):  # the median of passes: the machine may be shared and loaded
    start = time.perf_counter()
    for image in images:
      crosscheck.reference(name, image, _SEVERITY, table, functions)
    seconds.append(time.perf_counter() - start)
  return len(images) / statistics.median(seconds)


def main(argv):
  del argv
  settings = (("cifar10", 32, _BATCH32.value), ("imagenet", 224, _BATCH224.value))
  names = _NAMES.value or shift.corruption_names()
  print(machine())
  print(f"load average (uptime): {os.getloadavg()}\n")
  print("| corruption | where | 32 px ours | 32 px ref | ratio | 224 px ours | 224 px ref | ratio "
        "| 1-min load |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name in names:
    cells = []
    for table, size, batch in settings:
      photos = crosscheck.photographs(size)
      images = np.concatenate([photos] * (batch // len(photos) + 1))[:batch]
      functions = crosscheck.script_functions(table) if table != "imagenet" else {}
      try:
        seconds = median_seconds(lambda: shift.corrupt(images, name, _SEVERITY, table=table),
                                 _REPEATS.value)
        ours = batch / seconds
        theirs = reference_rate(name, images[:max(8, batch // 4)], table, functions)
        cells += [f"{ours:,.0f}", f"{theirs:,.0f}", f"{ours / theirs:.1f}x"]
      except Exception as error:  # pylint: disable=broad-except
        cells += [f"failed: {type(error).__name__}", "", ""]
    where = "host" if name in core.HOST_CORRUPTIONS else "device"
    print(f"| {name} | {where} | " + " | ".join(cells) + f" | {os.getloadavg()[0]:.1f} |",
          flush=True)


if __name__ == "__main__":
  app.run(main)
