"""`make demo` on several seeds, checked against the targets the README states for it.

    .venv/bin/python -m studies.demo_targets [--seeds=0,1,2] [--workdir=workdirs/demo_seeds]

Runs `python -m calib_jax.demo --seed=k` (CE, MbLS, ACLS on `configs/default.py`) once per seed,
each in a fresh process and work directory (so each wall time includes start-up, data
preparation and compilation), then prints every number of `summary.json` as mean ± std over
the seeds and whether the targets hold:

* CE is over-confident: test ECE >= 5 %, mean confidence above accuracy, fitted T >= 1.2;
* each calibration loss: ECE at most half of CE's, accuracy within 1.5 points of CE's (means);
* one `make demo` run takes at most 5 minutes of wall time.

Run from the repository root. Not a test: it trains models and prints numbers (about 30 s of
CPU time per seed, 2-3 minutes of wall time on 2 cores shared with background jobs).
"""
import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags, logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SEEDS = flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds, one demo run each")
_WORKDIR = flags.DEFINE_string("workdir", os.path.join("workdirs", "demo_seeds"),
                               "each seed's run goes to <workdir>/seed<k>")


def run_seed(seed: int, workdir: str) -> tuple[dict, float]:
  """One demo run in its own process: (summary.json, wall seconds)."""
  out = os.path.join(workdir, f"seed{seed}")
  start = time.monotonic()
  subprocess.run([sys.executable, "-m", "calib_jax.demo", f"--workdir={out}", f"--seed={seed}"],
                 cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  seconds = time.monotonic() - start
  with open(os.path.join(out, "summary.json")) as f:
    return json.load(f)["variants"], seconds


def mean_std(values: list[float]) -> str:
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return f"{statistics.mean(values):.4f} ± {std:.4f}"


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in _SEEDS.value.split(",")]
  summaries, walls = [], []
  for seed in seeds:
    summary, seconds = run_seed(seed, _WORKDIR.value)
    summaries.append(summary)
    walls.append(seconds)
    print(f"seed {seed}: {seconds:.0f} s wall; " + "; ".join(
        f"{name} acc {s['accuracy']:.4f} ECE {s['ece']:.4f} T {s['temperature']:.2f}"
        for name, s in summary.items()), flush=True)

  names = list(summaries[0])
  keys = list(summaries[0][names[0]])
  print(f"\n{len(seeds)} seeds, mean ± std")
  print("| variant | " + " | ".join(keys) + " |")
  print("|---|" + "---:|" * len(keys))
  for name in names:
    print(f"| {name} | " + " | ".join(mean_std([s[name][k] for s in summaries])
                                      for k in keys) + " |")

  def mean(name: str, key: str) -> float:
    return statistics.mean(s[name][key] for s in summaries)

  checks = [
      ("CE ECE >= 5 %", mean("ce", "ece") >= 0.05),
      ("CE mean confidence > accuracy",
       mean("ce", "average_confidence") > mean("ce", "accuracy")),
      ("CE fitted T >= 1.2", mean("ce", "temperature") >= 1.2),
      ("demo wall time <= 5 min (slowest seed)", max(walls) <= 300),
  ]
  for name in names:
    if name != "ce":
      checks.append((f"{name} ECE <= half of CE's", mean(name, "ece") <= mean("ce", "ece") / 2))
      checks.append((f"{name} accuracy within 1.5 points of CE's",
                     abs(mean(name, "accuracy") - mean("ce", "accuracy")) <= 0.015))
  print(f"\nwall time per demo run: {', '.join(f'{w:.0f} s' for w in walls)}")
  for label, ok in checks:
    print(f"{'PASS' if ok else 'FAIL'}  {label}")
  return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
  app.run(main)
