"""Cross-check of every corruption of calib_jax.shift against the reference `imagecorruptions`
(PyPI fork imagecorruptions-imaug 1.1.5) and Hendrycks' make_cifar_c.py / make_tinyimagenet_c.py.
Not a test: needs the reference, scikit-image, OpenCV (run it in a venv that has them).

On scikit-image's photographs (astronaut, chelsea, coffee; centre-cropped square, resized with
Pillow's BICUBIC to --size), for each corruption and severity:

* deterministic corruptions: mean |calib_jax - reference| in grey levels over all pixels (goal <= 1);
* random ones: the mean change mean(out - in) and the spread std(out - in) of one draw, averaged
  over --draws draws per image, for both sides, the change ± its standard error over the images x
  draws (the two should agree within about two standard errors).

--table=imagenet uses imagecorruptions' functions; cifar10 / tiny_imagenet use the functions of
Hendrycks' scripts, read from a checkout (or bare mirror) of hendrycks/robustness. Prints a markdown
table. --fixtures=DIR writes tests/fixtures/shift/*.npz (one 32x32 crop, the reference's outputs of
the deterministic corruptions) for tests/test_shift.py.

  python crosscheck/corruptions.py --size=224 --table=imagenet
  python crosscheck/corruptions.py --size=32 --table=cifar10
"""
import ast
import io
import os
import subprocess

from absl import app, flags
import cv2
import imagecorruptions
import jax
import numpy as np
from PIL import Image
from scipy.ndimage import map_coordinates
from scipy.ndimage import zoom as scizoom
import skimage
import skimage.data
import skimage.filters

from calib_jax import shift
from calib_jax.shift import core

_SIZE = flags.DEFINE_integer("size", 224, "side of the square test images")
_TABLE = flags.DEFINE_enum("table", "imagenet", list(core.TABLES), "parameter table")
_DRAWS = flags.DEFINE_integer("draws", 4, "draws per image and side for random corruptions")
_ONLY = flags.DEFINE_list("only", [], "corruption names (default: all available)")
_SOURCE = flags.DEFINE_string("source", "/work/.mirror/hendrycks+robustness/repo",
                              "checkout or bare git mirror of hendrycks/robustness")
_FIXTURES = flags.DEFINE_string("fixtures", "", "write the test fixtures into this directory")

DETERMINISTIC = ("defocus_blur", "zoom_blur", "brightness", "contrast", "pixelate",
                 "jpeg_compression", "gaussian_blur", "saturate")
SCRIPTS = {"cifar10": "make_cifar_c.py", "tiny_imagenet": "make_tinyimagenet_c.py"}
# Hendrycks' scripts blur these with ImageMagick (Wand); crosscheck/shift_weather.py compares them
# with the reference package's kernel instead.
IMAGEMAGICK = ("motion_blur", "snow")


def photographs(size):
  images = []
  for name in ("astronaut", "chelsea", "coffee"):
    image = getattr(skimage.data, name)()
    side = min(image.shape[:2])
    top, left = (image.shape[0] - side) // 2, (image.shape[1] - side) // 2
    crop = Image.fromarray(image[top:top + side, left:left + side])
    images.append(np.asarray(crop.resize((size, size), Image.BICUBIC)))
  return np.stack(images)


def _gaussian(image, sigma, multichannel=False, **kwargs):
  # The 2019 scripts pass `multichannel`, since renamed `channel_axis`.
  return skimage.filters.gaussian(image, sigma=sigma, channel_axis=-1 if multichannel else None,
                                  **kwargs)


def script_functions(table):
  """The corruption functions of Hendrycks' script for `table`, without its module-level code."""
  relative = "ImageNet-C/create_c/" + SCRIPTS[table]
  if os.path.isdir(os.path.join(_SOURCE.value, relative.split("/")[0])):
    with open(os.path.join(_SOURCE.value, relative)) as handle:
      text = handle.read()
  else:
    text = subprocess.run(["git", "--git-dir", _SOURCE.value, "show", "HEAD:" + relative],
                          check=True, capture_output=True, text=True).stdout
  tree = ast.parse(text)
  tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
  namespace = {"np": np, "cv2": cv2, "sk": skimage, "gaussian": _gaussian, "PILImage": Image,
               "BytesIO": io.BytesIO, "scizoom": scizoom, "map_coordinates": map_coordinates}
  exec(compile(tree, SCRIPTS[table], "exec"), namespace)  # pylint: disable=exec-used
  return namespace


def reference(name, image, severity, table, functions):
  if table == "imagenet":
    return imagecorruptions.corrupt(image, severity=severity, corruption_name=name)
  out = functions[name](Image.fromarray(image), severity)
  return np.uint8(np.clip(np.asarray(out, np.float64), 0, 255))


def change_and_spread(outputs, images):
  """Mean change, its standard error over the images x draws, and the mean spread."""
  difference = outputs.astype(np.float64) - images.astype(np.float64)
  axes = tuple(range(1, difference.ndim))
  changes = difference.mean(axis=axes)
  error = changes.std(ddof=1) / np.sqrt(len(changes))
  return changes.mean(), error, difference.std(axis=axes).mean()


def main(argv):
  del argv
  table, size = _TABLE.value, _SIZE.value
  images = photographs(size)
  functions = script_functions(table) if table != "imagenet" else {}
  names = _ONLY.value or shift.corruption_names()
  print(f"table={table}, {len(images)} photographs at {size}x{size}, draws={_DRAWS.value}\n")
  print("| corruption | severity | kind | mean abs diff | change ours / ref | "
        "spread ours / ref |")
  print("|---|---|---|---|---|---|")
  for name in names:
    if table != "imagenet" and name not in functions:
      print(f"| {name} | - | no reference function in {SCRIPTS[table]} | | | |")
      continue
    if table != "imagenet" and name in IMAGEMAGICK:
      print(f"| {name} | - | ImageMagick in {SCRIPTS[table]}: see crosscheck/shift_weather.py "
            "| | | |")
      continue
    for severity in range(1, 6):
      try:
        if name in DETERMINISTIC:
          ours = np.asarray(shift.corrupt(images, name, severity, table=table))
          theirs = np.stack([reference(name, image, severity, table, functions)
                             for image in images])
          diff = np.abs(ours.astype(np.float64) - theirs).mean()
          print(f"| {name} | {severity} | deterministic | {diff:.3f} | | |", flush=True)
          continue
        ours = np.concatenate([np.asarray(shift.corrupt(images, name, severity, table=table,
                                                        key=jax.random.key(draw)))
                               for draw in range(_DRAWS.value)])
        np.random.seed(0)
        theirs = np.stack([reference(name, image, severity, table, functions)
                           for _ in range(_DRAWS.value) for image in images])
        inputs = np.concatenate([images] * _DRAWS.value)
        change_ours, error_ours, spread_ours = change_and_spread(ours, inputs)
        change_ref, error_ref, spread_ref = change_and_spread(theirs, inputs)
        print(f"| {name} | {severity} | random | | {change_ours:.2f} ± {error_ours:.2f} / "
              f"{change_ref:.2f} ± {error_ref:.2f} | {spread_ours:.2f} / {spread_ref:.2f} |",
              flush=True)
      except Exception as error:  # pylint: disable=broad-except
        print(f"| {name} | {severity} | failed: {type(error).__name__}: "
              f"{str(error).splitlines()[0][:80]} | | | |", flush=True)
  if _FIXTURES.value:
    write_fixtures(_FIXTURES.value)


def write_fixtures(directory):
  """One 32x32 crop of `coffee` and the reference's outputs of the deterministic corruptions."""
  os.makedirs(directory, exist_ok=True)
  crop = np.ascontiguousarray(skimage.data.coffee()[100:132, 180:212])
  for table, severities in (("imagenet", (2, 5)), ("cifar10", (2, 5))):
    functions = script_functions(table) if table != "imagenet" else {}
    outputs = {}
    for name in DETERMINISTIC:
      if name not in core.CORRUPTIONS or name == "zoom_blur":
        continue
      for severity in severities:
        outputs[f"{name}_{severity}"] = reference(name, crop, severity, table, functions)
    np.savez_compressed(os.path.join(directory, f"deterministic_{table}.npz"), image=crop,
                        **outputs)


if __name__ == "__main__":
  app.run(main)
