"""The train step's parts: what one optimiser step is, and how it is compiled and saved.

Modules: `step` (the train and predict steps), `programs` (the one step builder: k steps per
call or one, host batches or a resident split), `state` (`TrainState`), `optim` (optimisers and
schedules), `parallel` (device mesh), `crl` (correctness ranking loss), `checkpoint` (orbax),
`reporting` (progress line, metrics, TensorBoard). The loop that runs them is `calib_jax.run`
(`run.train_and_evaluate`); this package imports nothing above it.
"""
from calib_jax.training.state import TrainState

__all__ = ["TrainState"]
