"""Hyper-parameter × seed sweeps trained as one compiled program.

    config.sweep = "loss_kwargs.margin=5,10;seed=0,1"     # 4 members
    training.train_and_evaluate(config, workdir)           # one program, one input process
    sweep.summary.read(workdir)                            # <workdir>/sweep.json

Modules: `spec` (parsing and checking `config.sweep`, a member's single-run config),
`population` (`Population`: stacked states, the vmapped step, per-member streams, metrics and
validation), `summary` (`sweep.json`: per-member results, best members, mean ± std over seeds).
See docs/training.md, "Sweeps".
"""
import importlib

from calib_jax.sweep import spec
from calib_jax.sweep.spec import (member_config, overrides_label, parse, Sweep, SweepError,
                                  sweep_problems)

_LAZY = {"Population": ("calib_jax.sweep.population", "Population"),
         "summary": ("calib_jax.sweep.summary", None)}


def __getattr__(name):
  if name in _LAZY:
    module, attr = _LAZY[name]
    loaded = importlib.import_module(module)
    return loaded if attr is None else getattr(loaded, attr)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["spec", "member_config", "overrides_label", "parse", "Sweep", "SweepError",
           "sweep_problems", "Population", "summary"]
