"""The config a program runs over a work directory, and the one line for a checkpoint of another.

Without `--config=`, `train.py` and `eval.py` take the run's own `<workdir>/config.json` (what
train.py saved; `--config.field=value` overrides still apply to it); a work directory without
one gets `configs/default.py`. With `--config=`, a checkpoint whose arrays do not fit the
config's model or state (`checkpoint.CheckpointMismatchError`) gets one line naming the fields
in which the config differs from the run's, their two values, and where the run's config is.
"""
import os
import sys
from typing import Any

import ml_collections

from calib_jax.cli import flags
from calib_jax.config import saved as saved_lib
from calib_jax.config import variants
from calib_jax.training import checkpoint, reporting


def saved_config_path(workdir: str) -> str:
  """Where train.py saved the run's resolved config."""
  return os.path.join(workdir, reporting.CONFIG_FILE)


def config_for(workdir: str) -> tuple[ml_collections.ConfigDict, str | None]:
  """The config to run over `workdir` and the saved file it came from (None: `--config`, or the
  default config where the work directory has no saved one). Call after flag parsing.

  Raises:
    ConfigError: the saved config cannot be read back (one line), or an override does not fit.
  """
  path = saved_config_path(workdir)
  if flags.config_given() or not os.path.isfile(path):
    return flags.config(), None
  config = saved_lib.read_saved_config(path)
  variants.override(config, flags.config_overrides(sys.argv))
  return config, path


def saved_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The run's saved config, or None when there is none (or it cannot be read)."""
  try:
    return saved_lib.read_saved_config(saved_config_path(workdir))
  except (OSError, ValueError):
    return None


def _value(value: Any) -> str:
  return "(unset)" if value is None else repr(value)


def mismatch_line(workdir: str, saved: ml_collections.ConfigDict | None,
                  config: ml_collections.ConfigDict,
                  error: checkpoint.CheckpointMismatchError, *, evaluating: bool) -> str:
  """One line for a checkpoint of another config: the differing fields with this config's and
  the run's values (those deciding the arrays that differ: the model's, else the optimiser
  state's; else every differing field), or the arrays themselves when nothing tells them apart,
  and where the run's own config is. `saved`: the run's saved config (None: none)."""
  model_arrays = any(d.split(".", 1)[0] in ("params", "batch_stats") for d in error.differences)
  changed: list[tuple[str, Any, Any]] = []
  if saved is not None:
    groups = ((saved_lib.MODEL_FIELDS,) if model_arrays else ()) + (
        saved_lib.OPTIMIZER_FIELDS, saved_lib.MODEL_FIELDS + saved_lib.OPTIMIZER_FIELDS, None)
    for fields in groups:
      changed = saved_lib.differences(saved, config, fields)
      if changed:
        break
  arrays = "; ".join(error.differences[:2])
  path = saved_config_path(workdir)
  if changed:
    what = ", ".join(f"{name}={_value(here)} here, {_value(there)} in the run"
                     for name, there, here in changed[:6])
    what += f", and {len(changed) - 6} more fields" if len(changed) > 6 else ""
    if flags.config_given():
      advice = (f"leave out --config to {'evaluate' if evaluating else 'resume'} it with the "
                f"run's own config, {path}"
                + ("" if evaluating else ", or train this config in another --workdir"))
    else:
      advice = f"the run's own config is {path}: leave out the --config.* overrides that change it"
  elif saved is not None:
    what = f"its checkpoint holds other arrays than {path} says ({arrays})"
    advice = "give the config it was trained with as --config="
  else:
    what = f"its checkpoint holds other arrays ({arrays})"
    advice = "give the config it was trained with as --config=, or another --workdir"
  return f"{workdir} was trained with another config: {what}; {advice}. Nothing was changed."
