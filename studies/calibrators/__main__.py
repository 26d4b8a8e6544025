"""Post-hoc calibrators and conformal sets after each training loss (Fashion-MNIST).

    .venv/bin/python -m studies.calibrators [--workdir=workdirs/calibrators] [--seeds=0] \
        [--out_dir=docs/results] [--models=CE,LS,LR,MbLS,ACLS] [--train_only]

Trains the models of `studies.calibrators.run.MODELS` (resuming interrupted runs; a model whose
logits file exists is not retrained), then evaluates each with `calib_jax.evaluate_predictions`
and writes `<out_dir>/calibrators.md`. Run from the repository root. Not a test: it trains
models (about 10 minutes each on 2 CPU cores).
"""
import os

from absl import app, flags, logging

from studies.calibrators import run

_WORKDIR = flags.DEFINE_string("workdir", os.path.join("workdirs", "calibrators"),
                               "where the models train and their logits are kept")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("docs", "results"),
                               "where the report goes")
_SEEDS = flags.DEFINE_string("seeds", "0", "comma-separated seeds")
_MODELS = flags.DEFINE_list("models", [name for name, _ in run.MODELS],
                            "which models to train (the report keeps the committed numbers of "
                            "the others)")
_TRAIN_ONLY = flags.DEFINE_boolean("train_only", False, "train and keep logits; no report")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in _SEEDS.value.split(",") if s]
  unknown = [m for m in _MODELS.value if m not in dict(run.MODELS)]
  if unknown:
    raise app.UsageError(f"--models: unknown model {unknown[0]!r}; valid: "
                         f"{','.join(dict(run.MODELS))}")
  for seed in seeds:
    for name, variant in run.MODELS:
      if name not in _MODELS.value:
        continue
      print(f"{name} seed {seed}: {run.train_and_dump(_WORKDIR.value, name, variant, seed)}",
            flush=True)
  if _TRAIN_ONLY.value:
    return 0
  from studies.calibrators import report
  print(report.write(_WORKDIR.value, _OUT_DIR.value, seeds), flush=True)
  return 0


if __name__ == "__main__":
  app.run(main)
