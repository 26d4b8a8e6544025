"""The command-line programs' persistent compilation cache: where it goes and its off switch
(`calib_jax/cli/compilation_cache.py`; the cache at work is checked by
tests/test_evaluation_predictions.py's eval.py run)."""
import os

import pytest

from calib_jax.cli import compilation_cache


def test_the_cache_lives_under_the_users_cache_directory():
  home = os.path.expanduser("~")
  assert compilation_cache.cache_dir({}) == os.path.join(home, ".cache", "calib_jax", "jax")
  assert compilation_cache.cache_dir({"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/calib_jax/jax"


def test_the_environment_names_another_directory(tmp_path):
  env = {compilation_cache.ENV: str(tmp_path / "c"), "XDG_CACHE_HOME": "/x/cache"}
  assert compilation_cache.cache_dir(env) == str(tmp_path / "c")


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "no", "none"])
def test_the_off_switch(value):
  assert compilation_cache.cache_dir({compilation_cache.ENV: value}) is None


def test_the_tests_never_write_to_the_users_cache():
  assert compilation_cache.cache_dir() is None  # tests/conftest.py switches it off
