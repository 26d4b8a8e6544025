"""Evaluates a trained run: calibration and selective-classification metrics, before and after
temperature scaling, written to `<workdir>/eval_<split>/metrics.json` with plots.

    python eval.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \
        [--split=test] [--step=N]
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from calib_jax.training import config_validation, evaluate

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/default.py", "The config the run was trained with.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Work directory of the trained run.",
                               required=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["test", "val"], "Split to report.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: newest).")


def main(argv: list[str]) -> None:
  """Entry point: restores the checkpoint and writes metrics and plots."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    results = evaluate.evaluate_run(_CONFIG.value, _WORKDIR.value, split=_SPLIT.value,
                                    step=_STEP.value)
  except (config_validation.ConfigError, FileNotFoundError) as e:
    logging.error("%s", e)
    sys.exit(f"eval.py: {e}")
  print(evaluate.format_table(results))


if __name__ == "__main__":
  app.run(main)
