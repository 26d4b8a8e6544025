"""Where the test suite's time goes: a pytest plugin that records each test's wall time, CPU
time (its own process's and its finished child processes') and JAX's tracing, lowering and
compiling seconds, and a summary of those records by module.

    PYTHONPATH=bench CALIB_JAX_SUITE_PROFILE=/tmp/suite CALIB_JAX_TESTS_COMPILER=fast \\
        .venv/bin/python -m pytest -p suite_profile -n 2 --dist worksteal -q tests \\
        --ignore=tests/test_dry_run.py -m "not exact_across_programs"   # make test's first pass
    .venv/bin/python bench/suite_profile.py --records=/tmp/suite [--top_modules=30] [--top_tests=20]

Each pytest process (each xdist worker) appends one JSON line per test to
`$CALIB_JAX_SUITE_PROFILE/<pid>.jsonl`. The JAX seconds are the durations JAX reports through
`jax.monitoring` (`/jax/core/compile/jaxpr_trace_duration`, `.../jaxpr_to_mlir_module_duration`,
`.../backend_compile_duration`) in the test's process; programs a test starts are counted in
its children's CPU only. "rest" is the process's CPU less those three: running the programs,
tf.data, checkpoints, the tests' own Python.
"""
import collections
import glob
import json
import os
import time

import pytest
from absl import app, flags

RECORDS = flags.DEFINE_string("records", None, "the folder the plugin wrote its records to")
TOP_MODULES = flags.DEFINE_integer("top_modules", 30, "modules shown, most CPU first")
TOP_TESTS = flags.DEFINE_integer("top_tests", 20, "tests shown, most CPU first")

ENV = "CALIB_JAX_SUITE_PROFILE"
JAX_EVENTS = {"trace": "/jax/core/compile/jaxpr_trace_duration",
              "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "compile": "/jax/core/compile/backend_compile_duration"}
MEASURED = ("wall", "cpu", "children", *JAX_EVENTS)  # each test's record, beside its id
COLUMNS = (*MEASURED, "rest")


def summarize(rows: list[dict]) -> tuple[dict[str, dict], dict]:
  """Sums the records by module (the part of the test id before `::`): {module: {"tests": n,
  column: seconds}}, and the totals over all of them."""
  modules = collections.defaultdict(collections.Counter)
  for row in rows:
    module = modules[row["id"].split("::")[0]]
    module["tests"] += 1
    for column in MEASURED:
      module[column] += row[column]
    module["rest"] += row["cpu"] - sum(row[name] for name in JAX_EVENTS)
  totals = collections.Counter()
  for module in modules.values():
    totals.update(module)
  return {name: dict(m) for name, m in modules.items()}, dict(totals)


def read(directory: str) -> list[dict]:
  paths = glob.glob(os.path.join(directory, "*.jsonl"))
  if not paths:
    raise SystemExit(f"suite_profile: no *.jsonl records in {directory!r}: run pytest with "
                     f"-p suite_profile and {ENV}={directory} first")
  return [json.loads(line) for path in paths for line in open(path, encoding="utf-8")]


def _table(rows: dict[str, dict], first: str) -> list[str]:
  lines = [f"{first:52s} {'tests':>5} " + " ".join(f"{c:>8}" for c in COLUMNS)]
  for name, row in rows.items():
    lines.append(f"{name:52s} {row['tests']:5d} "
                 + " ".join(f"{row.get(c, 0.0):8.1f}" for c in COLUMNS))
  return lines


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not RECORDS.value:
    raise app.UsageError("--records=DIR is required (the folder the plugin wrote)")
  rows = read(RECORDS.value)
  modules, totals = summarize(rows)
  by_cpu = sorted(modules.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["children"]))
  print("\n".join(_table(dict(by_cpu[:TOP_MODULES.value]), "module (seconds)")))
  print("\n".join(_table({"all": totals}, "")[1:]))
  own = totals["cpu"]
  print("of the tests' own CPU: " + ", ".join(
      f"{c} {100 * totals[c] / own:.0f} %" for c in (*JAX_EVENTS, "rest")))
  print(f"\n{'cpu':>8} {'children':>8} {'wall':>8}  test")
  for row in sorted(rows, key=lambda r: -(r["cpu"] + r["children"]))[:TOP_TESTS.value]:
    print(f"{row['cpu']:8.1f} {row['children']:8.1f} {row['wall']:8.1f}  {row['id']}")


# The pytest plugin (`-p suite_profile`; records only with $CALIB_JAX_SUITE_PROFILE set).
_jax_seconds = collections.Counter()
_out = None


def _on_duration(event: str, duration: float, **unused) -> None:
  _jax_seconds[event] += duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Around each test's setup, call and teardown."""
  del nextitem
  global _out
  if not os.environ.get(ENV):
    yield
    return
  if _out is None:  # The first test: the test run's conftest has set up and imported jax.
    import jax  # pylint: disable=g-import-not-at-top
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    os.makedirs(os.environ[ENV], exist_ok=True)
    path = os.path.join(os.environ[ENV], f"{os.getpid()}.jsonl")
    _out = open(path, "a", encoding="utf-8", buffering=1)  # pylint: disable=consider-using-with
  _jax_seconds.clear()
  before, start = os.times(), time.perf_counter()
  yield
  after = os.times()
  _out.write(json.dumps(dict(
      id=item.nodeid, wall=time.perf_counter() - start,
      cpu=after.user - before.user + after.system - before.system,
      children=(after.children_user - before.children_user
                + after.children_system - before.children_system),
      **{name: _jax_seconds[event] for name, event in JAX_EVENTS.items()})) + "\n")


if __name__ == "__main__":
  app.run(main)
