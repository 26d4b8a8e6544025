"""One build pass: a config becomes an `Experiment`, checked while it is built.

    experiment = build(config)               # every problem of the config in one ConfigError
    model, loss_fn = experiment.model, experiment.loss_fn
    schedule, tx = experiment.optimizer()    # reads the training-set size on first use
    state = experiment.initial_state()

`build` checks every sub-config with the code that builds from it, builds the registry objects
(loss, dataset metadata, model) at the same time, and raises one `ConfigError` listing all
problems before anything is compiled or any data is read; registry look-ups only build Python
objects, so a bad config fails in well under a second. What needs the data (the training-set
size, hence the run's length and the schedule; an example input) is computed on first use and
kept. The training loop, `eval.py` and the dry run all consume the same object, so a config
that builds is exactly the model and loss that training will use.
"""
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import optax

from calib_jax.config import schema
from calib_jax import data, losses
from calib_jax.experiment import problems as problems_lib
from calib_jax.experiment import weights
from calib_jax.experiment.data import DataRecipe
from calib_jax.sweep import spec as sweep_spec
from calib_jax.training import optim, parallel, state as state_lib

LossFn = Callable[..., jax.Array]


def _init_variables(model: nn.Module, key: jax.Array, example: Any) -> dict[str, Any]:
  return model.init({"params": key}, example, train=False)


# One program per model (Flax modules are equal and hash alike when their fields are) and input
# shape, traced once per process: a sweep's members and the runs of one process (the demo's
# variants, a study's seeds) initialise with it, not each with a program traced and lowered
# afresh (~0.1-0.2 CPU-s each for a small CNN).
_shared_init = jax.jit(_init_variables, static_argnums=0)


@dataclasses.dataclass(frozen=True)
class RunLength:
  """`steps_per_epoch` and `total_steps` of a run, and the training-set size they come from."""
  steps_per_epoch: int
  total_steps: int
  num_train_examples: int


def run_length(config: ml_collections.ConfigDict, num_train_examples: int) -> RunLength:
  """The run's length from the config's `steps_per_epoch`, `num_train_steps`, `num_epochs` and
  global batch size.

  An epoch is what the training stream yields before reshuffling: whole global batches only,
  each process reading its `1/process_count` shard of the examples.
  """
  if config.steps_per_epoch > 0:
    steps_per_epoch = int(config.steps_per_epoch)
  else:
    per_process = num_train_examples // jax.process_count()
    steps_per_epoch = per_process // parallel.local_batch_size(config.data.batch_size)
    if steps_per_epoch < 1:
      raise schema.ConfigError(
          f"batch_size={config.data.batch_size} is larger than the {num_train_examples} training "
          "examples")
  if config.num_train_steps > 0:
    total_steps = int(config.num_train_steps)
  else:
    total_steps = max(int(round(config.num_epochs * steps_per_epoch)), 1)
  return RunLength(steps_per_epoch, total_steps, num_train_examples)


class Experiment:
  """What a config builds: its dataset, model, loss, data streams, optimiser and states.

  Attributes:
    config: the config it was built from (for the run-level fields: seed, logging, checkpoints).
    meta: the dataset's metadata (`calib_jax.data.info`).
    mesh: the device mesh the batches are sharded over.
    model_recipe: the model's registry name, classes and keyword arguments.
    model: the Flax module.
    loss_fn: `loss_fn(logits, labels, *, mask, objectness)`.
    data: the streams of `config.data`.
  """

  def __init__(self, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
               data_recipe: DataRecipe, model_recipe: weights.ModelRecipe, model: nn.Module,
               loss_fn: LossFn, bind_loss: Callable[..., LossFn] | None = None):
    self.config, self.mesh, self.data = config, mesh, data_recipe
    self.meta = data_recipe.meta
    self.model_recipe, self.model, self.loss_fn = model_recipe, model, loss_fn
    self._bind_loss = bind_loss

  def loss_at_step(self, values: Mapping[str, Any] | None = None
                   ) -> Callable[[jax.Array], LossFn] | None:
    """`loss_at_step(step) -> loss_fn` when `config.loss_schedule` changes a hyper-parameter
    over training (`losses.schedule.scheduled`), else None (the loss is `loss_fn`, or a sweep
    member's `values` bound). `values` are the loss's bound values (a sweep member's, traced);
    the scheduled one starts from its value there, else from the config's."""
    schedule = self.config.loss_schedule
    if schedule.name == "none":
      return None
    hparam = schedule.hparam
    configured = {**losses.default_hparams(self.config.loss), **self.config.loss_kwargs.to_dict()}
    start = (values or {}).get(hparam, configured[hparam])
    length = self.length
    num_epochs = -(-length.total_steps // length.steps_per_epoch)
    return losses.schedule.scheduled(self._bind_loss, hparam, start=start, end=schedule.end,
                                   steps_per_epoch=length.steps_per_epoch,
                                   num_epochs=num_epochs, values=values)

  @functools.cached_property
  def length(self) -> RunLength:
    """The run's length (reads the training-set size on first use)."""
    return run_length(self.config, self.data.num_train_examples())

  @property
  def crl_num_examples(self) -> int:
    """Size of CRL's correctness history: the training-set size with CRL, else 0."""
    return self.length.num_train_examples if self.config.crl_weight > 0 else 0

  @functools.cached_property
  def _optimizer(self) -> tuple[optax.Schedule, optax.GradientTransformation]:
    return self.optimizer_with()

  def optimizer(self) -> tuple[optax.Schedule, optax.GradientTransformation]:
    """`(schedule, tx)` of the run: the learning rate by step and the optimiser."""
    return self._optimizer

  def optimizer_with(self, learning_rate: Any = None, weight_decay: Any = None
                     ) -> tuple[optax.Schedule, optax.GradientTransformation]:
    """`(schedule, tx)` with another peak learning rate and weight decay than the config's
    (None keeps it): a sweep member's values, which may be traced arrays."""
    length = self.length
    schedule = optim.schedule_from_config(
        self.config.schedule,
        base_lr=self.config.optimizer.learning_rate if learning_rate is None else learning_rate,
        total_steps=length.total_steps, steps_per_epoch=length.steps_per_epoch)
    return schedule, optim.optimizer_from_config(self.config.optimizer, schedule,
                                                 weight_decay=weight_decay)

  def initial_variables(self, key: jax.Array) -> dict[str, Any]:
    """Freshly initialised variables, overwritten with `config.pretrained` if given."""
    example = self.data.example_input()
    try:
      hash(self.model)
    except TypeError:  # a registered model with an unhashable field: traced for this call
      variables = jax.jit(functools.partial(_init_variables, self.model))(key, example)
    else:
      variables = _shared_init(self.model, key, example)
    return weights.restore_pretrained_file(self.model_recipe, self.config.pretrained,
                                           tuple(self.config.pretrained_skip),
                                           jax.device_get(variables))

  def initial_state(self, seed: int | None = None,
                    tx: optax.GradientTransformation | None = None) -> state_lib.TrainState:
    """The initial training state, replicated on the mesh (the same for every process), from
    `seed` (default: the config's) with the optimiser `tx` (default: the run's)."""
    seed = self.config.seed if seed is None else seed
    init_key, run_key = jax.random.split(jax.random.key(seed))
    tx = self.optimizer()[1] if tx is None else tx
    state = state_lib.create(self.initial_variables(init_key), tx, run_key,
                             crl_num_examples=self.crl_num_examples)
    return parallel.replicate(state, self.mesh)

  def abstract_state(self, tx: optax.GradientTransformation | None = None
                     ) -> state_lib.TrainState:
    """Shapes, dtypes and shardings of the training state, without computing it (restores),
    with the optimiser `tx` (default: the run's)."""
    tx = self.optimizer()[1] if tx is None else tx
    example = self.data.example_input()

    def init():
      variables = _init_variables(self.model, jax.random.key(0), example)
      return state_lib.create(variables, tx, jax.random.key(0),
                              crl_num_examples=self.crl_num_examples)

    sharding = parallel.replicated(self.mesh)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        jax.eval_shape(init))

  def abstract_variables(self) -> dict[str, Any]:
    """Shapes, dtypes and shardings of the model variables alone (for evaluation)."""
    return weights.abstract_variables(self.model, self.data.example_input(), self.mesh)


def build(config: ml_collections.ConfigDict, *,
          devices: list[jax.Device] | None = None) -> Experiment:
  """Checks `config` while building its experiment; see the module docstring.

  The config passes through each module once or twice, in one direction: the registries
  first (the sweep's syntax, the loss and its schedule, the dataset and its recipe, the model),
  then every other check in one call (`problems.config_problems`, with the dataset's recipe
  when the dataset is known). A registry's own error (an unknown name with the valid ones, a
  rejected argument) becomes one line of the `ConfigError`.

  Args:
    config: a config following `calib_jax.config.base_config`.
    devices: devices of the mesh (default: all devices of all processes); a sweep with
      `sweep_member_shards` > 1 splits them into a 2-D mesh (`parallel.make_mesh`).

  Raises:
    ConfigError: (a `ValueError`) listing every problem of the config, one per line.
  """
  num_devices = len(jax.devices() if devices is None else devices)
  problems, member_shards = sweep_spec.check(config, num_devices, jax.process_count())
  mesh = parallel.make_mesh(devices, member_shards)
  loss_fn = bind_loss = data_recipe = recipe = model = None
  try:
    # Real hyper-parameters hidden from the compiler, as a sweep's traced ones are: a single
    # run's step is then its sweep member's, bit for bit (`losses.traced`).
    bind_loss = losses.traced(config.loss, **config.loss_kwargs.to_dict())
    loss_fn = bind_loss()
  except (ValueError, TypeError) as e:
    problems.append(str(e))
  else:
    problems += losses.loss_schedule_problems(config.loss, config.loss_schedule)
  try:
    data_recipe = DataRecipe(config.data, data.info(config.data.name))
  except ValueError as e:
    problems.append(str(e))
  else:
    try:
      recipe = weights.model_recipe(config.model, config.model_kwargs, config.dtype,
                                    data_recipe.meta)
      model = recipe.build()
    except (ValueError, TypeError) as e:
      problems.append(str(e) if str(e).startswith("unknown model") else
                      f"model {config.model!r}: {e}")
  # The batch is split over the mesh's data axis (all devices but a sweep's member shards). The
  # sub-configs' problems are listed first, the registries' and the sweep's after them.
  problems = problems_lib.config_problems(config, num_devices // member_shards,
                                          data_recipe) + problems
  schema.raise_if_problems(problems)
  return Experiment(config, mesh, data_recipe, recipe, model, loss_fn, bind_loss)
