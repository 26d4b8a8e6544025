"""The training program behind `train.py`.

    from calib_jax import training
    state = training.train_and_evaluate(config, workdir)    # train (resumes if possible)

Modules: `loop` (`train_and_evaluate`), `step` (the jit-compiled train and predict steps),
`state` (`TrainState`), `optim` (optimisers and schedules), `parallel` (device mesh),
`crl` (correctness ranking loss), `checkpoint` (orbax), `preemption` (SIGTERM),
`reporting` (progress line, metrics, TensorBoard). The config schema is `calib_jax.config`,
building a config into a model, loss and data streams `calib_jax.experiment`, and evaluation
`calib_jax.evaluation`.
"""
import importlib

_LAZY = {
    "train_and_evaluate": ("calib_jax.training.loop", "train_and_evaluate"),
    "NonFiniteLossError": ("calib_jax.training.loop", "NonFiniteLossError"),
    "TrainState": ("calib_jax.training.state", "TrainState"),
}


def __getattr__(name):
  if name in _LAZY:
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
