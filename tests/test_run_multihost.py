"""Multi-host training proven on one machine: two local processes with 4 fake CPU devices each,
joined by `jax.distributed.initialize` (collectives over gloo), train the tiny config; one of
them is killed mid-run and both restarted. Each process reads its own disjoint shard of the
training split, so the global batch of a step is host 0's shard batch then host 1's: the result
must match one process with 8 devices fed those same global batches (to 1e-5), and only process
0 writes the logs."""
import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np

from calib_jax import data
from calib_jax.experiment import data as experiment_data
from calib_jax.evaluation import validation
from calib_jax.training import checkpoint, parallel, reporting
from calib_jax.run import loop
from calib_jax.sweep import summary
from test_run_loop import compilation_cache, quick_rng_compilation, tiny_config  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "fixtures", "multihost_worker.py")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, out, env_extra=None, overrides=None):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  # One compilation cache for the session's multi-host tests (beside their temporary folders):
  # the single run and the sweep share the predict and initialisation programs.
  cache = os.path.join(os.path.dirname(out), "multihost_jax_cache")
  env.update(PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **(env_extra or {}))
  return [subprocess.Popen([sys.executable, WORKER, str(i), "2", str(port), workdir, out,
                            json.dumps(overrides or {})],
                           cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True) for i in range(2)]


def _host_sharded_stream(recipe, start_step, seed, **unused):
  """One process's training stream made of the two hosts' streams, host 0's half first."""
  config = recipe.config  # the `data` sub-config
  local = parallel.local_batch_size(config.batch_size) // 2
  streams = [data.make_dataset(config.name, "train", batch_size=local, train=True,
                               seed=seed, data_dir=config.dir,
                               start_batch=start_step, process_index=i, process_count=2)
             for i in range(2)]
  for halves in zip(*streams):
    yield {k: np.concatenate([h[k] for h in halves]) for k in halves[0]}


def _train_kill_resume(workdir, out, overrides):
  """Two processes train `tiny_config(**overrides)` in `workdir`, are killed before batch 10
  (checkpoint 8 on disk) and restarted; returns each process's final parameters."""
  # 1) Both processes pause before batch 10, once checkpoint 8 is on disk: killed there.
  procs = _start(workdir, out, {"CALIB_TEST_PAUSE_AT_BATCH": "10"}, overrides)
  for p in procs:
    for line in p.stdout:
      if line.startswith("paused before batch 10"):
        break
    else:
      raise AssertionError(f"worker exited early: {p.wait()}")
  step_dir = os.path.join(checkpoint.checkpoint_dir(workdir), "8")
  deadline = time.monotonic() + 120  # The asynchronous save of step 8 commits in the background.
  while not os.path.isdir(step_dir) and time.monotonic() < deadline:
    time.sleep(0.1)
  for p in procs:
    p.kill()
    p.communicate()
  assert checkpoint.Checkpointer(workdir, read_only=True).all_steps() == [8]
  # 2) Restarted, they resume at step 8 and finish.
  procs = _start(workdir, out, overrides=overrides)
  logs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
  for i, log in enumerate(logs):
    assert f"process {i} of 2: 4 local / 8 devices, step 24" in log, log[-3000:]
  hosts = [dict(np.load(os.path.join(out, f"params_{i}.npz"))) for i in range(2)]
  for key in hosts[0]:
    np.testing.assert_array_equal(hosts[0][key], hosts[1][key])
  return hosts


def _assert_params_match(host, params):
  flat = jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
  assert len(flat) == len(host)
  for path, value in flat:
    np.testing.assert_allclose(host[jax.tree_util.keystr(path)], value, rtol=0, atol=1e-5)


def test_two_processes_train_like_one_and_resume_after_a_kill(tmp_path, monkeypatch):
  workdir, out = str(tmp_path / "run"), str(tmp_path)
  hosts = _train_kill_resume(workdir, out, {})
  # Only process 0 wrote the metrics: one record per logging step, both runs together.
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records] == [8, 16, 24]  # 8 before the kill, then the rest
  # 3) One process, 8 devices, the same global batches.
  monkeypatch.setattr(experiment_data.DataRecipe, "train_stream", _host_sharded_stream)
  reference = loop.train_and_evaluate(tiny_config(), str(tmp_path / "one_process"))
  _assert_params_match(hosts[0], reference.params)


def test_a_sweep_over_two_processes_trains_like_one_and_resumes_after_a_kill(tmp_path,
                                                                             monkeypatch):
  """A seed sweep's two members on the 2-D mesh (member, data) over both processes' 8 devices:
  each member shard takes 2 devices of each process, so each process feeds its half of every
  batch of both seeds' streams, and the member-split state is saved and restored by both."""
  sweep = {"sweep": "seed=0,1", "sweep_member_shards": 2, "eval_every_steps": 24}
  workdir, out = str(tmp_path / "run"), str(tmp_path)
  hosts = _train_kill_resume(workdir, out, sweep)
  records = reporting.read_metrics(workdir)
  assert [(r["step"], r["split"], r["member"]) for r in records] == [
      (step, "train", member) for step in (8, 16, 24) for member in (0, 1)] + [
      (24, "val", member) for member in (0, 1)]
  monkeypatch.setattr(experiment_data.DataRecipe, "train_stream", _host_sharded_stream)
  reference_dir = str(tmp_path / "one_process")
  reference = loop.train_and_evaluate(tiny_config(**sweep), reference_dir)
  _assert_params_match(hosts[0], reference.params)
  # Each member's validation, streamed over both processes' shards of the split, is the one
  # process's.
  val = [[r for r in reporting.read_metrics(d) if r["split"] == "val"]
         for d in (workdir, reference_dir)]
  for got, want in zip(*val, strict=True):
    for name in validation.VALIDATION_KEYS:
      np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
  # sweep.json, written by process 0 from the members' logits gathered over both processes,
  # holds the one process's results: the same logits give the same scores; the fitted
  # temperature agrees to the optimiser's tolerance, and the binned ECE after it is left out (a
  # confidence that moves across a bin edge changes it by 1/N).
  written, expected = (summary.read(d)["members"] for d in (workdir, reference_dir))
  assert len(written) == len(expected) == 2
  for got, want in zip(written, expected):
    for role in ("val", "test"):
      for name in ("accuracy", "ece", "nll"):
        np.testing.assert_allclose(got[role][name], want[role][name], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(got[role]["nll_ts"], want[role]["nll_ts"], rtol=1e-4)
    np.testing.assert_allclose(got["val"]["temperature"], want["val"]["temperature"], rtol=1e-3)
