"""calib_jax.shift's motion, geometric and weather corruptions (motion.py, geometric.py,
weather.py) through their `CORRUPTIONS` / `PARAMETERS` registries: shapes under jit at every
severity, per-image randomness, and agreement with the reference `imagecorruptions` from fixtures
that crosscheck/shift_weather.py wrote (the reference itself is not needed here).

* deterministic part: the reference's own random draws (replayed from its numpy seed) are fed to
  the `*_at` form; the uint8 result must be within one grey level of the reference's on average
  (severities 2 and 5; every severity of every table is traced for its shape);
* distribution: 24 draws on one image at severities 2 and 5 against the reference's 24. The mean
  change `mean(out - in)` and the spread `std(out - in)` of a draw are averaged over draws, and
  the two averages must agree within 4 standard errors of their difference (a two-sample z-test
  that a correct implementation fails with probability ~6e-5), plus half a grey level for the
  uint8 rounding of either side.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.shift import geometric, motion, weather

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "shift_weather")
MODULES = (motion, geometric, weather)
NAMES = {name: module for module in MODULES for name in module.CORRUPTIONS}
TABLES = ("imagenet", "cifar10", "tiny_imagenet")
DETERMINISTIC = {"zoom_blur"}
# frost's textures come from the reference package, absent here: its tests use synthetic ones,
# and its agreement with the reference is measured by crosscheck/shift_weather.py.
FIXTURED = sorted(set(NAMES) - {"frost"})


@pytest.fixture
def synthetic_frost(tmp_path, monkeypatch):
  """Six random textures under the reference's file names (200 x 180, enough for 32 px images
  at every table's scale), in place of the installed package's."""
  from PIL import Image
  rng = np.random.default_rng(0)
  for name in weather.FROST_FILES:
    Image.fromarray(rng.integers(0, 256, (180, 200, 3), dtype=np.uint8)).save(tmp_path / name)
  monkeypatch.setattr(weather, "_frost_directory", lambda: str(tmp_path))
  weather.frost_textures.cache_clear()
  yield tmp_path
  weather.frost_textures.cache_clear()


def _fixture(name):
  return np.load(os.path.join(FIXTURES, f"{name}.npz"))


def _uint8(values):
  return np.asarray(jnp.clip(values, 0, 255)).astype(np.uint8)


def test_tables_complete():
  for module in MODULES:
    assert set(module.PARAMETERS) == set(TABLES)
    for table in TABLES:
      assert set(module.PARAMETERS[table]) == set(module.CORRUPTIONS)
      assert all(len(entries) == 5 for entries in module.PARAMETERS[table].values())


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_severity_traces_with_its_shape(name, synthetic_frost):
  # Tracing (no compilation) proves every table entry is jit-able and keeps the shape.
  module = NAMES[name]
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  tables = ("imagenet", "cifar10") if name == "frost" else TABLES  # Tiny's crop is 64 px
  for table in tables:
    for params in module.PARAMETERS[table][name]:
      out = jax.eval_shape(lambda x, key: module.CORRUPTIONS[name](x, params, key),
                           images, jax.random.key(0))
      assert out.shape == images.shape and out.dtype == jnp.float32


EXACT = {
    "motion_blur": lambda x, params, d: motion.motion_blur_at(x, params, d["angles"]),
    "snow": lambda x, params, d: motion.snow_at(x, params, d["noise"], d["angles"]),
    "zoom_blur": lambda x, params, d: geometric.zoom_blur(x, params),
    "elastic_transform": lambda x, params, d: geometric.elastic_transform_at(x, params, **d),
    "glass_blur": lambda x, params, d: geometric.glass_blur_at(x, params, d["offsets"]),
    "fog": lambda x, params, d: weather.fog_at(x, params, [d[k] for k in sorted(d)]),
    "spatter": lambda x, params, d: weather.spatter_at(x, params, d["noise"]),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_deterministic_part_matches_reference(name):
  data = _fixture(name)
  image = jnp.asarray(data["images"][:1], jnp.float32)
  for severity in (2, 5):
    params = NAMES[name].PARAMETERS["imagenet"][name][severity - 1]
    prefix = f"s{severity}_i0_"
    draws = {key[len(prefix):]: jnp.asarray(data[key]) for key in data.files
             if key.startswith(prefix) and not key.endswith("reference")}
    ours = _uint8(jax.jit(EXACT[name], static_argnums=1)(image, params, draws)[0]).astype(int)
    theirs = data[prefix + "reference"].astype(int)
    assert np.mean(np.abs(ours - theirs)) < 1.0, (name, severity)


def _agree(ours, theirs):
  tolerance = 4 * np.sqrt(ours.var(ddof=1) / ours.size + theirs.var(ddof=1) / theirs.size) + 0.5
  return abs(ours.mean() - theirs.mean()) <= tolerance, (ours.mean(), theirs.mean(), tolerance)


@pytest.mark.parametrize("name", FIXTURED)
def test_distribution_matches_reference(name):
  data = _fixture(name)
  module = NAMES[name]
  image = data["images"][0]
  for severity in (2, 5):
    params = module.PARAMETERS["imagenet"][name][severity - 1]
    mean_ref = data[f"s{severity}_reference_mean"]
    batch = jnp.asarray(np.repeat(image[None], mean_ref.size, axis=0), jnp.float32)
    corrupt = jax.jit(module.CORRUPTIONS[name], static_argnums=1)
    out = corrupt(batch, params, jax.random.key(severity))
    # A fixed key gives the same draws; another key and each image of the batch, new ones.
    np.testing.assert_array_equal(np.asarray(out), np.asarray(corrupt(batch, params,
                                                                      jax.random.key(severity))))
    other = corrupt(batch, params, jax.random.key(9))
    if name in DETERMINISTIC:
      np.testing.assert_array_equal(np.asarray(out), np.asarray(other))
      np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(out[-1]))
    else:
      assert float(jnp.abs(out - other).max()) > 0
      assert all(float(jnp.abs(out[0] - out[i]).max()) > 0 for i in range(1, out.shape[0]))
    out = _uint8(out)
    change = out.astype(np.float64) - image.astype(np.float64)
    ok, detail = _agree(change.mean(axis=(1, 2, 3)), mean_ref)
    assert ok, ("mean change", name, severity, detail)
    ok, detail = _agree(change.std(axis=(1, 2, 3)), data[f"s{severity}_reference_spread"])
    assert ok, ("spread", name, severity, detail)


def test_frost_without_the_reference_package_names_the_extra(monkeypatch):
  monkeypatch.setattr(weather.importlib.util, "find_spec", lambda name: None)
  weather.frost_textures.cache_clear()
  images = jnp.zeros((1, 32, 32, 3), jnp.float32)
  with pytest.raises(ValueError, match="pip install imagecorruptions-imaug") as error:
    weather.frost(images, weather.PARAMETERS["imagenet"]["frost"][0], jax.random.key(0))
  assert "\n" not in str(error.value)


def test_frost_blends_a_random_crop_of_a_texture(synthetic_frost):
  params = weather.PARAMETERS["imagenet"]["frost"][4]
  images = jnp.full((6, 32, 32, 3), 100.0, jnp.float32)
  out = np.asarray(jax.jit(weather.frost, static_argnums=1)(images, params, jax.random.key(1)))
  stack, sizes = weather.frost_textures(32, 32, None, 6)
  # 180 x 200 textures enlarged 1.1 times, the size rounded up as the reference does
  # (ceil(180 * 1.1) = 199 in floating point).
  np.testing.assert_array_equal(sizes, [[199, 221]] * 6)
  for picture in out:
    layer = (picture - params.image_weight * 100.0) / params.frost_weight
    np.testing.assert_allclose(layer, np.round(layer), atol=1e-3)
    # The crop is found somewhere inside one of the textures (a corner drawn from the range).
    crop = np.round(layer).astype(np.uint8)
    found = False
    for t in range(6):
      room = stack[t, :sizes[t][0] - 32, :sizes[t][1] - 32]
      for r, c in np.argwhere(np.all(room == crop[0, 0], axis=-1)):
        found = found or np.array_equal(stack[t, r:r + 32, c:c + 32], crop)
    assert found
  assert len({picture.tobytes() for picture in out}) == 6


def test_through_corrupt():
  # One name of each module (compiling is the cost), through the public entry point: uint8 in
  # and out, the clipped and truncated float result of the module's function with the same key.
  from calib_jax import shift
  image = _fixture("motion_blur")["images"][:1]
  for name in ("motion_blur", "zoom_blur", "fog"):
    if name not in shift.corruption_names():
      continue  # registered by calib_jax.shift's core
    key = jax.random.key(5)
    out = shift.corrupt(jnp.asarray(image), name, 1, key=key)
    assert out.dtype == jnp.uint8 and out.shape == image.shape
    direct = jax.jit(NAMES[name].CORRUPTIONS[name], static_argnums=1)(
        jnp.asarray(image, jnp.float32), NAMES[name].PARAMETERS["imagenet"][name][0], key)
    assert np.mean(np.abs(np.asarray(out, int) - _uint8(direct).astype(int))) < 1.0, name
