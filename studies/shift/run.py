"""The shift study's evaluation phase (`python -m studies.shift --phase=eval`).

For each trained row (`studies/shift/config.py`), each sweep member is evaluated under the two
shifts through eval.py's own evaluation (`evaluation.run.evaluate_run` with `eval.shift`), and
the CE, MbLS and LR rows' 5 members also as one deep ensemble (`evaluate_ensemble`):

* `rotate`: Ovadia et al.'s rotated images, 0-180 degrees in 15-degree steps;
* `corruptions`: the 15 benchmark corruptions at severities 1-5 with the CIFAR-10-C table
  (`eval.shift_table = 'cifar10'`), the 28x28 grey images corrupted as 3 equal channels.

Each model's `results["shift"]` is written to `<out_dir>/shift/<row>/<kind>/member<i>.json` (or
`ensemble.json`) as it completes; these small files are committed, so the study continues across
machines; a model with a file is not evaluated again, and eval.py's own progress file
(`shift_progress.json`) resumes a model interrupted half-way. frost needs imagecorruptions'
textures (`pip install imagecorruptions-imaug`).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from studies.shift import config as study_config

SHIFTS = {"rotate": "rotate", "corruptions": "all"}
TABLE = "cifar10"


def corruption_problems() -> list[str]:
  """One line per corruption of the eval phase this installation cannot run (frost needs the
  reference package's textures); `__main__` checks it before the train phase."""
  from calib_jax import shift  # pylint: disable=import-outside-toplevel
  return shift.requirement_problems(shift.parse_spec(SHIFTS["corruptions"]).corruptions)


def result_path(out_dir: str, row: str, kind: str, member: int | None) -> str:
  """Where one model's `results["shift"]` goes (member None: the row's ensemble)."""
  name = "ensemble.json" if member is None else f"member{member}.json"
  return os.path.join(out_dir, "shift", row, kind, name)


def _trained(path: str) -> bool:
  """A finished sweep: its end writes `sweep.json` (the members' final results)."""
  return os.path.exists(os.path.join(path, "sweep.json"))


def _write(path: str, results: dict[str, Any], seconds: float) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  record = {"shift": results["shift"], "seconds": round(seconds, 1),
            "load": os.getloadavg()[0], "step": results.get("step")}
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
  os.replace(path + ".tmp", path)


def evaluate_rows(rows: list[str], workdir: str, out_dir: str) -> None:
  """Evaluates every trained row's members (and ensembles) under both shifts; skips what is
  done and rows still training."""
  from calib_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from calib_jax.evaluation import run as evaluate  # pylint: disable=import-outside-toplevel
  for row in rows:
    path = os.path.abspath(os.path.join(workdir, row))
    config = config_lib.load_config_file(f"{study_config.__file__}:{row}")
    if not _trained(path):
      print(f"row {row}: not trained yet; skipped", flush=True)
      continue
    config.eval.shift_table = TABLE
    for kind, spec in SHIFTS.items():
      config.eval.shift = spec
      for member in range(len(study_config.SEEDS)):
        out = result_path(out_dir, row, kind, member)
        if os.path.exists(out):
          continue
        start = time.monotonic()
        results = evaluate.evaluate_run(config, path, member=member)
        _write(out, results, time.monotonic() - start)
        print(f"row {row} member {member} {kind}: {time.monotonic() - start:.0f} s", flush=True)
      out = result_path(out_dir, row, kind, None)
      if row in study_config.ENSEMBLE_ROWS and not os.path.exists(out):
        start = time.monotonic()
        results = evaluate.evaluate_ensemble(config, path)
        _write(out, results, time.monotonic() - start)
        print(f"row {row} ensemble {kind}: {time.monotonic() - start:.0f} s", flush=True)
