"""Test-wide settings.

Eight fake CPU devices let the data-parallel tests run on a laptop or CI; it must be set before
JAX is first imported, hence here. Tests never touch the network
(tests/test_data_download.py stands in for downloads).
"""
import logging
import os

import pytest

# Eight fake devices are eight threads on (in CI) two cores: under load a collective's threads
# can reach it more than XLA's default 40 s apart, which aborts the whole process ("7 of 8
# device threads reached a collective ..."); the tests wait up to 10 min instead.
#
# XLA's backend optimisation level 0: the tests' programs are small and run a few steps, so
# compiling them is most of their time, and level 0 takes ~13 % less CPU (paired runs of the
# evaluation tests); it changes how fast the code runs, not what it computes. (The tests that
# start train.py with their own flags, the SIGTERM and multi-process ones, compile at the
# default level.)
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_cpu_collective_call_terminate_timeout_seconds=600 "
                      "--xla_backend_optimization_level=0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
# The programs' persistent JAX compilation cache (calib_jax/cli/compilation_cache.py) stays off:
# tests never write to the user's cache directory (a test that wants one names a tmp dir).
os.environ["CALIB_JAX_COMPILATION_CACHE"] = "off"

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True)
def _absl_log_stream():
  """Programs run in-process (train.py's `main`, the demo) send absl's log to their work
  directory's log.txt; the tests after them get the stream they had back."""
  from absl import logging as absl_logging
  handler = absl_logging.get_absl_handler().python_handler
  stream = handler.stream
  yield
  if handler.stream is not stream:
    handler.setStream(stream).close()
    logging.captureWarnings(False)


# Scheduling over `pytest -n 2` (the Makefile adds `--dist worksteal`: a worker that runs out of
# tests takes half of the other's queue): these modules hold the longest tests (end-to-end
# training and evaluation, programs in their own processes, the docs' blocks), so they start
# first, each module's tests kept together in their order (their module fixtures are built
# once); the quick tests come last, where stealing evens the two workers out instead of one
# long test keeping one worker busy while the other waits. Longest first.
SLOW_MODULES = ("test_run_multihost", "test_cli_installed", "test_docs", "test_cli_console",
                "test_run_faults", "test_demo", "test_evaluation_maps", "test_evaluation_run",
                "test_evaluation_predictions", "test_evaluation_toolkit", "test_sweep",
                "test_cli_train", "test_models_torch_weights")


def pytest_collection_modifyitems(items):
  def rank(item):
    name = item.path.stem
    return SLOW_MODULES.index(name) if name in SLOW_MODULES else len(SLOW_MODULES)
  items.sort(key=rank)  # stable: collection order within a module and among the rest
