"""Whole-process speed of `eval.py --predictions` (and optionally `make demo`), as a user runs
them (not a test): wall seconds, peak resident memory, programs compiled, load average.

Inputs (made once into `--data_dir`):
* `digits.npz`: a random forest's logits (log of its class probabilities, floored at 1e-4) on
  scikit-learn's digits: trained on 717 digits, val = the next 540, test = the last 540
  (10 classes);
* `imagenet_like.npz` (`--large`): 50,000 × 1,000 overconfident synthetic logits
  (`common.overconfident_logits`), val = the first 25,000, test = the other 25,000.

Each run is a fresh `python eval.py --predictions=FILE --workdir=TMP` (cold or warm JAX
compilation cache: `--cache=off|cold|warm`), timed from outside; peak RSS is the child's
`ru_maxrss`, its CPU seconds `ru_utime + ru_stime` (all its threads). Programs compiled are counted in a second process running the same command
with a `jax.monitoring` listener (`/jax/core/compile/backend_compile_duration` events; cache
hits counted apart; programs loaded untraced from `calib_jax.program_store` counted apart too).
The 1-min load average is printed beside each number.

  /work/main/.venv/bin/python bench/eval_predictions_speed.py --runs=3
  /work/main/.venv/bin/python bench/eval_predictions_speed.py --large --runs=1
  /work/main/.venv/bin/python bench/eval_predictions_speed.py --demo
  /work/main/.venv/bin/python bench/eval_predictions_speed.py --cache=warm --against=/tmp/before

`--against=OTHER_CHECKOUT` pairs each run with one of that checkout (an export of the commit
before, say), alternating, and says at the end whether the two `metrics.json` are the same to
the bit (their `files` entries, which name each run's directory, left out).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs eval.py's program with compile counters; writes them as JSON to $CALIB_JAX_BENCH_COUNTS.
_COUNTING = """
import atexit, json, os, sys
from jax import monitoring
counts = {"compiled": 0, "cache_hits": 0, "compile_seconds": 0.0, "trace_lower_seconds": 0.0,
          "names": {}, "stored": 0}
def on_duration(event, seconds, **kw):
  if event == "/jax/core/compile/backend_compile_duration":
    counts["compiled"] += 1
    counts["compile_seconds"] += seconds
    name = kw.get("fun_name", "?")
    counts["names"][name] = counts["names"].get(name, 0) + 1
  elif event in ("/jax/core/compile/jaxpr_trace_duration",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration"):
    counts["trace_lower_seconds"] += seconds
def on_event(event, **kw):
  if event == "/jax/compilation_cache/cache_hits":
    counts["cache_hits"] += 1
  elif event == "/calib_jax/program_store/loaded":  # calib_jax.program_store.LOADED_EVENT
    counts["stored"] += 1
monitoring.register_event_duration_secs_listener(on_duration)
monitoring.register_event_listener(on_event)
atexit.register(lambda: open(os.environ["CALIB_JAX_BENCH_COUNTS"], "w").write(json.dumps(counts)))
sys.argv = ["eval.py"] + sys.argv[1:]
sys.path.insert(0, os.getcwd())
from calib_jax.cli import evaluate
evaluate.run()
"""


def make_digits(path: str) -> None:
  from sklearn.datasets import load_digits
  from sklearn.ensemble import RandomForestClassifier
  x, y = load_digits(return_X_y=True)
  order = np.random.default_rng(0).permutation(len(y))
  x, y = x[order], y[order]
  train, val, test = slice(0, 717), slice(717, 1257), slice(1257, 1797)
  forest = RandomForestClassifier(n_estimators=100, random_state=0).fit(x[train], y[train])
  logits = lambda s: np.log(np.maximum(forest.predict_proba(x[s]), 1e-4)).astype(np.float32)
  np.savez(path, val_logits=logits(val), val_labels=y[val], test_logits=logits(test),
           test_labels=y[test])


def make_large(path: str) -> None:
  from common import overconfident_logits
  z, y = overconfident_logits(50_000, 1000, seed=0)
  np.savez(path, val_logits=z[:25_000], val_labels=y[:25_000], test_logits=z[25_000:],
           test_labels=y[25_000:])


def _load() -> str:
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(cmd, env, root=ROOT):
  """(wall s, peak RSS MB, status, output, CPU s), the RSS and the CPU time (user + system,
  every thread) from wait4 of this child alone: on a loaded machine the CPU seconds compare
  revisions better than the wall."""
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
  chunks = []
  while True:
    data = proc.stdout.read(65536)
    if not data:
      break
    chunks.append(data)
  _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  wall = time.perf_counter() - start
  return (wall, usage.ru_maxrss / 1024, proc.returncode, b"".join(chunks).decode(errors="replace"),
          usage.ru_utime + usage.ru_stime)


_DATA_DIR = flags.DEFINE_string("data_dir", os.path.join(tempfile.gettempdir(), "calib_jax_bench"),
                                "where the generated prediction files are kept")
_RUNS = flags.DEFINE_integer("runs", 3, "timed runs")
_LARGE = flags.DEFINE_bool("large", False, "the 50,000 x 1,000 file")
_DEMO = flags.DEFINE_bool("demo", False, "time `python -m calib_jax.demo`")
_CACHE = flags.DEFINE_enum("cache", "off", ["off", "cold", "warm"],
                           "JAX compilation cache: off, cold (empty dir per run), warm")
_COUNT = flags.DEFINE_bool("count", False, "also count programs compiled")
_NAMES = flags.DEFINE_bool("names", False, "with --count: list the programs by name")
_EXTRA = flags.DEFINE_string("extra", "", "extra eval.py flags, space-separated")
_KEEP = flags.DEFINE_string("keep", "", "copy the last metrics.json here")
_ROOT = flags.DEFINE_string("root", ROOT, "source checkout to run (e.g. an export of the commit "
                            "before, for paired before/after runs)")
_AGAINST = flags.DEFINE_string("against", "", "another checkout run before each run (paired "
                               "runs, alternating); their metrics.json are compared at the end")


def same_metrics(paths: list[str]) -> bool:
  """Whether the `metrics.json` files at `paths` hold the same report, to the bit (floats are
  written as their shortest repr), their `files` entries left out."""
  reports = []
  for path in paths:
    with open(path) as f:
      report = json.load(f)
    report.pop("files", None)
    reports.append(json.dumps(report, sort_keys=True))
  return len(set(reports)) == 1


def main(argv: list[str]) -> None:
  del argv
  args = types.SimpleNamespace(data_dir=_DATA_DIR.value, runs=_RUNS.value, large=_LARGE.value,
                               demo=_DEMO.value, cache=_CACHE.value, count=_COUNT.value,
                               extra=_EXTRA.value, keep=_KEEP.value, root=_ROOT.value,
                               names=_NAMES.value, against=_AGAINST.value)
  if args.against and args.demo:
    raise app.UsageError("--against compares metrics.json: it is for a predictions file")
  os.makedirs(args.data_dir, exist_ok=True)
  name = "imagenet_like.npz" if args.large else "digits.npz"
  data = os.path.join(args.data_dir, name)
  if not args.demo and not os.path.exists(data):
    (make_large if args.large else make_digits)(data)
  cache_dir = os.path.join(args.data_dir, "jax_cache_warm")
  roots = [args.against, args.root] if args.against else [args.root]
  for root in roots:
    print(f"{'demo' if args.demo else name}, cache {args.cache}, {root}, git {_revision(root)}")
  kept = {root: os.path.join(args.data_dir, f"metrics_{k}.json") for k, root in enumerate(roots)}
  for path in kept.values():  # a failed run must not leave an earlier run's file to compare
    if os.path.exists(path):
      os.remove(path)
  for i in range(args.runs):
    for root in roots:
      _one_run(args, i, data, cache_dir, root, kept[root] if args.against else args.keep,
               prefix=f"[{'against' if root == args.against else 'this'}] " if args.against
               else "")
  if args.against:
    same = all(map(os.path.exists, kept.values())) and same_metrics(list(kept.values()))
    print("metrics.json: " + ("the same to the bit" if same else "DIFFERENT (or missing)"))
    if args.keep and os.path.exists(kept[args.root]):
      shutil.copy(kept[args.root], args.keep)


def _revision(root: str) -> str:
  try:  # A copy of the tree without git (a device machine's) has no revision to name.
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                          capture_output=True).stdout.strip()
  except OSError:
    return "unknown"


def _one_run(args, i: int, data: str, cache_dir: str, root: str, keep: str,
             prefix: str = "") -> None:
  """One timed `eval.py` (or demo) process of checkout `root`, printed as one line."""
  python = sys.executable
  work = tempfile.mkdtemp(prefix="evalspeed_")
  env = dict(os.environ)
  if args.cache == "off":
    env["CALIB_JAX_COMPILATION_CACHE"] = "off"
  else:
    directory = cache_dir if args.cache == "warm" else os.path.join(work, "cache")
    env["CALIB_JAX_COMPILATION_CACHE"] = directory
  if args.demo:
    cmd = [python, "-m", "calib_jax.demo", f"--workdir={work}/demo"]
  else:
    cmd = [python, "eval.py", f"--predictions={data}", f"--workdir={work}"] + args.extra.split()
  load = _load()
  wall, rss, status, out, cpu = timed(cmd, env, root)
  line = (f"{prefix}run {i}: {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:.0f} MB, exit {status}, "
          f"load before {load}")
  if args.count and not args.demo:
    env["CALIB_JAX_BENCH_COUNTS"] = os.path.join(work, "counts.json")
    counted = [python, "-c", _COUNTING] + cmd[2:]
    if args.cache == "cold":
      shutil.rmtree(os.path.join(work, "cache"), ignore_errors=True)
    timed(counted, env, root)
    with open(env["CALIB_JAX_BENCH_COUNTS"]) as f:
      counts = json.load(f)
    line += (f"; programs {counts['compiled']} (cache hits {counts['cache_hits']}, "
             f"{counts['compile_seconds']:.1f} s; tracing and lowering "
             f"{counts['trace_lower_seconds']:.1f} s); loaded untraced from the program store "
             f"{counts.get('stored', 0)}")
    if args.names:
      line += "\n  " + "\n  ".join(f"{n} x{k}" for n, k in sorted(counts["names"].items()))
  print(line, flush=True)
  if status != 0 or i == 0:
    print(out if status else "\n".join(out.splitlines()[:3]))
  if keep and not args.demo and status == 0:
    shutil.copy(os.path.join(work, "eval_predictions", "metrics.json"), keep)
  shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
  app.run(main)
