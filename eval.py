"""Evaluates a trained run: calibration and selective-classification metrics, before and after
temperature scaling, written to `<workdir>/eval_<split>/metrics.json` with plots.

    python eval.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \
        [--split=test] [--step=N]

The console shows the results table; library logs go to `<workdir>/log.txt` (`--verbosity=0`
or `--alsologtostderr` shows them on stderr as well).
"""
import os
import sys

# First: quiets TensorFlow's C++ log, which only works before TensorFlow is imported.
from calib_jax.training import console  # isort: skip

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

from calib_jax.training import cli, config_validation, evaluate

_SPLIT = flags.DEFINE_enum("split", "test", ["test", "val"], "Split to report.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: newest).")


def main(argv: list[str]) -> None:
  """Entry point: restores the checkpoint, writes metrics and plots, prints a summary."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdir = cli.workdir()
  if not os.path.isdir(workdir):
    sys.exit(f"eval.py: work directory {workdir} not found; train into it with train.py first.")
  console.setup(workdir)
  try:
    results = evaluate.evaluate_run(cli.CONFIG.value, workdir, split=_SPLIT.value,
                                    step=_STEP.value)
  except (config_validation.ConfigError, FileNotFoundError) as e:
    logging.error("%s", e)
    sys.exit(f"eval.py: {e}")
  print(evaluate.format_table(results))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
