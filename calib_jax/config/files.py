"""Config files: `path/to/file.py[:variant]` -> the config its `get_config(variant)` returns.

A config file is a Python module with `get_config(arg=None)` (and usually `VARIANTS`, see
`variants`). `load_config_file` is what `--config=` does; `load_config_module` runs a file once
per process, so recipes can derive from each other. A path that does not exist in the working
directory but names a recipe of the package (`configs/default.py`, or `default.py`) is read from
the installed package (`calib_jax/configs/`), so an installed `calib-jax-train
--config=configs/default.py` works from any directory.
"""
import importlib.util
import os
import re
from typing import Any

import ml_collections

from calib_jax.config import schema

# The recipes that travel with the package; a source checkout links `configs/` to it.
PACKAGED_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "configs")

_CONFIG_MODULES: dict[str, Any] = {}


def resolve_config_path(path: str) -> str:
  """`path` itself if it is a file; else the packaged recipe of that name (`configs/x.py` or
  `x.py` -> `calib_jax/configs/x.py`) if there is one; else `path` (whose loading then fails
  with a one-line error)."""
  if os.path.isfile(path):
    return path
  head, name = os.path.split(os.path.normpath(path))
  packaged = os.path.join(PACKAGED_CONFIGS, name)
  if head in ("", "configs") and name.endswith(".py") and os.path.isfile(packaged):
    return packaged
  return path


def packaged_configs() -> list[str]:
  """File names of the packaged recipes (`default.py`, `cifar10_resnet50.py`, ...)."""
  return sorted(f for f in os.listdir(PACKAGED_CONFIGS)
                if f.endswith(".py") and not f.startswith("_"))


def load_config_module(path: str):
  """The config file at `path` as a module, executed once per process (e.g. to derive one
  recipe from another, or to read its `VARIANTS`).

  Modules are named `calib_jax_configs.<file stem>` (tracebacks say which file), and cached by
  real path, so a base recipe that several files derive from is run once.

  Raises:
    FileNotFoundError: no such file, here or among the packaged recipes.
  """
  resolved = resolve_config_path(path)
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"config file {path!r} does not exist (packaged recipes: "
                            f"{', '.join(packaged_configs())})")
  key = os.path.realpath(resolved)
  if key not in _CONFIG_MODULES:
    stem = os.path.splitext(os.path.basename(key))[0]
    taken = sum(1 for k in _CONFIG_MODULES if os.path.basename(k) == os.path.basename(key))
    name = f"calib_jax_configs.{stem}" + (f"_{taken}" if taken else "")
    module_spec = importlib.util.spec_from_file_location(name, key)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    _CONFIG_MODULES[key] = module
  return _CONFIG_MODULES[key]


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads `path/to/config.py[:arg]` the way `--config=` does: `get_config(arg)` of the file.

  Args:
    spec: a config file path, optionally followed by `:arg` (the variant).

  Raises:
    FileNotFoundError: no such file.
    ConfigError: the file sets a field the schema does not have (one line, with suggestions).
  """
  path, _, arg = spec.partition(":")
  module = load_config_module(path)
  try:
    return module.get_config(arg) if arg else module.get_config()
  except (AttributeError, KeyError) as e:
    match = re.search(r'Key "([^"]+)" does not exist', str(e))
    if match is None:
      raise
    name = match.group(1)
    hint = schema.hint_fields(name, schema.field_names(schema.base_config()))
    hint_text = f"; did you mean {' or '.join(map(repr, hint))}?" if hint else ""
    raise schema.ConfigError(f"{path}: sets unknown config field {name!r}{hint_text}") from None
