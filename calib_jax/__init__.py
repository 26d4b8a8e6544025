"""calib_jax: calibrated neural networks in JAX/Flax.

Submodules are imported lazily so that `import calib_jax.losses` does not pull in TensorFlow.
"""
import importlib

__version__ = "0.1.0"

_SUBMODULES = ("losses", "metrics", "conformal", "posthoc", "plotting", "models", "data",
               "config", "experiment", "training", "evaluation", "sweep")


def __getattr__(name):
  if name in _SUBMODULES:
    return importlib.import_module(f"{__name__}.{name}")
  if name == "evaluate_predictions":  # any model's logits: `evaluation.predictions`
    return importlib.import_module(f"{__name__}.evaluation.predictions").evaluate_predictions
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
