"""Command-line flags shared by `train.py` and `eval.py`.

Both programs take `--config=path.py[:variant]` (with `--config.field=value` overrides) and
`--workdir`; defining them once lets both entry points live in one process (tests, notebooks).
"""
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from calib_jax.training import config as config_lib

DEFAULT_CONFIG = "configs/default.py"


def _config_error_line(argv: list[str], error: Exception) -> str:
  """The one-line reason why `--config=` / `--config.*=` of `argv` failed to load."""
  specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  spec = specs[-1] if specs else DEFAULT_CONFIG  # absl keeps the last --config=
  try:
    config = config_lib.load_config_file(spec)
  except (config_lib.ConfigError, ValueError, OSError) as e:
    return str(e).splitlines()[0]
  for arg in argv[1:]:
    if arg.startswith("--config."):
      dotted = arg[len("--config."):].split("=")[0]
      message = config_lib.unknown_field_message(config, dotted)
      if message:
        return message
      group = config_lib.group_fields(config, dotted)
      if group:
        return (f"config field {dotted!r} is a group of fields ({', '.join(group)}); set one "
                f"of them, e.g. --config.{dotted}.{'name' if 'name' in group else group[0]}=...")
  return (str(error).splitlines() or [type(error).__name__])[0]


try:
  # With the default file, absl parses the default (and applies the `--config.*` overrides of
  # sys.argv) right here, at import: a bad override must already be one line here.
  CONFIG = config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG,
      "Config file (`file.py` or `file.py:variant`); override fields with "
      "--config.field=value (e.g. --config.optimizer.learning_rate=0.01).",
      # The config files lock themselves (`config.base_config`) except the free-form dicts;
      # accepting new attributes lets `--config.data.options.download=False` add a key to one
      # of those (parsed as a Python literal), while a new name anywhere else still fails on
      # the locked config and gets the one-line "did you mean" below.
      lock_config=False, accept_new_attributes=True)
except (flags.Error, AttributeError, KeyError, ValueError, TypeError, OSError) as _error:
  sys.exit(f"{os.path.basename(sys.argv[0])}: {_config_error_line(sys.argv, _error)}")
WORKDIR = flags.DEFINE_string("workdir", None,
                              "Work directory: checkpoints, metrics, the log (log.txt).")


def workdir() -> str:
  """The `--workdir` value; a usage error when it is missing."""
  if not WORKDIR.value:
    raise app.UsageError("--workdir is required")
  return WORKDIR.value


def parse_flags(argv: list[str]) -> list[str]:
  """`app.run`'s flag parser with user mistakes as one line on stderr and exit status 1.

  ml_collections raises a bare AttributeError (a traceback) for an override of a field the
  config does not have, e.g. `--config.lr=0.1`; this names the field and the likely one.
  """
  try:
    remaining = flags.FLAGS(argv)
    # config_flags defers some load errors (a missing file) to the first attribute access.
    CONFIG.value.keys()
    return remaining
  except (flags.Error, AttributeError, KeyError, ValueError, TypeError, OSError) as e:
    sys.exit(f"{os.path.basename(argv[0])}: {_config_error_line(argv, e)}")

