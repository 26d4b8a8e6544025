"""Trains a model from an ml_collections config (resuming from the work directory if possible).

    python train.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \
        [--config.data.batch_size=256 ...]

Running the same command again after an interruption continues from the newest checkpoint.
The console shows the progress bar and the validation results; library logs go to
`<workdir>/log.txt` (`--verbosity=0` or `--alsologtostderr` shows them on stderr as well).
"""
import sys

# First: quiets TensorFlow's C++ log, which only works before TensorFlow is imported.
from calib_jax.training import console  # isort: skip

from absl import app, logging  # pylint: disable=g-import-not-at-top

from calib_jax.training import builders, cli, config_validation, loop


def main(argv: list[str]) -> None:
  """Entry point: validates the config, then trains."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdir = cli.workdir()
  console.setup(workdir)
  try:
    loop.train_and_evaluate(cli.CONFIG.value, workdir)
  except (config_validation.ConfigError, builders.WeightFileError, loop.NonFiniteLossError,
          FileNotFoundError) as e:
    logging.error("%s", e)
    sys.exit(f"train.py: {e}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
