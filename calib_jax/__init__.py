"""calib_jax: calibrated neural networks in JAX/Flax.

Submodules are imported lazily, on first use of `calib_jax.<name>`, so that `import
calib_jax.losses` (which runs this file first) does not pull in TensorFlow through
`calib_jax.data`: the one lazy face of the package, and it only defers that import.
"""
import importlib

__version__ = "0.1.0"

_SUBMODULES = ("arrays", "losses", "metrics", "conformal", "posthoc", "plotting", "models", "data",
               "config", "experiment", "training", "evaluation", "sweep", "run")


def __getattr__(name):
  if name in _SUBMODULES:
    return importlib.import_module(f"{__name__}.{name}")
  if name == "evaluate_predictions":  # any model's logits: `evaluation.predictions`
    return importlib.import_module(f"{__name__}.evaluation.predictions").evaluate_predictions
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
