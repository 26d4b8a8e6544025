"""The programs' console: a progress bar and results on the console, library logs in
`<workdir>/log.txt`, absl's `-v`/`--verbosity` bringing them back on stderr, and user mistakes
as one line. The programs run as a user runs them: in a fresh process, with no log settings."""
import os
import re
import subprocess
import sys

import pytest

from calib_jax.cli import compilation_cache, console

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# absl's log line prefix (`I1123 16:56:23.588393 1400 file.py:12]`) or a C++ log's.
LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|^WARNING|oneDNN|Generating splits")
TINY = ["--config=configs/clutter_objects_cnn.py:ce", "--config.data.name=digits",
        "--config.model_kwargs.widths=(4, 8)", "--config.num_train_steps=24",
        "--config.data.batch_size=32", "--config.data.eval_batch_size=64",
        "--config.optimizer.name=sgd", "--config.optimizer.learning_rate=0.1",
        "--config.schedule.warmup_epochs=0.1",
        "--config.tensorboard=False", "--config.checkpoint_every_steps=12",
        "--config.log_every_steps=12", "--config.eval_every_steps=24",
        # 50 resamples of the toolkit's intervals, not 1000 (as test_train_loop.tiny_config).
        "--config.eval.bootstrap_samples=50"]
# The verbose eval checks where the logs go, not the report: without the post-hoc toolkit
# and the CAM grid. The quiet eval runs every part of the report (the toolkit and the CAM grid
# too), its toolkit with one calibrator and no bootstrap intervals: the parts' console is the
# same with one calibrator as with six, and the fits and the intervals cost CPU here (37
# against 40 CPU-s in whole-suite runs, 2026-11-29); test_evaluation_toolkit.py checks them.
REPORT_ONLY = ["--config.eval.toolkit=False", "--config.eval.cam_images=0"]
LEAN_TOOLKIT = ["--config.eval.calibrators=('temperature',)", "--config.eval.bootstrap_samples=0"]


def _env(cache_dir):
  env = {k: v for k, v in os.environ.items()
         if k not in ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")}  # As a user's shell has them,
  # one device, with the test run's compile flags (tests/conftest.py): they change how long
  # XLA compiles, not what the programs print.
  env["XLA_FLAGS"] = os.environ["CALIB_JAX_TESTS_COMPILE_FLAGS"]
  env["PYTHONPATH"] = ROOT
  # The programs' persistent compilation cache, on as it is for a user, in this module's own
  # folder (not the test run's, tests/conftest.py): the second eval.py finds the first one's
  # programs.
  env[compilation_cache.ENV] = str(cache_dir)
  return env


def _run(program, *args, cache_dir):
  return subprocess.run([sys.executable, program, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=_env(cache_dir))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("programs_cache")


def _log_lines(text):
  return [line for line in text.splitlines() if LOG_LINE.search(line)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
  """train.py on a tiny config with the default console; its process and work directory."""
  workdir = tmp_path_factory.mktemp("run")
  return _run("train.py", *TINY, f"--workdir={workdir}", cache_dir=cache_dir), workdir


def test_train_console_is_the_bar_and_results_and_the_log_file_has_the_rest(trained):
  proc, workdir = trained
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _log_lines(proc.stderr) == [] and _log_lines(proc.stdout) == [], proc.stderr[-3000:]
  assert re.search(r"^24/24 \[#+\]", proc.stderr, re.M)  # the progress bar
  assert re.search(r"^step 24 val accuracy=0\.\d{4} nll=", proc.stdout, re.M)
  log = (workdir / console.LOG_FILE).read_text()
  assert re.search(r"^I\d{4} .*checkpoint_manager\.py:\d+\] .*CheckpointManager", log, re.M)
  assert re.search(r"^I\d{4} .*Constructing tf\.data\.Dataset sklearn_digits", log, re.M)
  assert re.search(r"^I\d{4} .*loop\.py:\d+\] step 24 val accuracy=", log, re.M)


def test_eval_console_is_the_table_and_verbosity_brings_the_logs_back(trained, cache_dir):
  proc, workdir = trained
  assert proc.returncode == 0, proc.stderr[-3000:]
  quiet = _run("eval.py", *TINY, *LEAN_TOOLKIT, f"--workdir={workdir}", cache_dir=cache_dir)
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  assert "PreT" in quiet.stdout and _log_lines(quiet.stderr) == [], quiet.stderr[-3000:]
  loud = _run("eval.py", *TINY, *REPORT_ONLY, f"--workdir={workdir}", "--verbosity=0",
              cache_dir=cache_dir)
  assert loud.returncode == 0, loud.stderr[-3000:]
  assert "PreT" in loud.stdout
  assert re.search(r"^I\d{4} .*checkpoint\.py:\d+\] Restored the variables", loud.stderr, re.M)
  log = (workdir / console.LOG_FILE).read_text()
  assert len(re.findall(r"Restored the variables of checkpoint 24", log)) == 2  # both evals


def test_a_mistake_after_setup_is_one_line_on_stderr(tmp_path):
  proc = _run("train.py", *TINY, "--config.data.batch_size=100000", f"--workdir={tmp_path}",
              cache_dir=tmp_path / "cache")
  assert proc.returncode == 1
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("train.py: batch_size=100000"), lines[-20:]
  assert "batch_size=100000" in (tmp_path / console.LOG_FILE).read_text()  # logged too


@pytest.mark.parametrize("argv,asks", [
    (["train.py", "--workdir=w"], False),
    (["train.py", "--config.verbosity=1"], False),
    (["train.py", "-v", "0"], True),
    (["train.py", "--verbosity=1"], True),
    (["train.py", "--alsologtostderr"], True),
    (["demo.py", "--logtostderr"], True),
])
def test_flags_that_ask_for_logs(argv, asks):
  assert console.asks_for_logs(argv) is asks
