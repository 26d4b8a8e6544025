"""The command-line programs' persistent compilation cache: where it goes and its off switch
(`calib_jax/cli/compilation_cache.py`; the cache at work is checked by
tests/test_evaluation_predictions.py's eval.py run)."""
import os

import jax
import pytest

from calib_jax.cli import compilation_cache
from calib_jax.metrics import _ranking


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
  # tests/conftest.py points the programs at the test run's own temporary cache directory.
  path = compilation_cache.cache_dir()
  assert path == os.environ["CALIB_JAX_TESTS_JAX_CACHE"], path
  assert not path.startswith(compilation_cache.cache_dir({})), path


def test_a_cache_directory_given_to_jax_is_kept(tmp_path, monkeypatch):
  """`enable()` keeps a directory the user gave JAX (tests/conftest.py gives JAX the run's)."""
  monkeypatch.setitem(os.environ, compilation_cache.ENV, str(tmp_path / "ours"))
  monkeypatch.setenv(compilation_cache.PROGRAM_STORE_ENV, "")  # enable() sets it: restored
  assert not _ranking.xla_sorts_on_cpu(540)  # the default: host sorts, faster to compile
  assert compilation_cache.enable() == jax.config.jax_compilation_cache_dir
  assert not (tmp_path / "ours").exists()
  # With a cache, the rank metrics' short rows are sorted by XLA, so they are cached too
  # (tests/conftest.py switches this back after each test).
  assert _ranking.xla_sorts_on_cpu(540)
  assert compilation_cache.CACHEABLE_SORTS_ENV == _ranking.CACHEABLE_SORTS_ENV
