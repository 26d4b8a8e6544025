"""Compiles a config's train step and eval step for a topology, from abstract shapes.

The train step is `step.make_train_step` jitted exactly as the training loop jits it (state
replicated and donated, the global batch sharded over every chip of every process); the eval
step is the model's prediction followed by the update of the evaluation's streaming metric
accumulators (`evaluation.validation.accumulators`, classwise bins and histogram included, as `eval.py`
builds them); with `config.eval.shift` also the shifted eval step of `eval.py --shift`, and for a
sweep the ensemble eval step of `eval.py --ensemble` (`eval_programs`). None reads data or
allocates weights: the state is `jax.eval_shape` of its
initialisation, the batch `jax.ShapeDtypeStruct`s from the dataset registry (`shapes`).

What the compiler reports per chip (`StepCompile`):

* memory (`compiled.memory_analysis()`): arguments + temporaries + outputs - aliased (the
  donated state) bytes, the HBM the step needs;
* FLOPs and HBM bytes (`compiled.cost_analysis()` on TPU). The GPU compiler gives no cost
  analysis without a GPU, so for GPU targets (with a GPU too, so that `measure` compares a real
  step with the same counts) FLOPs come from the unoptimised program (global, divided by
  the devices: the optimised module hides cuBLAS/cuDNN calls' FLOPs) and bytes from the
  optimised per-device module, both by XLA's HLO cost analysis (`_gpu_cost`).
"""
import dataclasses
import re
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

from calib_jax.dry_run import eval_programs, shapes
from calib_jax.dry_run.topologies import Topology
# The training code the dry run compiles, imported in one place.
from calib_jax.config import schema
from calib_jax.evaluation import validation
from calib_jax.experiment import Experiment, build
from calib_jax.run import make_trainee
from calib_jax.training import parallel
from calib_jax.training import step as step_lib

# libtpu's out-of-memory messages: "... required for HLO temporaries (16.04G) exceeds available
# HBM (15.75G)" (temporaries only) or "Used 20.5G of 15.75G hbm" (everything).
_OOM_TEMPORARIES = re.compile(r"\(([\d.]+)([KMGT]?)\) exceeds available HBM")
_OOM_USED = re.compile(r"Used ([\d.]+)([KMGT]?) of [\d.]+[KMGT]? hbm")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class CompileError(ValueError):
  """A step the target's compiler rejects (one line: the compiler's message and the op)."""


@dataclasses.dataclass
class StepCompile:
  """What the compiler reports for one step, per chip.

  Attributes:
    fits: the step's memory fits in the chip's HBM.
    per_chip_bytes: HBM the step needs (arguments + temporaries + outputs - aliased).
    argument_bytes, temp_bytes, output_bytes, alias_bytes: `memory_analysis()`'s parts (None
      when the TPU compiler stopped at running out of memory).
    flops: floating-point operations per step.
    bytes_accessed: HBM bytes read and written per step.
    compile_seconds: wall time of lowering and compiling.
  """
  fits: bool
  per_chip_bytes: int
  argument_bytes: int | None = None
  temp_bytes: int | None = None
  output_bytes: int | None = None
  alias_bytes: int | None = None
  flops: float | None = None
  bytes_accessed: float | None = None
  compile_seconds: float = 0.0


def _one_line(error: Exception) -> str:
  """The compiler's message in one line: its first line (the status and the reason, which
  names the op) and, when XLA gives one, the Python line the op was traced from."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  if not lines:
    return type(error).__name__
  reason = lines[0][:300] + ("..." if len(lines[0]) > 300 else "")
  marker = "Suspected Python Code Location:"
  if marker in lines[1:-1]:
    location = lines[lines.index(marker) + 1].split(" [xla::")[0]
    reason += f" (traced at {location})"
  return reason


def _cost(compiled, lowered, topology: Topology) -> tuple[float | None, float | None]:
  if topology.chip.kind == "gpu":  # the same counts on a real GPU as without one
    try:
      return _gpu_cost(compiled, lowered, topology)
    except Exception:  # pylint: disable=broad-except
      pass  # a JAX whose internals moved: the compiler's own analysis (with a GPU), or none
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if cost:
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  return _gpu_cost(compiled, lowered, topology)


def _gpu_cost(compiled, lowered, topology: Topology) -> tuple[float | None, float | None]:
  """FLOPs of the unoptimised global program divided by the devices (the optimised module
  calls cuBLAS/cuDNN, whose FLOPs XLA's cost analysis counts as 0), and HBM bytes of the
  optimised per-device module (after fusion, which decides what is read and written).

  XLA's HLO cost analysis is run by the CPU client: the GPU compiler reports none without a GPU.
  """
  from jax._src.lib import xla_client  # pylint: disable=import-outside-toplevel
  analyse = xla_client._xla.hlo_module_cost_analysis  # pylint: disable=protected-access
  client = jax.devices("cpu")[0].client
  unoptimised = analyse(client, lowered.compiler_ir("hlo").as_hlo_module())
  optimised = analyse(client, compiled.runtime_executable().hlo_modules()[0])
  return (float(unoptimised["flops"]) / topology.num_devices,
          float(optimised["bytes accessed"]))


def _argument_bytes(args: tuple, num_devices: int) -> int:
  """Per-device bytes of abstract arguments (a sharded array holds 1/num_devices of itself)."""
  total = 0
  for leaf in jax.tree.leaves(args):
    size = leaf.size * leaf.dtype.itemsize
    sharded = any(axis is not None for axis in getattr(leaf.sharding, "spec", ()))
    total += size // num_devices if sharded else size
  return total


def _oom_bytes(text: str, args: tuple, topology: Topology) -> int:
  """Per-device bytes of a step that ran out of HBM, from libtpu's message: everything it
  used, or its temporaries plus the arguments; the arguments alone if neither is there."""
  used, temporaries = _OOM_USED.search(text), _OOM_TEMPORARIES.search(text)
  if used:
    return int(float(used.group(1)) * _UNITS[used.group(2)])
  arguments = _argument_bytes(args, topology.num_devices)
  if temporaries:
    return arguments + int(float(temporaries.group(1)) * _UNITS[temporaries.group(2)])
  return arguments


def compile_step(jitted: Callable, args: tuple, topology: Topology, name: str) -> StepCompile:
  """Lowers and compiles `jitted(*args)` (abstract args) and reads memory and cost.

  Running out of HBM is a result (`fits=False`, with the compiler's used bytes), not an error.

  Raises:
    CompileError: any other compiler failure, in one line.
  """
  return compile_executable(jitted, args, topology, name)[0]


def compile_executable(jitted: Callable, args: tuple, topology: Topology, name: str
                       ) -> tuple[StepCompile, Any]:
  """`compile_step` and the compiled program (None when it ran out of HBM), which `measure`
  runs on real chips."""
  start = time.monotonic()
  lowered = jitted.lower(*args)
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text:
      return StepCompile(fits=False, per_chip_bytes=_oom_bytes(text, args, topology),
                         compile_seconds=time.monotonic() - start), None
    raise CompileError(f"{topology.name}: the {name} step does not compile: "
                       f"{_one_line(e)}") from None
  seconds = time.monotonic() - start
  memory = compiled.memory_analysis()
  total = (memory.argument_size_in_bytes + memory.temp_size_in_bytes +
           memory.output_size_in_bytes - memory.alias_size_in_bytes)
  flops, bytes_accessed = _cost(compiled, lowered, topology)
  return StepCompile(
      fits=total <= topology.device.hbm_bytes, per_chip_bytes=int(total),
      argument_bytes=int(memory.argument_size_in_bytes),
      temp_bytes=int(memory.temp_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
      alias_bytes=int(memory.alias_size_in_bytes), flops=flops, bytes_accessed=bytes_accessed,
      compile_seconds=seconds), compiled


def check_batches(config: ml_collections.ConfigDict, topology: Topology) -> None:
  """One-line ValueError when a global batch does not split evenly over the chips."""
  for field in ("batch_size", "eval_batch_size"):
    value = config.data[field]
    if value <= 0 or value % topology.num_devices:
      raise ValueError(f"data.{field}={value} does not divide over the {topology.num_devices} "
                       f"devices of {topology.name}; use a multiple of {topology.num_devices}")


def build_experiment(config: ml_collections.ConfigDict,
                     topology: Topology) -> Experiment:
  """The training loop's build pass for this topology's devices; problems as one line."""
  check_batches(config, topology)
  try:
    return build(config, devices=topology.devices)
  except schema.ConfigError as e:
    problems = [l.strip(" -") for l in str(e).splitlines()[1:]] or [str(e)]
    raise ValueError("invalid config: " + "; ".join(problems)) from None


@dataclasses.dataclass
class Program:
  """What a config compiles to: the train and eval step, and the run's length."""
  train: StepCompile
  eval: StepCompile
  num_train_examples: int
  steps_per_epoch: int
  total_steps: int
  members: int = 1  # a sweep's population: the train step trains them all
  # `eval.py --shift`'s step (with config.eval.shift) and `--ensemble`'s (a sweep's)
  shift_eval: Any = None  # eval_programs.ShiftCompile
  ensemble_eval: StepCompile | None = None


def _abstract(tree: Any, sharding) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


@dataclasses.dataclass
class TrainProgram:
  """A config's train step as the loop jits it, with abstract arguments, before compiling."""
  experiment: Experiment
  jitted: Callable
  args: tuple
  member_state: Any  # one member's abstract state (the eval step's variables)
  members: int
  num_train_examples: int


def train_program(config: ml_collections.ConfigDict, topology: Topology, *,
                  num_train_examples: int | None = None, steps_per_call: int = 1,
                  experiment: Experiment | None = None) -> TrainProgram:
  """The config's train step for `topology`, jitted as the loop jits it, and its abstract
  arguments: with `steps_per_call` k > 1 (or resident data, or a sweep) the k-step program of
  `programs.train_program` on a `[k, ...]` stack of batches, else one step. See `compile_config`.

  `experiment`: the `TrainProgram.experiment` of an earlier call for the same config and
  topology, reused (its config and training-set size) instead of built again.
  """
  if steps_per_call < 1:
    raise ValueError(f"steps_per_call={steps_per_call} must be >= 1")
  if experiment is None:
    config = config.copy_and_resolve_references()
    config.pretrained = None
    experiment = build_experiment(config, topology)
    if num_train_examples is None:
      num_train_examples = shapes.num_train_examples(config)
    example = shapes.model_input(config)
    # One zero example: model.init traces with it; no data is read.
    experiment.data.assume(num_train_examples=num_train_examples,
                           example_input=jnp.zeros(example.shape, example.dtype))
  else:
    config, num_train_examples = experiment.config, experiment.data.num_train_examples()
  k = steps_per_call
  on_device = config.data.on_device
  trainee = make_trainee(experiment)  # the loop's: the same step builder, the same program
  # One step without a loop for a single run with host batches and k = 1 (what the loop's
  # one-step calls compile); else the k-step program on a `[k, ...]` stack.
  per_step = k == 1 and not on_device and not config.sweep
  train_fn = trainee.program(per_step=per_step)
  inputs_sharding = trainee.layout.inputs if per_step else trainee.layout.stack
  if on_device:  # positions of the examples, which are resident
    one_step_inputs = {"index": jax.ShapeDtypeStruct((config.data.batch_size,), jnp.int32)}
  else:
    one_step_inputs = shapes.abstract_batch(config, config.data.batch_size, None, train=True)
  leading = () if per_step else (k,)
  members = 1
  if config.sweep:  # k steps of every member, on each stream's inputs `[k, S, ...]`
    members, streams = trainee.size, len(trainee.stream_seeds)
    leading = (k, streams)
  train_batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      (*leading, *x.shape), x.dtype, sharding=inputs_sharding), one_step_inputs)
  state = trainee.abstract_state()
  member_state = experiment.abstract_state()
  resident = (_abstract_resident(config, num_train_examples, experiment.mesh) if on_device
              else None)
  args = (state, resident, train_batch) if on_device else (state, train_batch)
  return TrainProgram(experiment=experiment, jitted=train_fn, args=args,
                      member_state=member_state, members=members,
                      num_train_examples=num_train_examples)


def compile_config(config: ml_collections.ConfigDict, topology: Topology, *,
                   num_train_examples: int | None = None,
                   eval_step: bool = True) -> Program:
  """Compiles the config's train step (and eval step) for `topology`.

  Args:
    config: a training config (`config.pretrained` is ignored: weights do not change the
      program).
    topology: the target (`topologies.get`).
    num_train_examples: training-set size (default: `shapes.num_train_examples`).
    eval_step: also compile the eval step (else `Program.eval` is None).

  Raises:
    ValueError: a batch that does not divide over the chips, an invalid config.
    CompileError: a step the compiler rejects.
  """
  program = train_program(config, topology, num_train_examples=num_train_examples)
  experiment = program.experiment
  train = compile_step(program.jitted, program.args, topology, "train")
  evaluation = shifted = ensemble = None
  if eval_step:  # one member's (every member is the same program)
    evaluation = compile_step(*_eval_program(experiment, program.member_state), topology,
                              "eval")
    shifted = eval_programs.shift_eval_steps(experiment, program.member_state, topology,
                                             compile_step)
    ensemble = eval_programs.ensemble_eval_step(experiment, program.member_state,
                                                program.members, topology, compile_step)
  length = experiment.length
  return Program(train=train, eval=evaluation, num_train_examples=program.num_train_examples,
                 steps_per_epoch=length.steps_per_epoch, total_steps=length.total_steps,
                 members=program.members, shift_eval=shifted, ensemble_eval=ensemble)


def _abstract_resident(config: ml_collections.ConfigDict, num_train_examples: int,
                       mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """`data.on_device`'s resident training split, replicated (its bytes count in every chip's
  arguments): one training batch's shapes with the batch axis the whole split."""
  rows = shapes.abstract_batch(config, num_train_examples, parallel.replicated(mesh), train=True)
  return {key: value for key, value in rows.items() if key != "index"}


def _eval_program(experiment: Experiment, state: Any) -> tuple[Callable, tuple]:
  """The eval step (predict, then update the metric accumulators) and its abstract inputs."""
  config, model, meta, mesh = (experiment.config, experiment.model, experiment.meta,
                               experiment.mesh)
  replicated = parallel.replicated(mesh)
  accumulators = jax.eval_shape(lambda: validation.accumulators(
      meta, config.eval.num_bins, classwise=True, histogram=True))

  def eval_step(variables, acc, batch):
    logits = model.apply(variables, step_lib.model_input(batch), train=False)
    return acc.update(logits=logits.astype(jnp.float32), labels=batch["label"],
                      mask=batch["mask"])

  jitted = jax.jit(eval_step, in_shardings=(replicated, replicated,
                                            parallel.batch_sharded(mesh)),
                   out_shardings=replicated, donate_argnums=(1,))
  batch = shapes.abstract_batch(config, config.data.eval_batch_size,
                                parallel.batch_sharded(mesh), train=False)
  variables = {k: v for k, v in {"params": state.params,
                                 "batch_stats": state.batch_stats}.items() if v}
  return jitted, (variables, _abstract(accumulators, replicated), batch)
