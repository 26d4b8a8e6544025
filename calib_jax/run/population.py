"""A sweep's population trained as one program (a `trainee.Trainee` of the loop): the members' states stacked on a leading axis,
the train step applied to every member (`jax.vmap` on accelerators; on CPU `lax.map` or the
members unrolled, `members_as`), their hyper-parameters as traced arrays.

Member `m` with overrides `o_m` is its single run (`spec.member_config(config, o_m)`):

* its state starts from `Experiment.initial_state(seed_m, tx_m)`: the same initialisation,
  dropout keys and optimiser state as that run;
* its step is `step.make_train_step` with the loss `losses.traced(...)(**o_m's loss values)`
  and the optimiser `Experiment.optimizer_with(lr_m, wd_m)`, the values traced, so the one
  compiled program serves every value;
* its batches are those of its seed's training stream (`sweep_shared_order=False`, the
  default: one stream per distinct seed, stacked `[S, batch, ...]`, each member gathering its
  own), or of the config seed's stream for every member (`sweep_shared_order=True`: one stream,
  S = 1, the host reads a P-th of the data).

By default the states are replicated over the mesh and each batch is split over it along its
batch axis, as for a single run: every device computes every member on its shard of the batch,
and a member's gradients are all-reduced like a single run's. With `sweep_member_shards` = m >
1 the mesh is 2-D, `(member, data)`: the stacked state is split along its member axis over the
m member shards and each batch over the `devices / m` data shards, so a device holds P/m
members and computes them on a larger share of the batch (fewer, larger matrix products, and
P/m of the parameters per device). Across processes each member shard takes an equal share of
every process's devices (`parallel.make_mesh`): every process feeds its share of every batch of
every stream, as for a single run, and its devices hold every member shard, so each process can
read every member's step and variables; `sweep.json` is made from logits gathered from all
processes (`validation.split_logits`).
"""
import os
from collections.abc import Iterator
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from calib_jax import losses
from calib_jax.evaluation import validation
from calib_jax.experiment import Experiment
from calib_jax.run import inputs
from calib_jax.run import trainee
from calib_jax.run.trainee import Failure, Record
from calib_jax.sweep import spec, summary
from calib_jax.training import parallel, programs
from calib_jax.training import step as step_lib
from calib_jax.training import state as state_lib


def stack_trees(trees: list[Any]) -> Any:
  """Trees with equal structure stacked leaf by leaf on a new leading axis."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def member_tree(tree: Any, index: int) -> Any:
  """Member `index`'s slice of a stacked tree."""
  return jax.tree.map(lambda leaf: leaf[index], tree)


def _vectorized(member_step, states, values, batches, *, shared_batch: bool):
  """Every member at once: `jax.vmap` (batched matrix products; what fills an accelerator)."""
  return jax.vmap(member_step, in_axes=(0, 0, None if shared_batch else 0))(
      states, values, batches)


def _unrolled(member_step, states, values, batches, *, shared_batch: bool):
  """`config.sweep_members_as="unroll"`: the members' steps written one after another into the
  program (a Python loop at trace time, no loop in the compiled program), each on its own slice
  of the stacked state. Each member's step is its single run's step, with its own unbatched
  convolutions: what XLA:CPU runs fastest. `vmap` would make them grouped convolutions (2.9x
  slower per member-step for the small CNN on CPU) and `lax.map` would put them in a loop body
  (`programs.calls_each_step`). The program grows with P (one copy of the step per member), not
  with k: the loop calls it once per step."""
  size = jax.tree.leaves(states)[0].shape[0]
  outputs = [member_step(member_tree(states, i), member_tree(values, i),
                         batches if shared_batch else member_tree(batches, i))
             for i in range(size)]
  return (stack_trees([state for state, _ in outputs]),
          stack_trees([metrics for _, metrics in outputs]))


def _member_after_member(member_steps, states, values, stream_of):
  """`config.sweep_members_as="map"`: one member after another inside the program (`lax.map`),
  each member running all k steps of the call before the next member starts. Members are
  independent, so this is only an order of evaluation: every member's values are those of
  `vmap`. What it buys is locality: a member's parameters and optimiser state stay in the
  processor's caches across its k steps, as in its single run, instead of P members' states
  streaming through memory at every step; and only one member's activations are live. The
  metrics come back `[k, P]` like `vmap`'s."""
  states, metrics = jax.lax.map(lambda args: member_steps(*args), (states, values, stream_of))
  return states, jax.tree.map(lambda m: jnp.swapaxes(m, 0, 1), metrics)


def members_as(requested: str, mesh: jax.sharding.Mesh, calls_each_step: bool) -> str:
  """`config.sweep_members_as` resolved. "auto" on CPU devices is "map" for a model without
  convolutions (each member's state stays in the caches over its k steps: 1.08-1.10x the
  sequential runs' member-steps/s on the Fashion-MNIST MLP, against 0.65-0.87x for `vmap`,
  BENCHMARKS.md) and "unroll" for a convolutional one (`programs.calls_each_step`: its member loop
  would be a loop body, and `vmap` makes grouped convolutions); elsewhere "vmap" (an
  accelerator's batched products)."""
  if requested != "auto":
    return requested
  if not parallel.on_cpu(mesh):
    return "vmap"
  return "unroll" if calls_each_step else "map"


class Population:
  """The members of `experiment.config.sweep`, trained together (see the module docstring)."""

  def __init__(self, experiment: Experiment):
    self.experiment = experiment
    self.config = config = experiment.config
    self.sweep = spec.parse(config)
    if self.sweep is None:
      raise ValueError("Population needs config.sweep (empty: train a single run)")
    self.size = self.sweep.size
    seeds = self.sweep.seeds(config.seed)
    self.stream_seeds = ([int(config.seed)] if config.sweep_shared_order
                         else list(dict.fromkeys(seeds)))
    self.stream_of = np.asarray([0 if config.sweep_shared_order else self.stream_seeds.index(s)
                                 for s in seeds], np.int32)
    # The traced hyper-parameters: each swept field but the seed, one float32 value per member.
    self.values = {field: np.asarray(self.sweep.values(field), np.float32)
                   for field in self.sweep.fields if field != "seed"}
    self._bind_loss = losses.traced(config.loss, **config.loss_kwargs.to_dict())
    self._validator = validation.ValidationEvaluator(experiment)
    # The loop calls the one-step program per step on CPU for convolutional models.
    self.per_step = programs.calls_each_step(experiment.mesh,
                                             experiment.abstract_state().params)
    self.members_as = members_as(config.sweep_members_as, experiment.mesh, self.per_step)
    mesh = experiment.mesh
    # The stacked state: replicated, or split along the members on a 2-D mesh
    # (`sweep_member_shards` > 1); each stream's batches `[k, S, batch, ...]` split along their
    # batch axis.
    self.layout = programs.Layout(
        state=(NamedSharding(mesh, PartitionSpec(parallel.MEMBER_AXIS))
               if parallel.MEMBER_AXIS in mesh.axis_names else parallel.replicated(mesh)),
        inputs=NamedSharding(mesh, PartitionSpec(None, parallel.DATA_AXIS)),
        stack=NamedSharding(mesh, PartitionSpec(None, None, parallel.DATA_AXIS)),
        replicated=parallel.replicated(mesh))

  # -- One member's optimiser and loss from its (traced) values.

  def _optimizer(self, values: Mapping[str, Any]):
    return self.experiment.optimizer_with(
        learning_rate=values.get("optimizer.learning_rate"),
        weight_decay=values.get("optimizer.weight_decay"))

  @staticmethod
  def _loss_values(values: Mapping[str, Any]) -> dict[str, Any]:
    return {f.split(".", 1)[1]: v for f, v in values.items() if f.startswith("loss_kwargs.")}

  def _loss(self, values: Mapping[str, Any]):
    """The member's loss: its swept values bound, the config's others fixed; with none swept
    (a seed sweep) the single run's loss (`experiment.build` binds no values either)."""
    return self._bind_loss(**self._loss_values(values))

  def _member_values(self, index: int) -> dict[str, jax.Array]:
    return {f: jnp.asarray(v[index]) for f, v in self.values.items()}

  # -- The `trainee.Trainee` interface.

  def initial_state(self) -> state_lib.TrainState:
    seeds = self.sweep.seeds(self.config.seed)
    states = [self.experiment.initial_state(seed, self._optimizer(self._member_values(i))[1])
              for i, seed in enumerate(seeds)]
    return jax.device_put(stack_trees(states), self.layout.state)

  def abstract_state(self) -> state_lib.TrainState:
    member = self.experiment.abstract_state(tx=self._optimizer(self._member_values(0))[1])
    sharding = self.layout.state
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((self.size, *x.shape), x.dtype, sharding=sharding),
        member)

  def multi_step(self) -> programs.MultiStep:
    """The compiled population step, with the resident training split bound to it when
    `data.on_device` (read here)."""
    resident = (inputs.resident_split(self.experiment) if self.config.data.on_device
                else None)
    return trainee.loop_call(self, resident)

  def program(self, *, per_step: bool) -> Any:
    """`(states, [resident split,] inputs) -> (states, metrics)`: k steps on stacks of stream
    inputs `[k, S, batch, ...]`, or (`per_step`) one step on `[S, batch, ...]`, every member at
    once; the metrics come back `[k, P]` (`[P]` per step)."""
    experiment, config = self.experiment, self.config
    steps_per_epoch = experiment.length.steps_per_epoch
    values = {f: jnp.asarray(v) for f, v in self.values.items()}
    stream_of = jnp.asarray(self.stream_of)

    def member_step(state, member_values, batch):
      schedule, tx = self._optimizer(member_values)
      train_step = step_lib.make_train_step(
          experiment.model, self._loss(member_values), tx, schedule,
          sam_rho=config.optimizer.sam_rho, crl_weight=config.crl_weight,
          steps_per_epoch=steps_per_epoch,
          loss_at_step=experiment.loss_at_step(self._loss_values(member_values)))
      return train_step(state, batch)

    def stream_inputs(stream, stream_inputs_):
      return jax.tree.map(lambda x: x[stream], stream_inputs_)

    if self.members_as == "map":
      def member_one_step(state, member_values, stream, step_inputs, load):
        """One member's step on its stream's share of `step_inputs` `[S, batch, ...]`."""
        return member_step(state, member_values, load(stream_inputs(stream, step_inputs)))

      def one_step(states, step_inputs, load):
        return jax.lax.map(lambda a: member_one_step(*a, step_inputs, load),
                           (states, values, stream_of))

      def k_steps(states, stack, load):
        def member_steps(state, member_values, stream):
          return jax.lax.scan(
              lambda s, step_inputs: member_one_step(s, member_values, stream, step_inputs,
                                                     load), state, stack)
        return _member_after_member(member_steps, states, values, stream_of)
    else:  # vmap or unroll: every member at once on the loaded stream batches
      all_members = _unrolled if self.members_as == "unroll" else _vectorized
      k_steps = None

      def one_step(states, step_inputs, load):
        batches = load(step_inputs)  # one batch per stream `[S, batch, ...]`
        if len(self.stream_seeds) == 1:
          shared = jax.tree.map(lambda x: x[0], batches)
          return all_members(member_step, states, values, shared, shared_batch=True)
        own = jax.tree.map(lambda x: x[stream_of], batches)
        return all_members(member_step, states, values, own, shared_batch=False)

    return programs.train_program(one_step, self.layout, per_step=per_step,
                                  resident=config.data.on_device,
                                  keep_index=config.crl_weight > 0, k_steps=k_steps)

  def train_stream(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    """Each stream seed's inputs, stacked `[S, ...]`."""
    streams = [inputs.seed_stream(self.experiment, start_step, seed)
               for seed in self.stream_seeds]
    for batches in zip(*streams):
      yield {key: np.stack([b[key] for b in batches]) for key in batches[0]}

  def put(self, stacked: Mapping[str, np.ndarray]) -> Any:
    return programs.put(stacked, self.layout, per_step=self.per_step)

  def tags(self, index: int) -> dict[str, Any]:
    return {"member": index, "overrides": self.sweep.members[index]}

  def records(self, metrics: Mapping[str, np.ndarray]) -> list[Record]:
    return [(self.tags(i), {k: float(v[i]) for k, v in metrics.items()})
            for i in range(self.size)]

  def non_finite(self, metrics: Mapping[str, np.ndarray]) -> Failure | None:
    bad = np.flatnonzero(np.asarray(metrics["finite"]) == 0)
    if not bad.size:
      return None
    index = int(bad[0])
    return (index, f"member {index} ({self.sweep.label(index)})",
            {k: v[index] for k, v in metrics.items()})

  def member_variables(self, state: state_lib.TrainState, index: int) -> dict[str, Any]:
    """Member `index`'s model variables, replicated on the mesh (for the predict step)."""
    return parallel.replicate(member_tree(state.variables(), index), self.experiment.mesh)

  def validate(self, state: state_lib.TrainState) -> list[Record]:
    return [(self.tags(i), self._validator.run(self.member_variables(state, i)))
            for i in range(self.size)]

  def _member_results(self, state: state_lib.TrainState, index: int) -> dict[str, Any]:
    """Member `index`'s validation and test results for `sweep.json`."""
    variables = self.member_variables(state, index)
    logits = {role: validation.split_logits(self.experiment, self._validator.predict, variables,
                                            role) for role in ("val", "test")}
    return summary.member_results(*logits["val"], *logits["test"],
                                  num_bins=self.config.eval.num_bins)

  def finish(self, state: state_lib.TrainState, workdir: str, *, only_if_missing: bool
             ) -> list[str]:
    """Writes `<workdir>/sweep.json` (`summary.write`): every member's validation and test
    results, the best members and the mean ± std over seeds (with `only_if_missing`, only when
    the file is not there: a finished sweep whose process stopped while writing it). Returns
    the lines to show: where the file is and its table (`summary.format_table`)."""
    path = os.path.join(workdir, summary.SWEEP_FILE)
    if only_if_missing and os.path.exists(path):
      content = summary.read(workdir)
    else:
      results = [self._member_results(state, i) for i in range(self.size)]
      content = summary.write(workdir, self.sweep, results)
    return [f"{self.size} members; mean ± std over seeds in {path}:",
            *summary.format_table(content).splitlines()]
