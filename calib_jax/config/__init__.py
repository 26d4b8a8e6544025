"""The config schema and config files.

    from calib_jax import config
    cfg = config.load_config_file("configs/default.py:mbls")   # what --config= does
    cfg = config.base_config()                                 # every field with its default

Modules: `schema` (the fields, their defaults and the one-line messages for wrong ones),
`files` (loading `file.py[:variant]`, packaged recipes), `variants` (named overrides that config
files offer as `:arg`). Building a config into a model, loss, optimiser and data streams, and
checking it, is `calib_jax.experiment.build`.
"""
from calib_jax.config import saved
from calib_jax.config import variants
from calib_jax.config.files import load_config_file
from calib_jax.config.files import load_config_module
from calib_jax.config.files import resolve_config_path
from calib_jax.config.schema import base_config
from calib_jax.config.schema import ConfigError
from calib_jax.config.schema import FREE_FORM_FIELDS
from calib_jax.config.schema import raise_if_problems
from calib_jax.config.schema import unattended_run
from calib_jax.config.schema import unknown_field_message

__all__ = ["saved", "variants", "load_config_file", "load_config_module", "resolve_config_path",
           "base_config", "ConfigError", "FREE_FORM_FIELDS", "raise_if_problems",
           "unattended_run", "unknown_field_message"]
