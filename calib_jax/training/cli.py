"""Command-line flags shared by `train.py` and `eval.py`.

Both programs take `--config=path.py[:variant]` (with `--config.field=value` overrides) and
`--workdir`; defining them once lets both entry points live in one process (tests, notebooks).
"""
from absl import app, flags
from ml_collections import config_flags

CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/default.py",
    "Config file (`file.py` or `file.py:variant`); override fields with --config.field=value.",
    lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "Work directory: checkpoints, metrics, logs.")


def workdir() -> str:
  """The `--workdir` value; a usage error when it is missing."""
  if not WORKDIR.value:
    raise app.UsageError("--workdir is required")
  return WORKDIR.value
