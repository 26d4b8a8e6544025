"""calib_jax.shift: corrupt() (noise, blur, digital families and the shared core) and rotate().

Reference agreement without the reference installed: tests/fixtures/shift/deterministic_*.npz hold
one 32x32 photograph crop and `imagecorruptions` / Hendrycks' make_cifar_c.py outputs of the
deterministic corruptions, written by crosscheck/corruptions.py. The random ones are checked
against their closed-form moments on a flat grey image.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import shift
from calib_jax.shift import blur, core, digital, geometric, noise

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "shift")
FAMILIES = (noise, blur, digital)
MINE = {name: family for family in FAMILIES for name in family.CORRUPTIONS}
REFERENCE_ORDER = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
    "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform",
    "pixelate", "jpeg_compression", "speckle_noise", "gaussian_blur", "spatter", "saturate")
GREY = np.full((1, 32, 32, 3), 128, np.uint8)


def _image(batch=2, channels=3, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (batch, 32, 32, channels), dtype=np.uint8)


def test_names_follow_the_reference_order():
  assert shift.BENCHMARK_CORRUPTIONS + shift.VALIDATION_CORRUPTIONS == REFERENCE_ORDER
  names = shift.corruption_names()
  assert names == [name for name in REFERENCE_ORDER if name in names]
  assert set(MINE) <= set(names)
  assert shift.table_names() == ["imagenet", "cifar10", "tiny_imagenet"]
  assert shift.ROTATION_ANGLES == tuple(range(0, 181, 15))


def test_tables_complete():
  for family in FAMILIES:
    for table in shift.table_names():
      assert set(family.PARAMETERS[table]) == set(family.CORRUPTIONS)
      assert all(len(entries) == 5 for entries in family.PARAMETERS[table].values())


@pytest.mark.parametrize("name", sorted(MINE))
def test_every_severity_and_table_traces_with_its_shape(name):
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  for table in shift.table_names():
    for params in MINE[name].PARAMETERS[table][name]:
      out = jax.eval_shape(lambda x, key: MINE[name].CORRUPTIONS[name](x, params, key),
                           images, jax.random.key(0))
      assert out.shape == images.shape and out.dtype == jnp.float32


@pytest.mark.parametrize("name", sorted(MINE))
def test_corrupt_runs_under_jit(name):
  images = _image()
  out = shift.corrupt(images, name, 3)
  assert out.shape == images.shape and out.dtype == jnp.uint8
  assert np.any(np.asarray(out) != images)  # severity 3 changes a random image


@pytest.mark.parametrize("table", ["imagenet", "cifar10"])
def test_deterministic_corruptions_equal_the_reference(table):
  fixture = np.load(os.path.join(FIXTURES, f"deterministic_{table}.npz"))
  image = fixture["image"][None].astype(np.float32)
  entries = [entry for entry in fixture.files if entry != "image"]

  # Every entry of the table in one jitted program: op by op, each entry compiled each of its
  # primitives at its parameters' shapes (~0.6 s an entry), and one program per entry more.
  @jax.jit
  def corrupted(image):
    out = {}
    for entry in entries:
      name, severity = entry.rsplit("_", 1)
      params = core.PARAMETERS[table][name][int(severity) - 1]
      out[entry] = jnp.clip(core.CORRUPTIONS[name](image, params, None), 0, 255)
    return out

  checked = 0
  for entry, ours in corrupted(image).items():
    ours = np.asarray(ours).astype(np.uint8)[0]
    difference = np.abs(ours.astype(np.float64) - fixture[entry]).mean()
    assert difference <= 1.0, (entry, difference)
    checked += 1
  assert checked >= 10


def _moments(name, severity, table="imagenet"):
  out = np.asarray(shift.corrupt(GREY, name, severity, table=table)).astype(np.float64)
  change = out - GREY
  return change.mean(), change.std(), change


def test_gaussian_and_speckle_noise_moments():
  # At u = 128/255 and small c no value is clipped: the change is N(0, (255 c)^2) for Gaussian
  # noise and N(0, (255 u c)^2) for speckle, less ~0.5 from truncating to uint8.
  unit = 128 / 255
  for name, severity, expected in (("gaussian_noise", 1, 255 * 0.08),
                                   ("speckle_noise", 2, 255 * unit * 0.2)):
    mean, spread, _ = _moments(name, severity)
    assert abs(mean + 0.5) < 4 * expected / np.sqrt(GREY.size), (name, mean)
    assert abs(spread / expected - 1) < 0.06, (name, spread, expected)


def test_shot_noise_moments():
  # Poisson(c u) / c has mean u and variance u / c (c = 60 photons at severity 1).
  mean, spread, _ = _moments("shot_noise", 1)
  expected = 255 * np.sqrt(128 / 255 / 60)
  assert abs(mean + 0.5) < 4 * expected / np.sqrt(GREY.size)
  assert abs(spread / expected - 1) < 0.06


def test_impulse_noise_is_salt_and_pepper():
  _, _, change = _moments("impulse_noise", 5)  # amount 0.27
  flipped = change != 0
  assert set(np.unique(change[flipped])) <= {-128.0, 127.0}
  assert abs(flipped.mean() - 0.27) < 4 * np.sqrt(0.27 * 0.73 / GREY.size)
  assert abs((change == 127).mean() - 0.135) < 4 * np.sqrt(0.135 * 0.865 / GREY.size)


def test_bad_inputs_raise_one_line_errors():
  images = _image(batch=1)
  cases = [
      (dict(images=images, corruption="fuzz", severity=1), "gaussian_noise"),
      (dict(images=images, corruption="contrast", severity=0), "1..5"),
      (dict(images=images, corruption="contrast", severity=6), "1..5"),
      (dict(images=images, corruption="contrast", severity=2.0), "1..5"),
      (dict(images=images.astype(np.float32), corruption="contrast", severity=1), "uint8"),
      (dict(images=images[..., :2], corruption="contrast", severity=1), "3 or 1"),
      (dict(images=images[0, 0], corruption="contrast", severity=1), "3 or 1"),
      (dict(images=images, corruption="contrast", severity=1, table="mnist"), "cifar10"),
  ]
  for kwargs, expected in cases:
    with pytest.raises(ValueError) as error:
      shift.corrupt(kwargs.pop("images"), kwargs.pop("corruption"), kwargs.pop("severity"),
                    **kwargs)
    message = str(error.value)
    assert expected in message and "\n" not in message


def test_grey_images_go_through_as_three_equal_channels_and_keep_the_first():
  grey = _image(batch=2, channels=1)[:, None]  # two leading dims: [2, 1, 32, 32, 1]
  out = np.asarray(shift.corrupt(grey, "contrast", 4))
  assert out.shape == grey.shape and out.dtype == np.uint8
  rgb = np.asarray(shift.corrupt(np.repeat(grey[:, 0], 3, axis=-1), "contrast", 4))
  np.testing.assert_array_equal(out[:, 0, ..., 0], rgb[..., 0])
  np.testing.assert_array_equal(rgb[..., 0], rgb[..., 2])
  # Noise keeps one channel's law: a mean of three channels would shrink its spread by sqrt(3).
  grey_noise = np.asarray(shift.corrupt(GREY[..., :1], "gaussian_noise", 1)).astype(float) - 128
  assert abs(grey_noise.std() / (255 * 0.08) - 1) < 0.1


def test_random_corruptions_are_reproducible_and_per_image():
  images = np.repeat(_image(batch=1), 2, axis=0)
  first = np.asarray(shift.corrupt(images, "gaussian_noise", 2))
  np.testing.assert_array_equal(
      first, np.asarray(shift.corrupt(images, "gaussian_noise", 2,
                                      key=jax.random.key(core.DEFAULT_SEED))))
  other = np.asarray(shift.corrupt(images, "gaussian_noise", 2, key=jax.random.key(1)))
  assert np.any(first != other)
  assert np.any(first[0] != first[1])  # one independent draw per image


def test_jpeg_compression_runs_inside_a_users_jit():
  images = _image(batch=1)
  inside = jax.jit(lambda x: shift.corrupt(x, "jpeg_compression", 1).astype(jnp.int32) + 1)
  np.testing.assert_array_equal(np.asarray(inside(images)) - 1,
                                np.asarray(shift.corrupt(images, "jpeg_compression", 1)))


def test_rotate_zero_is_identity_and_ninety_is_rot90():
  images = _image(batch=3, channels=1)[:, :28, :28]
  np.testing.assert_array_equal(np.asarray(shift.rotate(images, 0)), images)
  turned = np.asarray(jax.jit(shift.rotate)(images, 90.0))
  assert turned.dtype == np.uint8
  np.testing.assert_array_equal(turned, np.rot90(images, axes=(1, 2)))
  half = np.asarray(shift.rotate(images, 180))
  np.testing.assert_array_equal(half, images[:, ::-1, ::-1])


def test_rotate_zero_fills_the_corners():
  ones = np.ones((1, 28, 28, 1), np.float32)
  turned = np.asarray(shift.rotate(ones, 45))
  assert turned[0, 0, 0, 0] == 0 and turned[0, 14, 14, 0] == pytest.approx(1.0)


@pytest.mark.parametrize("delta,iterations", [(1, 2), (2, 1), (3, 2)])
def test_glass_blurs_resolved_copies_equal_the_references_sequential_copies(delta, iterations):
  # The reference visits rows and columns in decreasing order and copies pixel (h + dy, w + dx)
  # into (h, w), one after another: `glass_sources` resolves the chains by pointer doubling.
  height, width, batch = 9, 11, 3
  sites = geometric.glass_swap_sites(height, width, delta, iterations)
  rng = np.random.default_rng(delta)
  offsets = rng.integers(-delta, delta, (batch, sites.shape[0], 2))
  partners = sites[None, :] + offsets[..., 1] * width + offsets[..., 0]
  expected = np.tile(np.arange(height * width), (batch, 1))
  for b in range(batch):
    for t, site in enumerate(sites):
      expected[b, site] = expected[b, partners[b, t]]
  sources = jax.jit(geometric.glass_sources, static_argnums=(0, 1, 2, 3))(
      height, width, delta, iterations, jnp.asarray(offsets, jnp.int32))
  np.testing.assert_array_equal(np.asarray(sources), expected)
