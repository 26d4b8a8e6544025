"""Trains a model from an ml_collections config (resuming from the work directory if possible).

    python train.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \
        [--config.data.batch_size=256 ...]

Running the same command again after an interruption continues from the newest checkpoint.
SIGTERM (a preemption notice) finishes the step in flight, saves it, prints one line and exits
with status 75 (EX_TEMPFAIL); see `calib_jax/training/preemption.py`.
The console shows the progress bar and the validation results; library logs go to
`<workdir>/log.txt` (`--verbosity=0` or `--alsologtostderr` shows them on stderr as well).

Before renting a TPU slice or GPUs, `python -m calib_jax.dry_run --config=... --topology=v5e:2x4`
compiles this config's steps for them and says whether they fit (docs/accelerators.md).
"""
import sys

# First: quiets TensorFlow's C++ log, which only works before TensorFlow is imported.
from calib_jax.training import console  # isort: skip

from absl import app, logging  # pylint: disable=g-import-not-at-top

from calib_jax.data.checks import DataError
from calib_jax.training import builders, checkpoint, cli, config_validation, loop, preemption
from calib_jax.training import reporting


def main(argv: list[str]) -> None:
  """Entry point: validates the config, then trains."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdir = cli.workdir()
  try:
    console.setup(workdir)
  except OSError as e:  # Before anything is built: the work directory cannot be written.
    sys.exit(f"train.py: work directory {workdir} is not writable ({e.strerror or e})")
  try:
    loop.train_and_evaluate(cli.CONFIG.value, workdir)
  except (config_validation.ConfigError, builders.WeightFileError, loop.NonFiniteLossError,
          checkpoint.UnreadableCheckpointError, DataError, FileNotFoundError,
          reporting.WorkdirError) as e:
    logging.error("%s", e)
    sys.exit(f"train.py: {e}")
  except preemption.Preempted as e:
    print(f"train.py: {e}", file=sys.stderr, flush=True)
    sys.exit(preemption.PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
