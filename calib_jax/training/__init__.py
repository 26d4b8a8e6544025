"""Training and evaluation programs behind `train.py` and `eval.py`.

    from calib_jax import training
    state = training.train_and_evaluate(config, workdir)    # train (resumes if possible)
    results = training.evaluate_run(config, workdir)         # eval.py: metrics.json + plots

Modules: `config` (schema and paper variants), `config_validation`, `optim` (optimisers and
schedules), `state` (TrainState), `parallel` (device mesh), `step` (jit-compiled steps),
`crl` (correctness ranking loss), `checkpoint` (orbax), `reporting` (progress line, metrics,
TensorBoard), `loop`, `evaluate`.
"""
import importlib

_LAZY = {
    "train_and_evaluate": ("calib_jax.training.loop", "train_and_evaluate"),
    "NonFiniteLossError": ("calib_jax.training.loop", "NonFiniteLossError"),
    "evaluate_run": ("calib_jax.training.evaluate", "evaluate_run"),
    "validate": ("calib_jax.training.config_validation", "validate"),
    "ConfigError": ("calib_jax.training.config_validation", "ConfigError"),
    "TrainState": ("calib_jax.training.state", "TrainState"),
}


def __getattr__(name):
  if name in _LAZY:
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
