"""Evaluates a trained run: calibration and selective-classification metrics, before and after
temperature scaling, written to `<workdir>/eval_<split>/metrics.json` with plots.

    python eval.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \
        [--split=test] [--step=N]

With `--weights=FILE` (our variables file, or a torchvision / timm .pth/.pt/.bin/.safetensors
state dict of the config's model) those weights are evaluated instead of a checkpoint: no
training run is needed, the workdir only receives the results.

The console shows the results table; library logs go to `<workdir>/log.txt` (`--verbosity=0`
or `--alsologtostderr` shows them on stderr as well).
"""
import os
import sys

# First: quiets TensorFlow's C++ log, which only works before TensorFlow is imported.
from calib_jax.training import console  # isort: skip

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

from calib_jax.data.checks import DataError
from calib_jax.training import builders, checkpoint, cli, config_validation, evaluate
from calib_jax.training import reporting

_SPLIT = flags.DEFINE_enum("split", "test", ["test", "val"], "Split to report.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: newest).")
_WEIGHTS = flags.DEFINE_string(
    "weights", None, "Weight file to evaluate instead of the workdir's checkpoint: our variables "
    "file or a PyTorch .pth/.pt/.bin/.safetensors state dict of the config's model.")


def main(argv: list[str]) -> None:
  """Entry point: restores the checkpoint (or reads --weights), writes metrics and plots,
  prints a summary."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _WEIGHTS.value and _STEP.value is not None:
    raise app.UsageError("--step picks a checkpoint; it cannot go with --weights")
  workdir = cli.workdir()
  if _WEIGHTS.value:
    resolved = os.path.abspath(os.path.expanduser(_WEIGHTS.value))
    if not os.path.isfile(resolved):  # Before the workdir is made for the results.
      sys.exit(f"eval.py: weights={_WEIGHTS.value!r}: no such file ({resolved})")
    os.makedirs(workdir, exist_ok=True)  # It only receives the results.
  elif not os.path.isdir(workdir):
    sys.exit(f"eval.py: work directory {workdir} not found; train into it with train.py first "
             "(or evaluate a weight file with --weights=FILE).")
  try:
    console.setup(workdir)
  except OSError as e:  # Before anything is built: the work directory cannot be written.
    sys.exit(f"eval.py: work directory {workdir} is not writable ({e.strerror or e})")
  try:
    results = evaluate.evaluate_run(cli.CONFIG.value, workdir, split=_SPLIT.value,
                                    step=_STEP.value, weights=_WEIGHTS.value)
  except (config_validation.ConfigError, builders.WeightFileError,
          checkpoint.UnreadableCheckpointError, DataError, FileNotFoundError,
          reporting.WorkdirError) as e:
    logging.error("%s", e)
    sys.exit(f"eval.py: {e}")
  print(evaluate.format_table(results))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
