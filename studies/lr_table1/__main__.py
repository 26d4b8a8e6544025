"""Label relaxation Table 1 (Fashion-MNIST) reproduced, with MbLS and ACLS on the same protocol.

    .venv/bin/python -m studies.lr_table1 [--workdir=workdirs/lr_table1] \
        [--out_dir=docs/results] [--seeds=0,1,2] [--max_minutes=M] [--report_only] \
        [--readme=README.md] [--sweeps [--max_members=N]] [--losses=maxsup,logitnorm]

With `--sweeps` (the 10-seed study: `--sweeps --seeds=0,1,2,3,4,5,6,7,8,9
--out_dir=docs/results/lr_table1_sweeps`) each tuning grid is one sweep over its values and each
final row one sweep over the seeds (`studies/lr_table1/sweeps.py`); the summaries, selection and
report are the same as the sequential runs'.

MaxSup and LogitNorm, beyond the paper's table, are tuned and run like LS and LR (alpha and
temperature on the hold-out, a row for accuracy and one for ECE). On the finished 10-seed study
only their runs are left; `--losses=maxsup,logitnorm` runs just those:

    .venv/bin/python -m studies.lr_table1 --sweeps --losses=maxsup,logitnorm \
        --seeds=0,1,2,3,4,5,6,7,8,9 --out_dir=docs/results/lr_table1_sweeps --max_members=5

Runs the configs of `studies/lr_table1/config.py` in the order of `run.plan`: the tuning grids
on a hold-out (seed 0), then for each tuned loss the value best for accuracy and the value best
for ECE, retrained on the whole training set and tested, on every seed; CE, CE + T (grid) and
ACLS (with and without the official clip) need no tuning. One run's summary is written to
`<out_dir>/lr_table1/<variant>/seed<k>.json` when it finishes; a run with a summary is never
redone (the summaries are committed, so the study continues across machines), and a run that
was interrupted resumes from its checkpoint in `--workdir`. `--max_minutes` stops starting new
runs after that long, so the study can be run in chunks. After each run the report
`<out_dir>/label_relaxation_table1.md` (`label_relaxation_table1_sweeps.md` with `--sweeps`)
and `<out_dir>/lr_table1_reliability.png` are rewritten
from every summary there is (`studies.lr_table1.report`); `--readme` also writes its summary
table into the README. Run from the repository root. Not a test: it trains models and prints
numbers.
"""
import os

from absl import app, flags, logging

from studies.lr_table1 import run

_WORKDIR = flags.DEFINE_string("workdir", os.path.join("workdirs", "lr_table1"),
                               "where the runs train (checkpoints, predictions)")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("docs", "results"),
                               "where the summaries, the report and its figure go")
_SEEDS = flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds of the final runs")
_MAX_MINUTES = flags.DEFINE_float("max_minutes", 0.0,
                                  "stop starting new runs after this long; 0 = no limit")
_REPORT_ONLY = flags.DEFINE_boolean("report_only", False,
                                    "rewrite the report from the summaries; train nothing")
_SWEEPS = flags.DEFINE_boolean(
    "sweeps", False, "run the plan as sweeps (studies/lr_table1/sweeps.py): each tuning grid "
    "one sweep over its values, each final row one sweep over --seeds")
_MAX_MEMBERS = flags.DEFINE_integer(
    "max_members", 0, "with --sweeps, run a final row's seeds in sweeps of at most this many "
    "members (0: all seeds in one sweep), so that each sweep finishes within a working session "
    "whose machine does not outlive it (the checkpoints stay in --workdir)")
_LOSSES = flags.DEFINE_list(
    "losses", [], "run only these losses' tuning grids and final rows, e.g. maxsup,logitnorm "
    "(the rows added to the finished study); empty: the whole plan. Valid: "
    + ", ".join(run.study_config.GRIDS))
_README = flags.DEFINE_string("readme", "", "also write the summary table into this file "
                              "between its lr_table1 markers (README.md)")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in _SEEDS.value.split(",") if s]
  unknown = sorted(set(_LOSSES.value) - set(run.study_config.GRIDS))
  if unknown:
    raise app.UsageError(f"--losses: unknown {', '.join(unknown)}; valid: "
                         f"{', '.join(run.study_config.GRIDS)}")
  return run.run_study(_WORKDIR.value, _OUT_DIR.value, seeds, _MAX_MINUTES.value,
                       _REPORT_ONLY.value, _README.value, sweeps=_SWEEPS.value,
                       max_members=_MAX_MEMBERS.value, losses=tuple(_LOSSES.value))


if __name__ == "__main__":
  app.run(main)
