"""Hyper-parameter × seed sweeps trained as one compiled program.

    config.sweep = "loss_kwargs.margin=5,10;seed=0,1"     # 4 members
    run.train_and_evaluate(config, workdir)                # one program, one input process
    sweep.summary.read(workdir)                            # <workdir>/sweep.json

Modules: `spec` (parsing and checking `config.sweep`, a member's single-run config),
`summary` (`sweep.json`: per-member results, best members, mean ± std over seeds). The
population that trains them (stacked states, the vmapped step, per-member streams) is
`calib_jax.run.Population`.
See docs/training.md, "Sweeps".
"""
from calib_jax.sweep import spec, summary
from calib_jax.sweep.spec import (member_config, overrides_label, parse, Sweep, SweepError,
                                  sweep_problems)

__all__ = ["spec", "member_config", "overrides_label", "parse", "Sweep", "SweepError",
           "sweep_problems", "summary"]
