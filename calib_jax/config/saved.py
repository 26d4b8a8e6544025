"""A run's saved config: `<workdir>/config.json` read back, and how another config differs from it.

`train.py` writes the resolved config of every run as JSON in its work directory. Without
`--config`, `train.py` (resuming) and `eval.py` use that file (`read_saved_config`), so a run is
evaluated with the loss, model and sweep it was trained with. With `--config`, a checkpoint that
does not fit the config's model is explained with `differences`: the fields in which the two
configs differ, with both values, among those that decide the model's arrays (`MODEL_FIELDS`)
or the optimiser state's (`OPTIMIZER_FIELDS`).
"""
import json
from collections.abc import Mapping
from typing import Any

import ml_collections

from calib_jax.config import schema, variants

# The fields that decide the arrays of a run's checkpoint. The model's (parameters and BatchNorm
# statistics): the dataset (number of classes, input size and channels) and its options (e.g. an
# image size or vocabulary), the model and its keyword arguments, the CRL weight (its history)
# and the sweep (the population's leading axis). The optimiser state's tree, besides: the
# optimiser and schedule (which transforms the chain holds). A dotted prefix covers the fields
# below it.
MODEL_FIELDS = ("data.name", "data.options", "model", "model_kwargs", "crl_weight", "sweep")
OPTIMIZER_FIELDS = ("optimizer", "schedule")


def _tuples(value: Any) -> Any:
  """JSON's lists back as the tuples the config files write (hashable, as model fields must be)."""
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  if isinstance(value, Mapping):
    return {k: _tuples(v) for k, v in value.items()}
  return value


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """Dotted field -> value; a free-form sub-dict (`FREE_FORM_FIELDS`) stays one mapping value."""
  flat = {}
  for key, value in tree.items():
    dotted = prefix + key
    if isinstance(value, Mapping) and dotted not in schema.FREE_FORM_FIELDS:
      flat.update(_flatten(value, dotted + "."))
    else:
      flat[dotted] = value
  return flat


def read_saved_config(path: str) -> ml_collections.ConfigDict:
  """The config saved as JSON at `path` (a run's `config.json`), as the schema's ConfigDict.

  Raises:
    OSError: the file cannot be read.
    ConfigError: it is not JSON, or names a field the schema does not have (one line).
  """
  with open(path) as f:
    try:
      saved = json.load(f)
    except json.JSONDecodeError as e:
      raise schema.ConfigError(f"{path} is not a config saved by train.py ({e})") from None
  try:
    return variants.override(schema.base_config(), _tuples(_flatten(saved)))
  except (schema.ConfigError, ValueError, TypeError, AttributeError, KeyError) as e:
    reason = (str(e).splitlines() or [type(e).__name__])[0]
    raise schema.ConfigError(f"{path} does not fit this version's config fields ({reason}); "
                             "give the run's config with --config=") from None


def _leaves(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Dotted field -> value, free-form sub-dicts included key by key, lists as tuples."""
  return {k: _tuples(v) for k, v in _flatten_all(config.to_dict()).items()}


def _flatten_all(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):  # an empty free-form dict: no field
      flat.update(_flatten_all(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def differences(saved: ml_collections.ConfigDict, config: ml_collections.ConfigDict,
                fields: tuple[str, ...] | None = None) -> list[tuple[str, Any, Any]]:
  """`(field, saved value, config's value)` of each field in which the two configs differ,
  sorted by field; only fields under one of `fields` (dotted prefixes) unless None. A field
  one config lacks (a free-form key) has the value None there."""
  mine, theirs = _leaves(config), _leaves(saved)
  names = sorted(set(mine) | set(theirs))
  if fields is not None:
    names = [n for n in names if any(n == f or n.startswith(f + ".") for f in fields)]
  return [(n, theirs.get(n), mine.get(n)) for n in names if theirs.get(n) != mine.get(n)]
