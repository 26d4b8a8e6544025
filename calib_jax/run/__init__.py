"""The run: the training loop behind `train.py`, and what it trains.

    from calib_jax import run
    state = run.train_and_evaluate(config, workdir)    # train (resumes if possible)

Modules: `loop` (`train_and_evaluate`: schedule, metrics, validation, checkpoints), `trainee`
(the `Trainee` interface the loop trains), `single` (`SingleRun`), `population` (`Population`,
a sweep's members as one program), `inputs` (a seed's training stream, the resident split),
`dispatch` (k steps per call, prefetching), `preemption` (SIGTERM). The step's parts (the train
step, its compiled programs, state, optimiser, mesh, checkpoints) are `calib_jax.training`;
building a config into a model, loss and data `calib_jax.experiment`; evaluation
`calib_jax.evaluation`.
"""
from calib_jax.run.loop import make_trainee
from calib_jax.run.loop import NonFiniteLossError
from calib_jax.run.loop import train_and_evaluate
from calib_jax.run.population import Population
from calib_jax.run.preemption import Preempted
from calib_jax.run.single import SingleRun
from calib_jax.run.trainee import Trainee

__all__ = ["train_and_evaluate", "NonFiniteLossError", "make_trainee", "Trainee", "SingleRun",
           "Population", "Preempted"]
