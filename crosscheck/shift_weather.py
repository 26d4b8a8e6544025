"""Cross-check of calib_jax.shift's motion, geometric and weather corruptions against the reference
`imagecorruptions` (the PyPI fork imagecorruptions-imaug 1.1.5; not a test: needs it, scikit-image,
scipy and OpenCV in the running environment).

Two comparisons, on scikit-image's photographs (astronaut, chelsea, coffee: centre-cropped square,
resized with PIL to --size):

* the corruption's deterministic part: the reference runs with a numpy seed, its random draws are
  replayed from the same seed (an angle, a noise layer, a displacement field) and fed to the JAX
  function's `*_at` form; both outputs go through the reference's `np.uint8(clip(.))` and the
  mean absolute difference in grey levels is printed (goal: < 1);
* the distribution of a random corruption: --draws draws per image from each side, the mean
  change `mean(out - in)` and the spread `std(out - in)` of each draw, averaged; the reference's
  standard error over draws is printed beside it.

With --table=cifar10 (use --size=32) the CIFAR-10-C entries are used; the reference's functions
for that table are Hendrycks' make_cifar_c.py, read from --cifar_source (a checkout of
hendrycks/robustness) and executed without their ImageMagick/torchvision imports; the two that
need ImageMagick (motion_blur, snow) are compared with imagecorruptions' own kernel instead.

--fixtures=DIR writes the small npz files tests/test_shift_weather.py reads.

  /work/venvs/shiftref/bin/python crosscheck/shift_weather.py --size=224 --draws=20
"""
import ast
import contextlib
import os
import types

from absl import app, flags
import cv2
import imagecorruptions
from imagecorruptions import corruptions as ref
import jax
import jax.numpy as jnp
import numba
import numpy as np
from PIL import Image
from scipy.ndimage import map_coordinates
from scipy.ndimage import zoom as scizoom
import skimage
import skimage.data
import skimage.filters

from calib_jax.shift import geometric, motion, weather

_SIZE = flags.DEFINE_integer("size", 224, "side of the square test images")
_DRAWS = flags.DEFINE_integer("draws", 20, "random draws per image and side")
_TABLE = flags.DEFINE_enum("table", "imagenet", ["imagenet", "cifar10", "tiny_imagenet"], "table")
_ONLY = flags.DEFINE_list("only", [], "corruption names to check (default: all of them)")
_FIXTURES = flags.DEFINE_string("fixtures", "", "directory to write the test fixtures into")
_CIFAR_SOURCE = flags.DEFINE_string(
    "cifar_source", "/work/.mirror/hendrycks+robustness/repo",
    "git directory or checkout of hendrycks/robustness (for the CIFAR-10-C / Tiny-ImageNet-C scripts)")

FROST_DIR = os.path.join(os.path.dirname(imagecorruptions.__file__), "frost")
SCRIPTS = {"cifar10": "make_cifar_c.py", "tiny_imagenet": "make_tinyimagenet_c.py"}
_SCRIPT_FUNCTIONS = {}


def _gaussian(image, sigma, multichannel=False, **kwargs):
  # The 2019 scripts call skimage's gaussian with `multichannel`, since renamed `channel_axis`.
  return skimage.filters.gaussian(image, sigma, channel_axis=-1 if multichannel else None, **kwargs)


def script_functions(table):
  """The corruption functions of Hendrycks' make_*_c.py for `table`, executed without the
  scripts' module-level code (dataset loading, ImageMagick)."""
  if table not in _SCRIPT_FUNCTIONS:
    source = _CIFAR_SOURCE.value
    relative = "ImageNet-C/create_c/" + SCRIPTS[table]
    if os.path.isdir(os.path.join(source, "objects")) or source.endswith("repo"):
      import subprocess  # only to read the script out of a bare mirror
      text = subprocess.run(["git", "--git-dir", source, "show", "HEAD:" + relative],
                            check=True, capture_output=True, text=True).stdout
    else:
      with open(os.path.join(source, relative)) as handle:
        text = handle.read()
    tree = ast.parse(text)
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    numpy_2019 = types.ModuleType("numpy")   # the scripts use np.float_, gone in numpy 2
    numpy_2019.__dict__.update(np.__dict__)
    numpy_2019.float_ = np.float64
    namespace = {"np": numpy_2019, "cv2": cv2, "gaussian": _gaussian, "scizoom": scizoom,
                 "map_coordinates": map_coordinates, "sk": skimage}
    exec(compile(tree, SCRIPTS[table], "exec"), namespace)
    _SCRIPT_FUNCTIONS[table] = namespace
  return _SCRIPT_FUNCTIONS[table]


@contextlib.contextmanager
def in_frost_dir():
  here = os.getcwd()
  os.chdir(FROST_DIR)
  try:
    yield
  finally:
    os.chdir(here)


def reference_any(name, image, severity, table, np_seed, **kwargs):
  if table == "imagenet":
    np.random.seed(np_seed)
    return np.uint8(imagecorruptions.corrupt(image, severity=severity, corruption_name=name,
                                             **kwargs))
  np.random.seed(np_seed)
  with in_frost_dir():
    return as_uint8(script_functions(table)[name](Image.fromarray(image), severity))


def photographs(size):
  out = []
  for name in ("astronaut", "chelsea", "coffee"):
    image = getattr(skimage.data, name)()
    side = min(image.shape[:2])
    top, left = (image.shape[0] - side) // 2, (image.shape[1] - side) // 2
    square = Image.fromarray(image[top:top + side, left:left + side])
    out.append(np.asarray(square.resize((size, size), Image.BILINEAR)))
  return np.stack(out)


def as_uint8(values):
  return np.uint8(np.clip(np.asarray(values, np.float64), 0, 255))


def grey_levels(ours, theirs):
  return float(np.mean(np.abs(as_uint8(ours).astype(int) - as_uint8(theirs).astype(int))))


def reference(name, image, severity, seed):
  np.random.seed(seed)
  return np.uint8(imagecorruptions.corrupt(image, severity=severity, corruption_name=name))


# --- deterministic parts: replay the reference's draws --------------------------------------

def motion_blur_exact(images, severity, table):
  params = motion.PARAMETERS[table]["motion_blur"][severity - 1]
  diffs = []
  for seed, image in enumerate(images):
    np.random.seed(seed)
    angle = np.random.uniform(-45, 45)
    if table == "imagenet":
      theirs = reference("motion_blur", image, severity, seed)
    else:  # make_cifar_c.py's ImageMagick blur, emulated by the reference package's kernel
      theirs = ref._motion_blur(np.array(image), radius=params[0], sigma=params[1], angle=angle)
    ours = motion.motion_blur_at(jnp.asarray(image[None], jnp.float32), params,
                                 jnp.asarray([angle], jnp.float32))[0]
    diffs.append((grey_levels(ours, theirs), {"angles": np.float32([angle])}, as_uint8(theirs)))
  return diffs


def snow_exact(images, severity, table):
  params = motion.PARAMETERS[table]["snow"][severity - 1]
  if table != "imagenet":
    return None
  diffs = []
  for seed, image in enumerate(images):
    height, width = image.shape[:2]
    np.random.seed(seed)
    noise = np.random.normal(size=(height, width), loc=params[0], scale=params[1])
    angle = np.random.uniform(-135, -45)
    crop_h, crop_w = motion.snow_noise_shape(height, width, params[2])
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    noise = noise[top:top + crop_h, left:left + crop_w]
    theirs = reference("snow", image, severity, seed)
    draws = {"noise": np.float32(noise[None]), "angles": np.float32([angle])}
    ours = motion.snow_at(jnp.asarray(image[None], jnp.float32), params,
                          *(jnp.asarray(v) for v in draws.values()))[0]
    diffs.append((grey_levels(ours, theirs), draws, as_uint8(theirs)))
  return diffs


def zoom_blur_exact(images, severity, table):
  params = geometric.PARAMETERS[table]["zoom_blur"][severity - 1]
  out = []
  for seed, image in enumerate(images):
    theirs = reference_any("zoom_blur", image, severity, table, seed)
    ours = geometric.zoom_blur(jnp.asarray(image[None], jnp.float32), params)[0]
    out.append((grey_levels(ours, theirs), {}, as_uint8(theirs)))
  return out


def elastic_transform_exact(images, severity, table):
  params = geometric.PARAMETERS[table]["elastic_transform"][severity - 1]
  out = []
  for seed, image in enumerate(images):
    height, width = image.shape[:2]
    np.random.seed(seed)
    draws = {}
    if table == "imagenet":
      bound = height * 0.005
      fields = [np.random.uniform(-bound, bound, (height, width)) / bound for _ in range(2)]
    else:
      bound = params.affine
      draws["moves"] = np.float32(np.random.uniform(-bound, bound, (1, 3, 2)) / bound)
      fields = [np.random.uniform(-1, 1, (height, width)) for _ in range(2)]
    draws["fields"] = np.float32(np.stack(fields)[None])
    theirs = reference_any("elastic_transform", image, severity, table, seed)
    ours = geometric.elastic_transform_at(jnp.asarray(image[None], jnp.float32), params,
                                          **{k: jnp.asarray(v) for k, v in draws.items()})[0]
    out.append((grey_levels(ours, theirs), draws, as_uint8(theirs)))
  return out


@numba.njit()
def _numba_offsets(count, delta, seed):
  # The draws of the reference's numba loop: same generator (numba's), same seed, same order.
  np.random.seed(seed)
  out = np.empty((count, 2), np.int64)
  for i in range(count):
    out[i] = np.random.randint(-delta, delta, size=(2,))
  return out


def glass_blur_exact(images, severity, table):
  params = geometric.PARAMETERS[table]["glass_blur"][severity - 1]
  out = []
  for seed, image in enumerate(images):
    height, width = image.shape[:2]
    count = geometric.glass_swap_sites(height, width, params[1], params[2]).shape[0]
    if table == "imagenet":
      offsets = _numba_offsets(count, params[1], seed)
      theirs = reference_any("glass_blur", image, severity, table, 0, seed=seed)
    else:  # the script draws with numpy's global generator, in the same order
      np.random.seed(seed)
      offsets = np.stack([np.random.randint(-params[1], params[1], size=(2,))
                          for _ in range(count)])
      theirs = reference_any("glass_blur", image, severity, table, seed)
    draws = {"offsets": np.int32(offsets[None])}
    ours = geometric.glass_blur_at(jnp.asarray(image[None], jnp.float32), params,
                                   jnp.asarray(draws["offsets"]))[0]
    out.append((grey_levels(ours, theirs), draws, as_uint8(theirs)))
  return out


def fog_exact(images, severity, table):
  params = weather.PARAMETERS[table]["fog"][severity - 1]
  out = []
  for seed, image in enumerate(images):
    size = weather.plasma_size(*image.shape[:2])
    np.random.seed(seed)
    draws, wibble = [], 100.0
    shapes = weather.plasma_draw_shapes(size)
    for index, shape in enumerate(shapes):   # three draws per step, then the decay
      draws.append(np.float32(np.random.uniform(-wibble, wibble, shape)[None] / wibble))
      if index % 3 == 2:
        wibble /= params[1]
    theirs = reference_any("fog", image, severity, table, seed)
    ours = weather.fog_at(jnp.asarray(image[None], jnp.float32), params,
                          [jnp.asarray(d) for d in draws])[0]
    out.append((grey_levels(ours, theirs), {f"draw{i:02d}": d for i, d in enumerate(draws)},
                as_uint8(theirs)))
  return out


def frost_exact(images, severity, table):
  params = weather.PARAMETERS[table]["frost"][severity - 1]
  out = []
  for seed, image in enumerate(images):
    height, width = image.shape[:2]
    _, sizes = weather.frost_textures(height, width, params.scale, params.textures)
    np.random.seed(seed)
    choice = np.random.randint(params.textures if table == "imagenet" else 5)
    corner = (np.random.randint(0, sizes[choice][0] - height),
              np.random.randint(0, sizes[choice][1] - width))
    theirs = reference_any("frost", image, severity, table, seed)
    draws = {"choice": np.int32([choice]), "corner": np.int32([corner])}
    ours = weather.frost_at(jnp.asarray(image[None], jnp.float32), params,
                            *(jnp.asarray(v) for v in draws.values()))[0]
    out.append((grey_levels(ours, theirs), draws, as_uint8(theirs)))
  return out


def spatter_exact(images, severity, table):
  params = weather.PARAMETERS[table]["spatter"][severity - 1]
  out = []
  for seed, image in enumerate(images):
    np.random.seed(seed)
    noise = np.random.normal(size=image.shape[:2], loc=params[0], scale=params[1])
    theirs = reference_any("spatter", image, severity, table, seed)
    draws = {"noise": np.float32(noise[None])}
    ours = weather.spatter_at(jnp.asarray(image[None], jnp.float32), params,
                              jnp.asarray(draws["noise"]))[0]
    out.append((grey_levels(ours, theirs), draws, as_uint8(theirs)))
  return out


EXACT = {"fog": fog_exact, "frost": frost_exact, "spatter": spatter_exact,
         "motion_blur": motion_blur_exact, "snow": snow_exact, "zoom_blur": zoom_blur_exact,
         "elastic_transform": elastic_transform_exact, "glass_blur": glass_blur_exact}
MODULES = {"fog": weather, "frost": weather, "spatter": weather, "motion_blur": motion, "snow": motion, "zoom_blur": geometric,
           "elastic_transform": geometric, "glass_blur": geometric}


# --- distributions ------------------------------------------------------------------------

def change_stats(outputs, image):
  change = as_uint8(outputs).astype(np.float64) - image.astype(np.float64)
  axes = tuple(range(1, change.ndim))
  return change.mean(axis=axes), change.std(axis=axes)


def reference_draws(name, image, severity, table, draws):
  if table != "imagenet" and name == "snow":
    return None  # the script's snow needs ImageMagick
  out = []
  for draw in range(draws):
    if table != "imagenet" and name == "motion_blur":  # ImageMagick's blur, emulated
      np.random.seed(1000 + draw)
      radius, sigma = motion.PARAMETERS[table][name][severity - 1]
      out.append(as_uint8(ref._motion_blur(np.array(image), radius, sigma,
                                           np.random.uniform(-45, 45))))
    else:
      # glass_blur's own generator takes a seed argument (not np.random's state).
      extra = {"seed": 5000 + draw} if name == "glass_blur" and table == "imagenet" else {}
      out.append(reference_any(name, image, severity, table, 1000 + draw, **extra))
  return np.stack(out)


def distribution(name, images, severity, table, draws):
  module = MODULES[name]
  params = module.PARAMETERS[table][name][severity - 1]
  fn = jax.jit(lambda x, key: module.CORRUPTIONS[name](x, params, key))
  rows = []
  for index, image in enumerate(images):
    batch = jnp.asarray(np.repeat(image[None], draws, axis=0), jnp.float32)
    ours = np.asarray(fn(batch, jax.random.key(index)))
    theirs = reference_draws(name, image, severity, table, draws)
    if theirs is None:
      return None
    rows.append((change_stats(ours, image), change_stats(theirs, image)))
  return rows


FIXTURE_SIZE, FIXTURE_DRAWS, FIXTURE_SEVERITIES = 32, 24, (2, 5)


def write_fixtures(directory, names):
  """Per corruption, `{name}.npz`: a 32 px photograph, and at severities 2 and 5 the replayed
  draws and the reference's uint8 output (deterministic part) and the reference's per-draw mean
  change and spread over 24 draws (distribution), all with the ImageNet-C table."""
  os.makedirs(directory, exist_ok=True)
  images = photographs(FIXTURE_SIZE)[:1]
  for name in names:
    arrays = {"images": images}
    for severity in FIXTURE_SEVERITIES:
      exact = EXACT[name](images, severity, "imagenet") if name in EXACT else None
      for index, (_, draws, theirs) in enumerate(exact or ()):
        for key, value in draws.items():
          arrays[f"s{severity}_i{index}_{key}"] = value
        arrays[f"s{severity}_i{index}_reference"] = theirs
    for severity in FIXTURE_SEVERITIES:
      theirs = reference_draws(name, images[0], severity, "imagenet", FIXTURE_DRAWS)
      mean, spread = change_stats(theirs, images[0])
      arrays[f"s{severity}_reference_mean"] = np.float32(mean)
      arrays[f"s{severity}_reference_spread"] = np.float32(spread)
    np.savez_compressed(os.path.join(directory, f"{name}.npz"), **arrays)
    print("wrote", name, os.path.getsize(os.path.join(directory, f"{name}.npz")), "bytes")


def main(argv):
  del argv
  if _FIXTURES.value:
    write_fixtures(_FIXTURES.value, _ONLY.value or list(MODULES))
    return
  images = photographs(_SIZE.value)
  table = _TABLE.value
  names = _ONLY.value or list(MODULES)
  print(f"table={table} size={_SIZE.value} draws={_DRAWS.value} images=astronaut,chelsea,coffee")
  print("name               sev  exact|diff|  mean change ours/ref (+-se)   spread ours/ref")
  for name in names:
    for severity in range(1, 6):
      exact = EXACT[name](images, severity, table) if name in EXACT else None
      exact_text = "      -    " if exact is None else f"{np.mean([e[0] for e in exact]):9.3f}  "
      rows = distribution(name, images, severity, table, _DRAWS.value)
      if rows is None:
        print(f"{name:18s} {severity:3d} {exact_text} (no reference for this table)")
        continue
      ours_mean = np.mean([r[0][0].mean() for r in rows])
      ref_mean = np.mean([r[1][0].mean() for r in rows])
      ref_se = np.sqrt(np.mean([r[1][0].var() for r in rows]) / _DRAWS.value)
      ours_std = np.mean([r[0][1].mean() for r in rows])
      ref_std = np.mean([r[1][1].mean() for r in rows])
      print(f"{name:18s} {severity:3d} {exact_text} {ours_mean:8.2f} / {ref_mean:8.2f} "
            f"(+-{ref_se:5.2f})   {ours_std:7.2f} / {ref_std:7.2f}")


if __name__ == "__main__":
  app.run(main)
