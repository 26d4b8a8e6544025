"""Multi-host training proven on one machine: two local processes with 4 fake CPU devices each,
joined by `jax.distributed.initialize` (collectives over gloo), train the tiny config, as a
single run and as a seed sweep; both processes are killed mid-run and restarted (each start two
fresh processes forked from one that imported TensorFlow and JAX once: tests/fixtures/
multihost_worker.py). Each process reads its own disjoint shard of the
training split, so the global batch of a step is host 0's shard batch then host 1's: the result
must match one process (the suite's 4 devices) fed those same global batches (to 1e-5: the
same data-parallel step on another number of devices), and only process 0 writes the logs."""
import collections
import contextlib
import json
import os
import signal
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
from test_run_loop import quick_rng_compilation, tiny_config  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "fixtures", "multihost_worker.py")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class _Job:
  """The job's processes (multihost_worker.py): one process that imports once, then forks a
  child per process of the job for each start (`_start`), fresh processes that join the job
  and are killed or finish. Its stdout holds both children's lines, each led by its process id;
  `next_line(i)` is process i's next."""

  def __init__(self, server: subprocess.Popen):
    self.server = server
    self.pending = {i: collections.deque() for i in range(2)}

  def next_line(self, process_id: int) -> str:
    while not self.pending[process_id]:
      line = self.server.stdout.readline()
      if not line:
        return ""
      index, _, rest = line.partition(" ")
      if index.isdigit():
        self.pending[int(index)].append(rest)
      else:  # the server's own (its imports' warnings), shown with either process's lines
        for pending in self.pending.values():
          pending.append(line)
    return self.pending[process_id].popleft()


@contextlib.contextmanager
def _hosts(out):
  """The job's two processes, process i's lines read as `_read_until(job, i, ...)`."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  # One compilation cache for the job's three starts (beside their temporary folders): the
  # restarts find the programs compiled before the kill.
  cache = os.path.join(out, "multihost_jax_cache")
  env.update(PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  # In a session of its own: its process group, with its children, is ended at the end.
  server = subprocess.Popen([sys.executable, WORKER, "2", out], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    yield _Job(server)
  finally:
    os.killpg(server.pid, signal.SIGKILL)
    server.communicate()


def _read_until(job, process_id, prefix):
  """Lines of process `process_id` up to and with the first that starts with `prefix`; fails
  at `exited`."""
  seen = []
  while line := job.next_line(process_id):
    seen.append(line)
    if line.startswith(prefix):
      return seen
    if line.startswith("exited "):
      break
  raise AssertionError(f"no {prefix!r} line of process {process_id}:\n"
                       + "".join(seen)[-3000:])


def _start(job, runs):
  """One start of the job training `runs` (multihost_worker.py's stdin lines) in turn: a child
  per process; returns their process ids."""
  job.server.stdin.write(json.dumps({"port": _free_port(), "runs": runs}) + "\n")
  job.server.stdin.flush()
  return [int(_read_until(job, i, "start ")[-1].split()[1]) for i in range(2)]


def _kill_when_paused(job, runs, workdir):
  """Starts `runs`, waits until both children paused before batch 10 of the run in `workdir`,
  once its checkpoint 8 is on disk, and kills them there (SIGKILL); returns what each printed
  until then."""
  children = _start(job, runs)
  logs = ["".join(_read_until(job, i, "paused before batch 10")) for i in range(2)]
  step_dir = os.path.join(checkpoint.checkpoint_dir(workdir), "8")
  deadline = time.monotonic() + 120  # The asynchronous save of step 8 commits in the background.
  while not os.path.isdir(step_dir) and time.monotonic() < deadline:
    time.sleep(0.1)
  for child in children:
    os.kill(child, signal.SIGKILL)
  for i in range(2):
    assert _read_until(job, i, "exited ")[-1] == f"exited {-signal.SIGKILL}\n"
  assert checkpoint.Checkpointer(workdir, read_only=True).all_steps() == [8]
  return logs


def _finished(name, logs, out):
  """Asserts that both processes finished run `name` at step 24 with the same parameters;
  returns them."""
  for i, log in enumerate(logs):
    assert f"{name}: process {i} of 2: 4 local / 8 devices, step 24" in log, log[-3000:]
  hosts = [dict(np.load(os.path.join(out, f"params_{name}_{i}.npz"))) for i in range(2)]
  for key in hosts[0]:
    np.testing.assert_array_equal(hosts[0][key], hosts[1][key])
  return hosts


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


def _assert_params_match(host, params):
  flat = jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
  assert len(flat) == len(host)
  for path, value in flat:
    np.testing.assert_allclose(host[jax.tree_util.keystr(path)], value, rtol=0, atol=1e-5)


SWEEP = {"sweep": "seed=0,1", "sweep_member_shards": 2, "eval_every_steps": 24}


def test_two_processes_train_like_one_and_resume_after_a_kill(tmp_path, monkeypatch):
  """A single run and a seed sweep, each killed before batch 10 (checkpoint 8 on disk) and
  resumed, in three starts of the two processes (a start is most of the time: joining,
  compiling): 1) the single run, killed; 2) the single run resumed to the end, then
  the sweep, killed; 3) the sweep resumed to the end. Then each against one process.

  The sweep's two members are on the 2-D mesh (member, data) over both processes' 8 devices:
  each member shard takes 2 devices of each process, so each process feeds its half of every
  batch of both seeds' streams, and the member-split state is saved and restored by both."""
  out = str(tmp_path)
  single = {"name": "single", "workdir": str(tmp_path / "run"), "overrides": {}}
  sweep = {"name": "sweep", "workdir": str(tmp_path / "sweep_run"), "overrides": SWEEP}
  with _hosts(out) as job:
    _kill_when_paused(job, [dict(single, pause_at=10)], single["workdir"])
    single_logs = _kill_when_paused(job, [single, dict(sweep, pause_at=10)], sweep["workdir"])
    _start(job, [sweep])
    sweep_logs = ["".join(_read_until(job, i, "exited ")) for i in range(2)]
  assert [log.splitlines()[-1] for log in sweep_logs] == ["exited 0"] * 2, (
      "\n".join(x[-3000:] for x in sweep_logs))
  monkeypatch.setattr(experiment_data.DataRecipe, "train_stream", _host_sharded_stream)

  # The single run. Only process 0 wrote the metrics: one record per logging step, both
  # starts together.
  hosts = _finished("single", single_logs, out)
  workdir = single["workdir"]
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records] == [8, 16, 24]  # 8 before the kill, then the rest
  # One process (the suite's 4 devices), the same global batches.
  reference = loop.train_and_evaluate(tiny_config(), str(tmp_path / "one_process"))
  _assert_params_match(hosts[0], reference.params)

  # The sweep.
  hosts = _finished("sweep", sweep_logs, out)
  workdir = sweep["workdir"]
  records = reporting.read_metrics(workdir)
  assert [(r["step"], r["split"], r["member"]) for r in records] == [
      (step, "train", member) for step in (8, 16, 24) for member in (0, 1)] + [
      (24, "val", member) for member in (0, 1)]
  reference_dir = str(tmp_path / "one_process_sweep")
  reference = loop.train_and_evaluate(tiny_config(**SWEEP), reference_dir)
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
