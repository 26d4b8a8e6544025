"""Test-wide settings.

Four fake CPU devices let the data-parallel tests run on a laptop or CI; it must be set before
JAX is first imported, hence here. Tests never touch the network
(tests/test_data_download.py stands in for downloads).
"""
import contextlib
import gc
import importlib.util
import logging
import os
import shutil
import tempfile

import pytest

# Four fake CPU devices test data parallelism, and 2-D (member x data) meshes of 2 x 2. Eight
# took 13-34 % more CPU time in the training tests (paired runs of test_sweep, test_run_loop and
# test_cli_train on a loaded machine, 2026-11-27; the whole suite on the idle one gained less):
# every sharded step's collectives are one thread per device, on (in CI) two cores. Under load a
# collective's threads can reach it more than XLA's default 40 s apart, which aborts the whole
# process ("3 of 4 device threads reached a collective ..."); the tests wait up to 10 min instead.
#
# The tests' programs are small and run a few steps, so compiling them is most of their time.
# XLA's backend optimisation level 0 takes ~13 % less CPU (paired runs of the evaluation tests);
# it changes how fast the code runs, not what it computes. `CALIB_JAX_TESTS_COMPILER=fast` (what
# `make test` sets for its first pass) also turns XLA:CPU's fusion emitters off: 44 % less CPU
# with the other flags below the same (158 CPU-s against 280 for the prediction-report,
# bootstrap, loss and calibrator tests, 2026-11-28). Those emit other, equally exact
# arithmetic. Some tests assert that two *different* programs of one computation give the same
# bits (a k-step scan against k calls, the on-device data against tf.data, a sweep member
# against its single run, the prediction report's numbers against their interval metrics');
# the fast emitters give that too as long as each program is one LLVM module (below): with the
# programs split over threads, 11 such tests differed, with one module none (2026-11-28). The
# three whose bits the fast emitters still change (the sorted-order conformal scores, the two
# rank paths' tie groups) are marked `exact_across_programs` and run with the default emitters
# (make test's second pass).
# Both compilers emit each program as one LLVM module, not split into parts compiled by a
# thread each: with a program per core already (two workers on two cores), the split's overhead
# was 6 % of the CPU (paired runs of the bootstrap, toolkit and loss-training tests: 111 and 115
# CPU-s against 121 and 120, 2026-11-28). Both also turn LLVM's expensive passes off: with the
# default emitters that keeps the exact_across_programs tests' bits equal.
DEFAULT_COMPILE_FLAGS = ("--xla_backend_optimization_level=0"
                         " --xla_llvm_disable_expensive_passes=true"
                         " --xla_cpu_parallel_codegen_split_count=1")
EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"
FAST_COMPILE_FLAGS = f"{DEFAULT_COMPILE_FLAGS} {EMITTERS_OFF}"
NUM_DEVICES = 4
COMPILER = os.environ.get("CALIB_JAX_TESTS_COMPILER", "default")
if COMPILER not in ("default", "fast"):
  raise SystemExit(f"CALIB_JAX_TESTS_COMPILER={COMPILER!r} is not one of 'default', 'fast'")


def _flag_name(flag: str) -> str:
  return flag.split("=", 1)[0]


def merged_xla_flags(given: str, ours: str) -> str:
  """The XLA flags in effect: `given` (the user's XLA_FLAGS) as they are, then each flag of
  `ours` whose name the user did not set (so a user's choice always wins, and merging again,
  as each xdist worker does, changes nothing)."""
  names = {_flag_name(f) for f in given.split()}
  return " ".join(given.split() + [f for f in ours.split() if _flag_name(f) not in names])


os.environ["XLA_FLAGS"] = merged_xla_flags(
    os.environ.get("XLA_FLAGS", ""),
    f"--xla_force_host_platform_device_count={NUM_DEVICES} "
    "--xla_cpu_collective_call_terminate_timeout_seconds=600 "
    + (FAST_COMPILE_FLAGS if COMPILER == "fast" else DEFAULT_COMPILE_FLAGS))
# Both read off the flags in effect, not off the variable: the programs tests start with XLA_FLAGS
# of their own get the same compile flags as this process (the compile flags alone), and the
# exact_across_programs guard below follows the emitters these programs really compile with.
_COMPILE_FLAG_NAMES = {_flag_name(f) for f in FAST_COMPILE_FLAGS.split()}
os.environ["CALIB_JAX_TESTS_COMPILE_FLAGS"] = " ".join(
    f for f in os.environ["XLA_FLAGS"].split() if _flag_name(f) in _COMPILE_FLAG_NAMES)
FUSION_EMITTERS_OFF = EMITTERS_OFF in os.environ["XLA_FLAGS"].split()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# MLIR locations hold the op's source line only, not the whole Python traceback: lowering and
# compiling take 3.4 % less CPU (farm-bench, 5 pairs of the calibrator and loss tests, median
# ratio 0.966, 2026-11-28); only the programs' debug metadata changes. Read by JAX at import,
# and by the programs the tests start (they inherit the environment).
os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

# One persistent JAX compilation cache for the whole `pytest` run: its tests, both xdist
# workers and the programs they start (train.py, eval.py, the demo: `CALIB_JAX_COMPILATION_CACHE`
# is how calib_jax/cli/compilation_cache.py finds it) compile the same small programs many times
# over (every `tiny_config` run's steps, the evaluation's metrics), and a program compiled once
# is then read from disk. It is a fresh temporary directory made by the first process of the
# run (the xdist controller; the workers inherit its environment) and removed by it at the end,
# so a run starts with an empty cache, as on a fresh clone, and never writes to the user's
# cache directory. A test of the cache's own behaviour names its own directory.
SESSION_CACHE = "CALIB_JAX_TESTS_JAX_CACHE"
if not os.path.isdir(os.environ.get(SESSION_CACHE, "")):
  os.environ[SESSION_CACHE] = tempfile.mkdtemp(prefix="calib_jax_tests_jax_cache_")
  _CACHE_OWNER_PID = os.getpid()  # pytest_unconfigure removes it in this process only
os.environ["CALIB_JAX_COMPILATION_CACHE"] = os.environ[SESSION_CACHE]

import jax  # noqa: E402

# Float32 products at full precision, so a test's tolerance means the same on a GPU (whose default
# rounds the operands to TF32) or a TPU (bfloat16) as on the CPU. The product's exact integer
# arithmetic in float32 products asks for that precision itself; `CALIB_JAX_TESTS_MATMUL_PRECISION=
# default` runs the tests at the platform's default, as a user's program runs (a GPU check).
MATMUL_PRECISION = os.environ.get("CALIB_JAX_TESTS_MATMUL_PRECISION", "highest")
if MATMUL_PRECISION != "default":
  jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION)
# As calib_jax.cli.compilation_cache.enable() sets it for the programs: every program is
# cached, however fast it compiled. Not with the TPU compiler installed (the dry-run tests, in
# .venv-tpu): a program compiled for a TPU topology on a machine without one cannot be loaded
# back from the cache (JAX warns "PjRtCompiler must be constructed with a Client"), and the dry
# run itself never uses the cache.
if importlib.util.find_spec("libtpu") is None:
  jax.config.update("jax_compilation_cache_dir", os.environ[SESSION_CACHE])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


# Python's cyclic garbage collector, tuned for a test process: a young-generation collection
# every 50,000 allocations instead of 700 (tracing and lowering allocate millions of short-lived
# objects, nearly all freed by reference counting), and the imported modules and collected tests
# frozen out of its scans. 2.7 % less CPU (median of 3 pairs of the calibrator and loss-gradient
# tests, 2026-11-28); what the tests compute does not change. Each xdist worker collects, so
# each freezes its own.
gc.set_threshold(50_000, 50, 1000)


# While the tests are collected, their modules' `import tensorflow` (the data tests, calib_jax's
# pipelines) leaves out the Keras that TensorFlow imports eagerly and nothing here uses, as the
# programs' import does: ~2.7 of its ~8 CPU-s, in each process that runs tests.
_KERAS_LEFT_OUT = contextlib.ExitStack()


def pytest_configure(config):
  del config
  from calib_jax.cli import console
  _KERAS_LEFT_OUT.enter_context(console.keras_left_out())


def pytest_collection_finish(session):
  del session
  _KERAS_LEFT_OUT.close()
  gc.collect()
  gc.freeze()


def pytest_unconfigure(config):
  del config
  if globals().get("_CACHE_OWNER_PID") == os.getpid():
    shutil.rmtree(os.environ[SESSION_CACHE], ignore_errors=True)


@pytest.fixture(autouse=True)
def _host_rank_sorts():
  """Programs run in-process (train.py's and eval.py's `main`) switch the rank metrics to
  cacheable XLA sorts with their compilation cache (`compilation_cache.enable`); the tests
  after them get the default back (host sorts: faster to compile, and this run compiles many
  shapes once each)."""
  yield
  from calib_jax import metrics
  metrics.use_cacheable_cpu_sorts(False)


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
# long test keeping one worker busy while the other waits. Longest first (the modules' summed
# `--durations` of a whole run, 2026-11-27: a long module left out of this list, such as
# test_evaluation_shift's, ran among the quick tests, at the end).
SLOW_MODULES = ("test_run_multihost", "test_sweep", "test_cli_console", "test_docs",
                "test_evaluation_predictions", "test_run_faults", "test_evaluation_shift",
                "test_evaluation_toolkit", "test_cli_installed", "test_demo", "test_explain",
                "test_models", "test_dry_run_measure", "test_evaluation_run",
                "test_models_torch_weights", "test_losses", "test_run_loop", "test_shift",
                "test_models_torch_import", "test_evaluation_maps", "test_cli_train",
                "test_calibrators_report",
                # Each with a test of 7-19 CPU-s (a run's per-test CPU, 2026-11-28): left
                # among the quick tests, one of them could be a run's last test, one worker idle.
                "test_evaluation_predictions_intervals", "test_losses_training",
                "test_data_offline", "test_program_store", "test_metrics_bootstrap",
                "test_config_errors", "test_run_on_device")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected what it deselects
def pytest_collection_modifyitems(items):
  exact = [item.nodeid for item in items if item.get_closest_marker("exact_across_programs")]
  if FUSION_EMITTERS_OFF and exact:
    raise pytest.UsageError(
        f"{len(exact)} tests marked exact_across_programs (the first: {exact[0]}) need XLA's "
        f"default CPU emitters, and XLA_FLAGS has {EMITTERS_OFF}: run them without "
        "CALIB_JAX_TESTS_COMPILER=fast (or that flag), or add -m 'not exact_across_programs' "
        "(make test runs them in its second pass)")
  def rank(item):
    name = item.path.stem
    return SLOW_MODULES.index(name) if name in SLOW_MODULES else len(SLOW_MODULES)
  items.sort(key=rank)  # stable: collection order within a module and among the rest
