"""From a config to what a run needs, in one pass that checks while it builds.

    from calib_jax import experiment
    exp = experiment.build(config)          # ConfigError listing every problem, or:
    exp.model, exp.loss_fn, exp.data        # the model, the loss, the data streams
    schedule, tx = exp.optimizer()          # needs the training-set size (read once)

Modules: `build` (`build`, `Experiment`, `run_length`), `data` (`DataRecipe`: splits, options,
training and evaluation streams), `weights` (`ModelRecipe`, pre-trained and weight files),
`checks` (checks that span sub-configs).
"""
from calib_jax.experiment.build import build
from calib_jax.experiment.build import Experiment
from calib_jax.experiment.build import run_length
from calib_jax.experiment.build import RunLength
from calib_jax.experiment.data import DataRecipe
from calib_jax.experiment.weights import ModelRecipe
from calib_jax.experiment.weights import WeightFileError

__all__ = ["build", "Experiment", "run_length", "RunLength", "DataRecipe", "ModelRecipe",
           "WeightFileError"]
