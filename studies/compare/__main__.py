"""Loss comparison on offline data: every loss of `studies/compare/config.py` on several seeds.

    .venv/bin/python -m studies.compare --out_dir=docs/results \
        [--workdir=workdirs/compare] [--seeds=0,1,2] [--datasets=fashion_mnist,clutter_objects] \
        [--losses=ce,mbls,acls]

Each run trains into `<workdir>/<dataset>/<loss>/seed<k>` with the library's own
`train_and_evaluate` and is evaluated with `evaluate_run` (temperature and p-norm fitted on the
validation split, metrics on the test split). A run whose `eval_test/metrics.json` exists is not
retrained (delete its directory to redo it), so an interrupted study continues where it stopped.

Writes to `--out_dir`:
* `compare.md`: per dataset, mean ± std over seeds (sample std) of accuracy, ECE, AECE,
  classwise ECE, NLL before and after temperature scaling, the fitted T, the selective metrics
  (AURC, E-AURC, coverage at 5 % risk) of MSP, max logit and max-logit p-norm, context-only
  confidence where evaluated, and the papers' claims checked seed by seed;
* `reliability_<dataset>.png`: CE vs MbLS vs ACLS reliability diagrams (first seed), PreT.
Run from the repository root. Not a test: it trains models and prints numbers.
"""
import os
import sys
import time

from absl import app, flags, logging

from studies.compare import config as study_config
from studies.compare.report import write_report
from studies.compare.run import Results, train_and_evaluate_cell

_WORKDIR = flags.DEFINE_string("workdir", os.path.join("workdirs", "compare"),
                               "where the runs train (checkpoints, metrics.json)")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "report directory (default: workdir)")
_SEEDS = flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds")
_DATASETS = flags.DEFINE_string("datasets", "fashion_mnist,clutter_objects",
                                "comma-separated datasets of `LOSSES` in the config")
_LOSSES = flags.DEFINE_string("losses", "", "subset of losses (default: all)")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in _SEEDS.value.split(",") if s]
  datasets = [d for d in _DATASETS.value.split(",") if d]
  wanted = [loss for loss in _LOSSES.value.split(",") if loss]
  for dataset in datasets:
    if dataset not in study_config.LOSSES:
      raise app.UsageError(f"unknown dataset {dataset!r}; valid: "
                           f"{', '.join(study_config.LOSSES)}")
  start = time.monotonic()
  all_runs: dict[str, dict[str, list[Results]]] = {}
  for dataset in datasets:
    losses = [loss for loss in study_config.LOSSES[dataset] if not wanted or loss in wanted]
    for loss in losses:
      for seed in seeds:
        tick = time.monotonic()
        results = train_and_evaluate_cell(_WORKDIR.value, dataset, loss, seed)
        results["seed"] = seed
        all_runs.setdefault(dataset, {}).setdefault(loss, []).append(results)
        if "diverged" in results:
          summary = results["diverged"].splitlines()[0]
        else:
          pre = results["pre_temperature"]
          summary = f"acc {pre['accuracy']:.4f} ECE {pre['ece']:.4f} AURC {pre['aurc']:.4f}"
        print(f"{dataset:<16}{loss:<12}seed {seed}: {summary} "
              f"({time.monotonic() - tick:.0f} s)", flush=True)
  command = "python -m studies.compare " + " ".join(sys.argv[1:])
  text = write_report(_WORKDIR.value, _OUT_DIR.value or _WORKDIR.value, all_runs, seeds,
                      command.strip())
  print(f"({time.monotonic() - start:.0f} s for this invocation)")
  print("\n" + text)
  return 0


if __name__ == "__main__":
  app.run(main)
