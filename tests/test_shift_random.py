"""calib_jax.shift.hashed_random: the counter-hash generator the noise corruptions draw from.

Statistical checks with fixed keys (deterministic: the same numbers on every run), with bounds at
many standard errors, so they fail on a broken generator (e.g. a repeated or unhashed counter),
not by chance.
"""
import jax
import numpy as np
import pytest

from calib_jax.shift import hashed_random

SHAPE = (4, 64, 64, 3)  # 49,152 values


def test_uniform_moments_and_histogram():
  values = np.asarray(hashed_random.uniform(jax.random.key(0), SHAPE), np.float64).ravel()
  assert 0.0 < values.min() and values.max() < 1.0
  standard_error = np.sqrt(1 / 12 / values.size)
  assert abs(values.mean() - 0.5) < 6 * standard_error
  assert abs(values.var() - 1 / 12) < 0.01 / 12 * 6
  counts = np.histogram(values, bins=64, range=(0, 1))[0]
  expected = values.size / 64
  chi_square = ((counts - expected) ** 2 / expected).sum()
  assert chi_square < 63 + 6 * np.sqrt(2 * 63)  # 63 degrees of freedom, mean 63, sd 11


def test_neighbouring_values_are_uncorrelated():
  values = np.asarray(hashed_random.uniform(jax.random.key(1), SHAPE), np.float64) - 0.5
  bound = 6 / np.sqrt(values[..., 1:].size)
  for axis in (1, 2, 3):  # rows, columns, channels: counters 192, 3 and 1 apart
    ahead = np.take(values, np.arange(1, values.shape[axis]), axis=axis)
    behind = np.take(values, np.arange(values.shape[axis] - 1), axis=axis)
    assert abs(np.corrcoef(ahead.ravel(), behind.ravel())[0, 1]) < bound
  # The images of a batch share counters but not seeds.
  assert abs(np.corrcoef(values[0].ravel(), values[1].ravel())[0, 1]) < 6 / np.sqrt(values[0].size)


def test_normal_moments_and_tails():
  values = np.asarray(hashed_random.normal(jax.random.key(2), SHAPE), np.float64).ravel()
  assert np.isfinite(values).all()
  assert abs(values.mean()) < 6 / np.sqrt(values.size)
  assert abs(values.std() - 1) < 0.02
  outside = np.mean(np.abs(values) > 1.959964)  # 5 % for N(0, 1)
  assert abs(outside - 0.05) < 6 * np.sqrt(0.05 * 0.95 / values.size)


def test_streams_follow_the_key():
  first = np.asarray(hashed_random.bits(jax.random.key(3), SHAPE))
  np.testing.assert_array_equal(first, np.asarray(hashed_random.bits(jax.random.key(3), SHAPE)))
  other = np.asarray(hashed_random.bits(jax.random.key(4), SHAPE))
  assert np.mean(first == other) < 0.001
  assert np.mean(first[0] == first[1]) < 0.001


def test_more_than_two_to_the_32_values_per_image_is_refused():
  with pytest.raises(ValueError, match="at most 2\\^32 values per image"):
    hashed_random.bits(jax.random.key(0), (1, 2 ** 17, 2 ** 16))


def test_erfinv_matches_lax_erf_inv():
  x = np.linspace(-0.999999, 0.999999, 20001, dtype=np.float32)
  np.testing.assert_allclose(np.asarray(hashed_random.erfinv(x)),
                             np.asarray(jax.lax.erf_inv(x)), rtol=2e-5, atol=2e-5)
