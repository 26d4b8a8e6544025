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

from calib_jax.shift import geometric, motion

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "shift_weather")
MODULES = (motion, geometric)
NAMES = {name: module for module in MODULES for name in module.CORRUPTIONS}
TABLES = ("imagenet", "cifar10", "tiny_imagenet")
DETERMINISTIC = {"zoom_blur"}


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
def test_every_severity_traces_with_its_shape(name):
  # Tracing (no compilation) proves every table entry is jit-able and keeps the shape.
  module = NAMES[name]
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  for table in TABLES:
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


@pytest.mark.parametrize("name", sorted(NAMES))
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
