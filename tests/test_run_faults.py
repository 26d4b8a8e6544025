"""Faults met at scale, injected for real: damaged checkpoint files (training resumes from the
newest readable one, eval skips it), SIGTERM (a preemption notice) in a real train.py process,
and an unwritable work directory."""
import asyncio
import contextlib
import gc
import glob
import os
import re
import shutil
import threading
import time

import jax
import numpy as np
import pytest

from calib_jax.training import checkpoint, parallel
from calib_jax.run import loop, preemption
from calib_jax import experiment
from calib_jax.evaluation import report, run as evaluation
from calib_jax.training import reporting
from calib_jax import config as config_lib
from calib_jax.config import variants
from fixtures import forked_programs
from test_cli_console import TINY
from test_run_loop import quick_rng_compilation, tiny_config  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
  """A run stopped after 16 of 24 steps: checkpoints 8 and 16 (copied for each test)."""
  workdir = str(tmp_path_factory.mktemp("faults") / "run")
  loop.train_and_evaluate(tiny_config(stop_after_steps=16), workdir)
  assert checkpoint.Checkpointer(workdir, read_only=True).all_steps() == [8, 16]
  return workdir


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted 24-step run's final state."""
  return loop.train_and_evaluate(tiny_config(), str(tmp_path_factory.mktemp("faults") / "ref"))


def _copy(workdir, tmp_path):
  target = str(tmp_path / "run")
  shutil.copytree(workdir, target)
  return target


def _damage(workdir, step, how):
  """Really damages checkpoint `step` on disk; returns {path: bytes} of what is left there."""
  state_dir = os.path.join(checkpoint.checkpoint_dir(workdir), str(step), "state")
  if how == "garbage":  # Every array data file overwritten with random bytes of the same size.
    files = [f for f in glob.glob(f"{state_dir}/**/d/*", recursive=True) if os.path.isfile(f)]
    assert files
    rng = np.random.default_rng(0)
    for f in files:
      size = os.path.getsize(f)
      with open(f, "wb") as out:
        out.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
  elif how == "missing":  # A copy cut short: the array index files are gone.
    files = glob.glob(f"{state_dir}/**/manifest.ocdbt", recursive=True)
    assert files
    for f in files:
      os.remove(f)
  else:
    raise ValueError(how)
  root = os.path.join(checkpoint.checkpoint_dir(workdir), str(step))
  return {os.path.relpath(f, root): open(f, "rb").read()
          for f in glob.glob(f"{root}/**/*", recursive=True) if os.path.isfile(f)}


def _same_files(directory, files):
  found = {os.path.relpath(f, directory): open(f, "rb").read()
           for f in glob.glob(f"{directory}/**/*", recursive=True) if os.path.isfile(f)}
  return found == files


def _warnings(stderr):
  return [line for line in stderr.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("how", ["garbage", "missing"])
def test_damaged_newest_checkpoint_resumes_from_the_newest_readable(
    two_checkpoints, reference, tmp_path, capsys, how):
  workdir = _copy(two_checkpoints, tmp_path)
  damaged = _damage(workdir, 16, how)
  capsys.readouterr()
  resumed = loop.train_and_evaluate(tiny_config(), workdir)
  lines = _warnings(capsys.readouterr().err)
  assert len(lines) == 1, lines
  assert "checkpoint 16 is unreadable" in lines[0] and "resuming from step 8" in lines[0]
  # Nothing deleted: the damaged checkpoint was moved aside intact; step 16 was saved anew.
  aside = os.path.join(workdir, checkpoint.UNREADABLE_SUBDIR, "16")
  assert _same_files(aside, damaged)
  assert checkpoint.Checkpointer(workdir, read_only=True).all_steps() == [8, 16, 24]
  for x, y in zip(jax.tree.leaves(jax.device_get(reference.params)),
                  jax.tree.leaves(jax.device_get(resumed.params)), strict=True):
    np.testing.assert_array_equal(x, y)


def test_no_readable_checkpoint_is_one_error_and_nothing_is_touched(two_checkpoints, tmp_path):
  workdir = _copy(two_checkpoints, tmp_path)
  kept = {step: _damage(workdir, step, how) for step, how in ((8, "missing"), (16, "garbage"))}
  with pytest.raises(checkpoint.UnreadableCheckpointError) as info:
    loop.train_and_evaluate(tiny_config(), workdir)
  message = str(info.value)
  assert "\n" not in message and "no checkpoint in" in message
  assert "16: ValueError" in message and "8: ValueError" in message
  for step, files in kept.items():
    assert _same_files(os.path.join(checkpoint.checkpoint_dir(workdir), str(step)), files)
  assert not os.path.exists(os.path.join(workdir, checkpoint.UNREADABLE_SUBDIR))


def _eval_restore(workdir, step=None):
  return evaluation.restore_variables(experiment.build(tiny_config()), workdir, step)


def test_eval_skips_a_damaged_newest_checkpoint_and_refuses_it_by_step(
    two_checkpoints, tmp_path, capsys):
  workdir = _copy(two_checkpoints, tmp_path)
  damaged = _damage(workdir, 16, "garbage")
  capsys.readouterr()
  variables, step = _eval_restore(workdir)
  assert step == 8 and "params" in variables
  lines = _warnings(capsys.readouterr().err)
  assert len(lines) == 1 and "skipped checkpoint 16, unreadable" in lines[0], lines
  assert "evaluating step 8" in lines[0]
  with pytest.raises(checkpoint.UnreadableCheckpointError, match=r"^checkpoint 16 in .* is "
                     r"unreadable \(ValueError: "):
    _eval_restore(workdir, step=16)
  # Eval is read-only: the damaged checkpoint stays where it is, as it was.
  assert _same_files(os.path.join(checkpoint.checkpoint_dir(workdir), "16"), damaged)


STEPS_PER_DISPATCH = 4


def _train_args(workdir, steps, on_device=False):
  return [*TINY, f"--config.num_train_steps={steps}", "--config.eval_every_steps=0",
          "--config.checkpoint_every_steps=1000", f"--config.data.on_device={on_device}",
          f"--config.steps_per_dispatch={STEPS_PER_DISPATCH}", f"--workdir={workdir}"]


def _env():
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")}
  # One device, as a user's train.py has; the test run's compile flags and its compilation
  # cache (tests/conftest.py: CALIB_JAX_TESTS_COMPILE_FLAGS, CALIB_JAX_COMPILATION_CACHE).
  env.update(PYTHONPATH=ROOT, XLA_FLAGS=os.environ["CALIB_JAX_TESTS_COMPILE_FLAGS"])
  return env


def _final_variables(workdir, step):
  """The params and batch statistics of checkpoint `step` of a train.py run of TINY."""
  config = config_lib.load_config_file(TINY[0].split("=", 1)[1])  # The variables depend on the
  variants.override(config, {"data.name": "digits", "model_kwargs.widths": (4, 8)})  # model only.
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  variables, saved = ckpt.restore_variables(experiment.build(config).abstract_variables(), step)
  ckpt.close()
  assert saved["step"] == step
  return jax.device_get(variables)


SIGTERM_STEPS, PAUSE_AT = 30, 11
# Calls of 4 steps: SIGTERM arrives while the loop waits for call 2 (steps 9..12), whose batch
# 11 is paused.
BLOCKED_CALL = PAUSE_AT // STEPS_PER_DISPATCH


@contextlib.contextmanager
def _unwritable(tmp_path):
  """A work directory nothing can be written in: a read-only folder, or, where chmod does not
  stop writes (tests run as root), a path below a regular file."""
  folder = tmp_path / "read_only"
  folder.mkdir()
  folder.chmod(0o555)
  try:
    (folder / "probe").write_text("x")
  except OSError:
    yield str(folder / "run")
    folder.chmod(0o755)
    return
  (folder / "probe").unlink()  # Root: the read-only bit does not stop it.
  folder.chmod(0o755)
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder\n")
  yield str(blocker / "run")
  assert blocker.read_text() == "not a folder\n"  # Nothing of the user's was touched.


@pytest.fixture
def unwritable_workdir(tmp_path):
  with _unwritable(tmp_path) as workdir:
    yield workdir


@pytest.fixture(scope="module")
def train_py(tmp_path_factory):
  """This module's train.py runs, each a fresh train.py process forked from one that imported
  TensorFlow and JAX once (tests/fixtures/forked_programs.py; most of a start is those
  imports), in turn: two runs preempted by SIGTERM (tests/fixtures/train_pausing.py), with the
  training set fed by tf.data and on the devices; an uninterrupted run fed by tf.data (the
  reference of both); the same command again in each preempted run's work directory (the
  reruns); a run in an unwritable work directory. {"preempted" / "rerun": {on_device:
  process}, "workdir": {on_device: path}, "reference": variables, "unwritable": (process,
  workdir)}."""
  root = tmp_path_factory.mktemp("train_py")
  workdirs = {on_device: root / f"preempted_{on_device}" for on_device in (False, True)}
  reference = root / "uninterrupted"
  with _unwritable(tmp_path_factory.mktemp("unwritable")) as unwritable:
    runs = [("train_pausing:run", ["train.py", *_train_args(workdirs[on_device], SIGTERM_STEPS,
                                                            on_device),
                                   f"--sigterm_at_batch={PAUSE_AT}",
                                   f"--sigterm_in_call={BLOCKED_CALL}"])
            for on_device in (False, True)]
    runs += [("calib_jax.cli.train:run", ["train.py", *args]) for args in (
        _train_args(reference, SIGTERM_STEPS),
        *(_train_args(workdirs[on_device], SIGTERM_STEPS, on_device) for on_device in (False, True)),
        _train_args(unwritable, 24))]
    # Up to 5 minutes a run, as each had as a process of its own (a loaded machine is slow).
    done = forked_programs.run_programs(runs, cwd=ROOT, env=_env(), timeout=300 * len(runs))
  assert done[2].returncode == 0, done[2].stderr[-2000:]
  return {"preempted": dict(zip((False, True), done[:2])), "workdir": workdirs,
          "reference": _final_variables(str(reference), SIGTERM_STEPS),
          "rerun": dict(zip((False, True), done[3:5])), "unwritable": (done[5], unwritable)}


@pytest.mark.parametrize("on_device", [False, True])
def test_sigterm_saves_the_step_in_flight_and_the_rerun_matches_an_uninterrupted_run(
    on_device, train_py):
  """The preempted run (with `on_device`: its training set on the devices) resumed, against
  an uninterrupted run fed by tf.data."""
  steps, workdir = SIGTERM_STEPS, train_py["workdir"][on_device]
  preempted = train_py["preempted"][on_device]
  assert preempted.returncode == preemption.PREEMPTED_EXIT_CODE, preempted.stderr
  assert f"paused before batch {PAUSE_AT}" in preempted.stderr
  # The call in flight (steps 9..12) is finished, then saved.
  saved = (BLOCKED_CALL + 1) * STEPS_PER_DISPATCH
  assert preempted.stderr.strip().splitlines()[-1] == (
      f"train.py: preempted (SIGTERM): saved checkpoint {saved} in "
      f"{checkpoint.checkpoint_dir(str(workdir))}; run the same command again to resume"), (
          preempted.stderr)
  assert f"checkpoints: [{saved}]" in preempted.stdout.splitlines()  # before the rerun
  rerun = train_py["rerun"][on_device]
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  err = rerun.stderr
  # The resumed run's first call ends STEPS_PER_DISPATCH steps after the checkpoint.
  assert re.search(rf"^{saved + STEPS_PER_DISPATCH}/{steps} \[", err, re.M), err[-2000:]
  assert not re.search(rf"^{saved}/{steps} \[", err, re.M)
  for x, y in zip(jax.tree.leaves(train_py["reference"]),
                  jax.tree.leaves(_final_variables(str(workdir), steps)), strict=True):
    np.testing.assert_array_equal(x, y)


def test_unwritable_workdir_fails_right_after_config_validation(unwritable_workdir, monkeypatch):
  def no_build(*args, **kwargs):
    raise AssertionError("went on to build the run before checking the work directory")

  monkeypatch.setattr(experiment.Experiment, "optimizer", no_build)
  with pytest.raises(reporting.WorkdirError) as info:
    loop.train_and_evaluate(tiny_config(), unwritable_workdir)
  assert str(info.value).startswith(f"work directory {unwritable_workdir} is not writable (")
  assert "\n" not in str(info.value)


def test_train_py_reports_an_unwritable_workdir_in_one_line(train_py):
  proc, unwritable_workdir = train_py["unwritable"]
  assert proc.returncode == 1
  assert proc.stderr.splitlines() == [
      f"train.py: work directory {unwritable_workdir} is not writable "
      f"({'Not a directory' if 'a_file' in unwritable_workdir else 'Permission denied'})"]


def _files(directory):
  return {os.path.relpath(f, directory): open(f, "rb").read()
          for f in glob.glob(f"{directory}/**/*", recursive=True) if os.path.isfile(f)}


@pytest.mark.parametrize("overrides,expected", [
    # Another width: the model's arrays differ (eval's partial read too).
    ({"model_kwargs.widths": (4, 16)}, r"params\.conv1\.kernel: stored \(3, 3, 4, 8\), wanted "
                                       r"\(3, 3, 4, 16\)"),
    # No momentum: SGD's trace is missing from the optimiser state's tree.
    ({"optimizer.momentum": 0.0}, r"opt_state\.1\.trace\.[a-z0-9_.]+: only in the checkpoint"),
])
def test_a_checkpoint_of_another_config_is_a_mismatch_and_nothing_is_touched(
    two_checkpoints, tmp_path, capfd, overrides, expected):
  """The files are fine: the error names the arrays, never 'unreadable', nothing is moved or
  rewritten (config.json included) and nothing else is printed."""
  workdir = _copy(two_checkpoints, tmp_path)
  before = _files(workdir)
  capfd.readouterr()
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=r"^checkpoint 16 in .* holds other arrays than") as info:
    loop.train_and_evaluate(tiny_config(**overrides), workdir)
  assert "unreadable" not in str(info.value) and "\n" not in str(info.value)
  assert any(re.fullmatch(expected, d) for d in info.value.differences), info.value.differences
  if "model_kwargs.widths" in overrides:
    with pytest.raises(checkpoint.CheckpointMismatchError) as info:
      _eval_restore_config(tiny_config(**overrides), workdir)
    assert any(re.fullmatch(expected, d) for d in info.value.differences)
  assert _files(workdir) == before
  assert "Traceback" not in "".join(capfd.readouterr())


def _eval_restore_config(config, workdir):
  return evaluation.restore_variables(experiment.build(config), workdir)


def test_failed_reads_print_nothing_but_their_warning(two_checkpoints, tmp_path, capfd, caplog):
  """A failed read ends with its one exception: orbax's event loop waits for tensorstore's other
  reads of that checkpoint (no 'Event loop is closed' from a late one, no 'Task exception was
  never retrieved'). Repeated, as the late completions came in about one read in six."""
  workdir = _copy(two_checkpoints, tmp_path)
  _damage(workdir, 16, "missing")
  abstract = experiment.build(tiny_config()).abstract_variables()
  capfd.readouterr()
  for _ in range(4):
    reader = checkpoint.Checkpointer(workdir, read_only=True)
    _, meta = reader.restore_variables(abstract)
    reader.close()
    assert meta["step"] == 8 and [s for s, _ in reader.skipped] == [16]
  gc.collect()  # a task whose exception nobody took says so when it is collected
  printed = "".join(capfd.readouterr()) + caplog.text
  for text in ("Traceback", "Event loop is closed", "never retrieved"):
    assert text not in printed


def test_a_read_that_fails_first_lets_the_others_finish_before_its_loop_closes():
  """orbax's pattern, made deterministic: `gather` fails at once on one read while a tensorstore
  thread completes another a second later (`call_soon_threadsafe`). Under `_reads_awaited` the
  loop waits for it before closing; a plain loop is closed by then and the thread's callback
  fails with 'Event loop is closed' (the traceback users saw)."""

  def late_failures(context) -> list[str]:
    failures: list[str] = []
    threads: list[threading.Thread] = []
    with context:
      loop = asyncio.new_event_loop()

      async def fails_now():
        raise ValueError("NOT_FOUND")

      async def completes_later():
        future = loop.create_future()

        def from_a_thread():
          time.sleep(1.0)
          try:
            loop.call_soon_threadsafe(future.set_result, None)
          except RuntimeError as e:
            failures.append(str(e))

        threads.append(threading.Thread(target=from_a_thread, daemon=True))
        threads[-1].start()
        await future

      async def read():
        await asyncio.gather(completes_later(), fails_now())

      with pytest.raises(ValueError, match="NOT_FOUND"):
        try:
          loop.run_until_complete(read())
        finally:
          loop.close()
    threads[0].join()
    return failures

  assert late_failures(checkpoint._reads_awaited()) == []  # pylint: disable=protected-access
  assert late_failures(contextlib.nullcontext()) == ["Event loop is closed"]


def test_a_read_that_failed_before_the_close_has_its_exception_taken(caplog):
  """A task that failed before the loop closed (not among `asyncio.all_tasks`, which lists
  unfinished tasks only) is taken under `_reads_awaited`; on a plain loop its collection logs
  'Task exception was never retrieved' (the flaky traceback of the test above's real reads)."""

  def unretrieved(context) -> bool:
    caplog.clear()
    with context:
      loop = asyncio.new_event_loop()

      async def fails_now():
        raise ValueError("NOT_FOUND")

      async def read():
        asyncio.ensure_future(fails_now())  # nobody awaits it
        await asyncio.sleep(0.01)  # it has failed by now
        raise ValueError("the first failure")

      with pytest.raises(ValueError, match="the first failure"):
        try:
          loop.run_until_complete(read())
        finally:
          loop.close()
    del loop
    gc.collect()
    return "never retrieved" in caplog.text

  assert unretrieved(checkpoint._reads_awaited()) is False  # pylint: disable=protected-access
  assert unretrieved(contextlib.nullcontext()) is True
