"""The one step builder: a trainee's step made into the program a call of the loop runs.

A trainee (a single run, a sweep's population) writes its step once, on one step's inputs:

    one_step(state, inputs, load) -> (state, metrics)

where `inputs` is a batch from the host, or the example positions `{'index': [batch]}` of a
training split resident on the devices (`config.data.on_device`), and `load(inputs)` is the batch
either way (the identity, or the gather from the resident split, `gather_batch`). Two choices
then decide the program, and this module is the only place that makes them:

* **k steps per call, or one.** By default a call runs k steps with `lax.scan` over a `[k, ...]`
  stack of inputs (or the trainee's own order of the k steps, `k_steps`: a population's
  member-after-member `map`). On CPU devices, for a model with convolutions, the program is
  one step without a loop (`calls_each_step`) and the loop calls it k times (`loop_call`).
* **Host batches, or resident data.** With resident data the split is an argument of the
  program (replicated, not donated), not a constant baked into it.

`train_program` returns the jitted program (what the dry run compiles from abstract inputs),
`loop_call` the callable the training loop calls with the inputs that `put` placed.
"""
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from calib_jax.training import parallel

Batch = Mapping[str, jax.Array]
Load = Callable[[Batch], Batch]
OneStep = Callable[[Any, Batch, Load], tuple[Any, dict[str, jax.Array]]]
KSteps = Callable[[Any, Batch, Load], tuple[Any, dict[str, jax.Array]]]
MultiStep = Callable[[Any, Any], tuple[Any, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a program's arguments live on the mesh.

  Attributes:
    state: the (stacked, for a population) training state's sharding.
    inputs: one step's inputs (batch axis over the data axis).
    stack: k steps' inputs `[k, ...]`.
    replicated: what every device holds whole (the resident split, the metrics).
  """
  state: NamedSharding
  inputs: NamedSharding
  stack: NamedSharding
  replicated: NamedSharding


def single_run_layout(mesh: jax.sharding.Mesh) -> Layout:
  """A single run's: the state replicated, each batch split along its batch axis."""
  return Layout(state=parallel.replicated(mesh), inputs=parallel.batch_sharded(mesh),
                stack=parallel.stacked_batch_sharded(mesh), replicated=parallel.replicated(mesh))


def calls_each_step(mesh: jax.sharding.Mesh, params: Any) -> bool:
  """Whether the loop runs a call's k steps as k calls of a one-step program without a loop
  instead of one `lax.scan`: on CPU devices, for a model with convolutions (a parameter of
  rank >= 3: conv kernels; also attention's 3-D projections, a false positive that costs only
  the host's per-call work).

  XLA:CPU runs convolutions inside a loop body far slower than the same convolutions outside
  one (jax-ml/jax#12868): a CIFAR ResNet-20 step at batch 32 took 4.5-6.0 s inside `lax.scan`
  (of 1, 2 or 10 steps) against 0.25-0.32 s as a program of its own. Unrolling the scan
  restores the speed (0.20 s per step, 10 steps compiled in 41 s against 17 s for one) but
  changes the program with k, and with it the float32 rounding, so a run resumed with calls of
  another length would no longer be bitwise the uninterrupted one. One program called k times
  is bitwise the same whatever k, and on CPU such a step takes hundreds of milliseconds, beside
  which the host's ~1 ms per call does not matter. TPU and GPU compile convolutions in loops
  natively and run the scan (the dry run compiles it)."""
  if not parallel.on_cpu(mesh):
    return False
  return any(getattr(leaf, "ndim", 0) >= 3 for leaf in jax.tree.leaves(params))


def gather_batch(resident: Batch, indices: Batch, *, keep_index: bool) -> dict[str, jax.Array]:
  """The batch of examples `indices['index']` (any leading shape, e.g. `[batch]` or a sweep's
  `[streams, batch]`) taken from a resident split (`{key: [N, ...]}`, row i = example i);
  `keep_index` also passes the positions on as `index` (CRL keys its history by them)."""
  index = indices["index"]
  batch = {key: jnp.take(value, index, axis=0, mode="clip") for key, value in resident.items()}
  if keep_index:
    batch["index"] = index
  return batch


def _identity(inputs: Batch) -> Batch:
  return inputs


def of_train_step(train_step: Callable[[Any, Batch], tuple[Any, dict[str, jax.Array]]]
                  ) -> OneStep:
  """A `(state, batch) -> (state, metrics)` step (`step.make_train_step`'s) as a `OneStep`."""
  return lambda state, inputs, load: train_step(state, load(inputs))


def scan_k_steps(one_step: OneStep) -> KSteps:
  """The default order of k steps: `lax.scan` of `one_step` over the stack's leading axis, so
  the result is k calls of `one_step` and each metric comes back stacked `[k]`."""

  def k_steps(state, stack, load):
    return jax.lax.scan(lambda s, inputs: one_step(s, inputs, load), state, stack)

  return k_steps


def train_program(one_step: OneStep, layout: Layout, *, per_step: bool, resident: bool,
                  keep_index: bool = False, k_steps: KSteps | None = None) -> Callable:
  """The jitted training program of a trainee's step.

  Args:
    one_step: `(state, inputs, load) -> (state, metrics)`, one step on one step's inputs.
    layout: where the state and the inputs live (`single_run_layout`, or a population's).
    per_step: one step without a loop, `program(state, [resident,] inputs)`; else k steps on a
      `[k, ...]` stack, `program(state, [resident,] stack)` (another k compiles once more).
    resident: the inputs are positions into a resident split, which comes as the second
      argument (replicated, read by every call, not donated).
    keep_index: with `resident`, also pass the positions on as `batch['index']` (CRL).
    k_steps: the order of the k steps (default `scan_k_steps(one_step)`).

  Returns:
    The program, jitted with the state donated and the metrics replicated.
  """
  if per_step:
    body: KSteps = one_step
  else:
    body = k_steps or scan_k_steps(one_step)
  inputs_sharding = layout.inputs if per_step else layout.stack
  if resident:
    def program(state, resident_split, inputs):
      return body(state, inputs, lambda positions: gather_batch(
          resident_split, positions, keep_index=keep_index))
    in_shardings = (layout.state, layout.replicated, inputs_sharding)
  else:
    def program(state, inputs):
      return body(state, inputs, _identity)
    in_shardings = (layout.state, inputs_sharding)
  return jax.jit(program, in_shardings=in_shardings,
                 out_shardings=(layout.state, layout.replicated), donate_argnums=(0,))


def loop_call(program: Callable, *, per_step: bool,
              resident_split: Mapping[str, jax.Array] | None = None) -> MultiStep:
  """`multi_step(state, placed) -> (state, metrics stacked [k])`, the loop's call, for
  `placed` what `put` returns: `program` with the resident split bound as an argument (not
  closed over inside the jitted function, which would bake it into the program as a
  constant), and, `per_step`, called once per batch of the list, its metrics stacked `[k]`
  as the scan stacks them."""

  def call(state, inputs):
    if resident_split is None:
      return program(state, inputs)
    return program(state, resident_split, inputs)

  def each_step(state, batches):
    metrics = []
    for batch in batches:
      state, step_metrics = call(state, batch)
      metrics.append(step_metrics)
    return state, jax.tree.map(lambda *values: jnp.stack(values), *metrics)

  multi_step = each_step if per_step else call
  # What is bound, for inspection (tests check the split is an argument, not a constant).
  multi_step.program, multi_step.resident_split = program, resident_split
  return multi_step


def unstack(stacked: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
  """The k batches of a host stack `[k, ...]`."""
  steps = len(next(iter(stacked.values())))
  return [{key: value[i] for key, value in stacked.items()} for i in range(steps)]


def put(stacked: Mapping[str, np.ndarray], layout: Layout, *, per_step: bool) -> Any:
  """A host stack of k steps' inputs `[k, ...]` (each process its own share of the batch) as
  global arrays on the mesh: one stack, or (`per_step`) a list of k one-step inputs."""

  def place(arrays, sharding):
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in arrays.items()}

  if per_step:
    return [place(batch, layout.inputs) for batch in unstack(stacked)]
  return place(stacked, layout.stack)
