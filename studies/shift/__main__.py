"""Calibration under distribution shift, Fashion-MNIST (issue: "the question the papers left
open"): `python -m studies.shift [--phase=train|eval|report|all] [--rows=ce,ls,...]`.

1. train: each row of `studies/shift/config.py` as one 5-seed sweep in
   `<workdir>/<row>` (resumes from its checkpoint; a finished sweep is not retrained);
2. eval: every member of every row, and the CE, MbLS and LR deep ensembles, under rotation
   (0-180 degrees) and the corruptions at the CIFAR-10-C table's severities, through
   `eval.py`'s own shift evaluation (resumable cell by cell);
3. report: docs/results/shift_study.md, its figures and the README's summary
   (`studies.shift.report`).

Run from the repository root, as a background job: it trains 30 MLPs for 50 epochs each and
evaluates each under 13 rotations and 75 corruption cells. Not a test.
"""
import os
import time

from absl import app, flags, logging

from studies.shift import config as study_config
from studies.shift import run

_WORKDIR = flags.DEFINE_string("workdir", os.path.join("workdirs", "shift"), "runs go here")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("docs", "results"), "the report's folder")
_PHASE = flags.DEFINE_enum("phase", "all", ["train", "eval", "report", "all"], "what to run")
_ROWS = flags.DEFINE_list("rows", list(study_config.ROWS), "rows of studies/shift/config.py")
_README = flags.DEFINE_string("readme", "", "also write the summary into this README")


def train(rows: list[str], workdir: str) -> None:
  """Trains each row's sweep (resuming an interrupted one; a finished one returns at once)."""
  from calib_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from calib_jax.run import loop  # pylint: disable=import-outside-toplevel
  for row in rows:
    start = time.monotonic()
    config = config_lib.load_config_file(f"{study_config.__file__}:{row}")
    loop.train_and_evaluate(config, os.path.abspath(os.path.join(workdir, row)))
    print(f"row {row}: trained ({time.monotonic() - start:.0f} s this session; "
          f"load {os.getloadavg()[0]:.1f})", flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  unknown = [r for r in _ROWS.value if r not in study_config.ROWS]
  if unknown:
    raise app.UsageError(f"unknown rows {unknown}; valid: {', '.join(study_config.ROWS)}")
  if _PHASE.value in ("train", "eval", "all"):
    # Before hours of training, not when the eval phase reaches frost.
    problems = run.corruption_problems()
    if problems:
      raise app.UsageError(f"the eval phase cannot run: {'; '.join(problems)}")
  if _PHASE.value in ("train", "all"):
    train(_ROWS.value, _WORKDIR.value)
  if _PHASE.value in ("eval", "all"):
    run.evaluate_rows(_ROWS.value, _WORKDIR.value, _OUT_DIR.value)
  if _PHASE.value in ("report", "all"):
    from studies.shift import report  # pylint: disable=import-outside-toplevel
    report.write_report(_WORKDIR.value, _OUT_DIR.value, _README.value)


if __name__ == "__main__":
  app.run(main)
