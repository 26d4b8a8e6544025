"""The recipes: one config file per paper setting (`get_config(arg)` with named `VARIANTS`).

They travel with the installed package; a source checkout also has them as `configs/` (a link
to this folder), which is how the documentation names them: `--config=configs/default.py:mbls`.
An installed `calib-jax-train --config=configs/default.py` finds the packaged file when the
path does not exist in the working directory (`calib_jax.config.files.resolve_config_path`).
"""
