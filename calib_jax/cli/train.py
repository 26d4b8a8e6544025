"""Trains a model from an ml_collections config (resuming from the work directory if possible).

    calib-jax-train --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \\
        [--config.data.batch_size=256 ...]

(`python train.py ...` in a source checkout, `python -m calib_jax.cli.train ...` anywhere.)
Running the same command again after an interruption continues from the newest checkpoint;
without `--config`, a work directory's run continues with its own saved `config.json`
(`--config.field=value` overrides apply to it), and a `--config` whose model or optimiser does not
fit the run's checkpoint is refused in one line naming the differing fields.
SIGTERM (a preemption notice) finishes the step in flight, saves it, prints one line and exits
with status 75 (EX_TEMPFAIL); see `calib_jax/run/preemption.py`.
The console shows the progress bar and the validation results; library logs go to
`<workdir>/log.txt` (`--verbosity=0` or `--alsologtostderr` shows them on stderr as well).
Before paying for a TPU slice or GPUs, `python -m calib_jax.dry_run --config=... --topology=...`
compiles this config's train step for them and says whether it fits and how fast it would run.
"""
import sys

from absl import app, logging

from calib_jax.cli import compilation_cache, console, flags
from calib_jax.config import ConfigError


def main(argv: list[str]) -> None:
  """absl's main: builds and trains the `--config` run in `--workdir`."""
  # Deferred: these import TensorFlow, or JAX (with orbax and tensorstore), whose native logging
  # must start after `run` has set TensorFlow's log level and imported it quietly
  # (`console.quiet_native_logs`): with JAX imported first, tf.data's C++ warnings reach the
  # console (seen with `eval.py`).
  from calib_jax.cli import run_config
  from calib_jax.training import checkpoint, reporting
  from calib_jax.data.checks import DataError
  from calib_jax.experiment import WeightFileError
  from calib_jax.run import loop, preemption
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdir = flags.workdir()
  try:
    console.setup(workdir)
  except OSError as e:  # Before anything is built: the work directory cannot be written.
    sys.exit(f"train.py: work directory {workdir} is not writable ({e.strerror or e})")
  try:
    saved = run_config.saved_config(workdir)  # read before training rewrites it
    config, _ = run_config.config_for(workdir)
    loop.train_and_evaluate(config, workdir)
  except checkpoint.CheckpointMismatchError as e:
    logging.error("%s", e)
    sys.exit(f"train.py: {run_config.mismatch_line(workdir, saved, config, e, evaluating=False)}")
  except (ConfigError, WeightFileError, loop.NonFiniteLossError,
          checkpoint.UnreadableCheckpointError, DataError, FileNotFoundError,
          reporting.WorkdirError) as e:
    logging.error("%s", e)
    sys.exit(f"train.py: {e}")
  except preemption.Preempted as e:
    print(f"train.py: {e}", file=sys.stderr, flush=True)
    sys.exit(preemption.PREEMPTED_EXIT_CODE)


def run() -> None:
  """The program: quiet native logs, flags, then `main` under absl."""
  console.quiet_native_logs(sys.argv)
  compilation_cache.enable()
  flags.define(sys.argv)
  app.run(main, flags_parser=flags.parse_flags)


if __name__ == "__main__":
  run()
