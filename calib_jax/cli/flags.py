"""Command-line flags shared by the entry points (`train.py`, `eval.py`, the dry run).

Each program takes `--config=path.py[:variant]` (with `--config.field=value` overrides) and
`--workdir`. `define(argv)` defines them, once per process, when an entry point starts (never at
import): absl's config flag loads its default file and applies the `--config.*` overrides of the
command line right there, so a user mistake must already be one line then. A `--config=` path
that does not exist but names a packaged recipe (`configs/default.py`) is read from the
installed package (`calib_jax.config.resolve_config_path`). Without `--config=`, train.py and
eval.py use the work directory's saved `config.json` where there is one (`cli.run_config`).
"""
import os
import sys

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from calib_jax.config import files, schema

DEFAULT_CONFIG = "configs/default.py"
_USER_ERRORS = (flags.Error, AttributeError, KeyError, ValueError, TypeError, OSError)

_config: flags.FlagHolder | None = None
_workdir: flags.FlagHolder | None = None


def _config_error_line(argv: list[str], error: Exception) -> str:
  """The one-line reason why `--config=` / `--config.*=` of `argv` failed to load."""
  specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  spec = specs[-1] if specs else DEFAULT_CONFIG  # absl keeps the last --config=
  try:
    config = files.load_config_file(spec)
  except (schema.ConfigError, ValueError, OSError) as e:
    return str(e).splitlines()[0]
  for arg in argv[1:]:
    if arg.startswith("--config."):
      dotted = arg[len("--config."):].split("=")[0]
      message = schema.unknown_field_message(config, dotted)
      if message:
        return message
      group = schema.group_fields(config, dotted)
      if group:
        return (f"config field {dotted!r} is a group of fields ({', '.join(group)}); set one "
                f"of them, e.g. --config.{dotted}.{'name' if 'name' in group else group[0]}=...")
  return (str(error).splitlines() or [type(error).__name__])[0]


def resolve_config_arguments(argv: list[str]) -> None:
  """Rewrites, in place, each `--config=PATH[:variant]` of `argv` whose PATH is a packaged
  recipe not found in the working directory to the packaged file's path."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      path, colon, variant = arg[len("--config="):].partition(":")
      argv[i] = f"--config={files.resolve_config_path(path)}{colon}{variant}"


def define(argv: list[str]) -> None:
  """Defines `--config` and `--workdir` for the command line `argv` (program name first; its
  `--config=` paths are resolved in place, see `resolve_config_arguments`). A second call only
  resolves the paths. A bad config or override exits with one line."""
  global _config, _workdir
  resolve_config_arguments(argv)
  if _config is not None:
    return
  try:
    # The config files lock themselves (`config.base_config`) except the free-form dicts;
    # accepting new attributes lets `--config.data.options.download=False` add a key to one of
    # those (parsed as a Python literal), while a new name anywhere else still fails on the
    # locked config and gets the one-line "did you mean" of `_config_error_line`.
    _config = config_flags.DEFINE_config_file(
        "config", files.resolve_config_path(DEFAULT_CONFIG),
        "Config file (`file.py` or `file.py:variant`); override fields with "
        "--config.field=value (e.g. --config.optimizer.learning_rate=0.01). Without it, "
        "train.py and eval.py use the work directory's config.json (the run's own config) "
        "if there is one, else configs/default.py.",
        lock_config=False, accept_new_attributes=True)
  except _USER_ERRORS as error:
    sys.exit(f"{os.path.basename(argv[0])}: {_config_error_line(argv, error)}")
  _workdir = flags.DEFINE_string("workdir", None,
                                 "Work directory: checkpoints, metrics, the log (log.txt).")


def config() -> ml_collections.ConfigDict:
  """The `--config` value (after `define` and flag parsing)."""
  return _config.value


def config_given() -> bool:
  """Whether the command line names a config file (`--config=`), after flag parsing."""
  return bool(flags.FLAGS["config"].present)


def config_overrides(argv: list[str]) -> dict[str, object]:
  """The `--config.field=value` overrides of `argv` as {dotted field: value}, the values as the
  config flag parsed them (after flag parsing)."""
  dotted = [a[len("--config."):].split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
  values = {}
  for name in dict.fromkeys(dotted):
    node = _config.value
    for part in name.split("."):
      node = node[part]
    values[name] = node
  return values


def workdir() -> str:
  """The `--workdir` value; a usage error when it is missing."""
  if not _workdir.value:
    raise app.UsageError("--workdir is required")
  return _workdir.value


def parse_flags(argv: list[str]) -> list[str]:
  """`app.run`'s flag parser with user mistakes as one line on stderr and exit status 1.

  ml_collections raises a bare AttributeError (a traceback) for an override of a field the
  config does not have, e.g. `--config.lr=0.1`; this names the field and the likely one.
  """
  try:
    remaining = flags.FLAGS(argv)
    # config_flags defers some load errors (a missing file) to the first attribute access.
    _config.value.keys()
    return remaining
  except _USER_ERRORS as e:
    sys.exit(f"{os.path.basename(argv[0])}: {_config_error_line(argv, e)}")
