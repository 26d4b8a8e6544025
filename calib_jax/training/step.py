"""The jit-compiled train and predict steps, shared by every task.

One step function serves classification, segmentation and text: the model maps the batch's
input (`image` or `tokens`) to logits `[..., C]`, the loss averages over `mask`-selected label
entries, and the optimiser updates replicated parameters. Sharding is declared once, at `jit`:
the batch is split over the mesh axis, the state replicated (see `parallel`).
"""
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from calib_jax.training import crl, parallel
from calib_jax.training.state import TrainState

LossFn = Callable[..., jax.Array]
Batch = Mapping[str, jax.Array]

INPUT_KEYS = ("image", "tokens")


def model_input(batch: Batch) -> jax.Array:
  """The model's input of a batch: `image` (vision) or `tokens` (text)."""
  for key in INPUT_KEYS:
    if key in batch:
      return batch[key]
  raise KeyError(f"batch has none of the input keys {INPUT_KEYS}; keys: {sorted(batch)}")


def batch_mask(batch: Batch) -> jax.Array:
  """Valid label entries of a batch (all, when the batch has no `mask`)."""
  if "mask" in batch:
    return batch["mask"].astype(bool)
  return jnp.ones(batch["label"].shape, bool)


def masked_accuracy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Fraction of valid entries whose argmax is the label (0 when none is valid)."""
  correct = (jnp.argmax(logits, -1) == labels) & mask
  return jnp.sum(correct) / jnp.maximum(jnp.sum(mask), 1)


def make_train_step(
    model: nn.Module,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    sam_rho: float = 0.0,
    crl_weight: float = 0.0,
    steps_per_epoch: int = 1,
    loss_at_step: Callable[[jax.Array], LossFn] | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
  """Returns the un-jitted `train_step(state, batch) -> (state, metrics)`.

  Args:
    model: a Flax module called as `model.apply(variables, x, train=True, mutable=
      ['batch_stats'], rngs={'dropout': key})`, returning float32 logits.
    loss_fn: `loss_fn(logits, labels, *, mask, objectness)` (objectness only when the batch
      carries it).
    tx: optimiser.
    schedule: learning rate by step (reported in the metrics only; `tx` applies it).
    sam_rho: SAM neighbourhood radius (0 = plain gradient). Non-adaptive SAM (Foret et al.
      2021): the gradient is taken at `params + rho·g/‖g‖`, with `g` the global-batch gradient;
      BatchNorm statistics come from the first pass.
    crl_weight: weight of the CRL ranking term (0 = off; needs `batch['index']`).
    steps_per_epoch: for CRL's epoch-dependent history normalisation.
    loss_at_step: when given, the loss of step `state.step` (a loss hyper-parameter schedule,
      `Experiment.loss_at_step`), used instead of `loss_fn`.

  The metrics are scalars: `loss` (the objective), `accuracy`, `grad_norm`, `learning_rate`,
  `finite` (1.0 when the loss and gradient norm are finite), and `crl_loss` with CRL.
  """

  def objective(params, state: TrainState, batch: Batch, key: jax.Array):
    variables = {"params": params}
    if state.batch_stats:
      variables["batch_stats"] = state.batch_stats
    logits, updates = model.apply(variables, model_input(batch), train=True,
                                  mutable=["batch_stats"], rngs={"dropout": key})
    labels, mask = batch["label"], batch_mask(batch)
    extra = {"objectness": batch["objectness"]} if "objectness" in batch else {}
    step_loss = loss_fn if loss_at_step is None else loss_at_step(state.step)
    loss = step_loss(logits, labels, mask=mask, **extra)
    aux = {"logits": logits, "batch_stats": updates.get("batch_stats", state.batch_stats)}
    if crl_weight:
      epoch = state.step // steps_per_epoch + 1
      history = crl.normalized_history(state.crl_correctness, epoch)[batch["index"]]
      confidence = jnp.max(jax.nn.softmax(logits.astype(jnp.float32), -1), -1)
      aux["crl_loss"] = crl.ranking_loss(confidence, history, mask)
      loss = loss + crl_weight * aux["crl_loss"]
    return loss, aux

  def train_step(state: TrainState, batch: Batch):
    key = state.step_key()
    grad_fn = jax.value_and_grad(objective, has_aux=True)
    (loss, aux), grads = grad_fn(state.params, state, batch, key)
    if sam_rho > 0:
      scale = sam_rho / (optax.global_norm(grads) + 1e-12)
      perturbed = jax.tree.map(lambda p, g: p + scale * g, state.params, grads)
      (_, _), grads = grad_fn(perturbed, state, batch, key)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)

    logits, mask = aux["logits"], batch_mask(batch)
    correctness = state.crl_correctness
    if crl_weight:
      correct = jnp.argmax(logits, -1) == batch["label"]
      correctness = crl.update_history(correctness, batch["index"], correct, mask)
    grad_norm = optax.global_norm(grads)
    metrics = {
        "loss": loss,
        "accuracy": masked_accuracy(logits, batch["label"], mask),
        "grad_norm": grad_norm,
        "learning_rate": schedule(state.step),
        "finite": (jnp.isfinite(loss) & jnp.isfinite(grad_norm)).astype(jnp.float32),
    }
    if crl_weight:
      metrics["crl_loss"] = aux["crl_loss"]
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              batch_stats=aux["batch_stats"], crl_correctness=correctness)
    return new_state, metrics

  return train_step


def jit_train_step(train_step: Callable, mesh: jax.sharding.Mesh, *,
                   resident: bool = False) -> Callable:
  """Compiles `train_step` for the mesh: state replicated (and donated), batch sharded; with
  `resident`, `resident_step(...)`, whose resident split comes in replicated between them."""
  replicated = parallel.replicated(mesh)
  inputs = ((replicated, replicated, parallel.batch_sharded(mesh)) if resident else
            (replicated, parallel.batch_sharded(mesh)))
  return jax.jit(train_step, in_shardings=inputs, out_shardings=(replicated, replicated),
                 donate_argnums=(0,))


def scan_steps(train_step: Callable) -> Callable:
  """Several optimiser steps in one call: `multi_step(state, batches) -> (state, metrics)`.

  `batches` stacks k batches on a leading axis (`[k, batch, ...]`); `lax.scan` applies
  `train_step` to each in order, so the result is k calls of `train_step`, and each metric
  comes back stacked `[k]`, one value per step. `train_step` is any un-jitted
  `(state, batch) -> (state, metrics)`: the single step of `make_train_step`, or a sweep's
  step vmapped over members.
  """

  def multi_step(state, batches):
    return jax.lax.scan(train_step, state, batches)

  return multi_step


def calls_each_step(mesh: jax.sharding.Mesh, params: Any) -> bool:
  """Whether the loop runs a call's k steps as k calls of a one-step program without a loop
  (`each_step_calls`) instead of one `lax.scan`: on CPU devices, for a model with convolutions
  (a parameter of rank >= 3: conv kernels; also attention's 3-D projections, a false positive
  that costs only the host's per-call work).

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


def each_step_calls(one_step_call: Callable) -> Callable:
  """`multi_step(state, batches) -> (state, metrics)` for `batches` a list of k batches on the
  devices: `one_step_call(state, batch)` (a compiled step without a loop, e.g.
  `jit_train_step`) called on each in turn, its metrics stacked `[k]` as the scan stacks
  them."""

  def multi_step(state, batches):
    metrics = []
    for batch in batches:
      state, step_metrics = one_step_call(state, batch)
      metrics.append(step_metrics)
    return state, jax.tree.map(lambda *values: jnp.stack(values), *metrics)

  for name in ("jitted", "resident"):  # what `single.bind_resident` exposes, for inspection
    if hasattr(one_step_call, name):
      setattr(multi_step, name, getattr(one_step_call, name))
  multi_step.one_step_call = one_step_call
  return multi_step


def gather_batch(resident: Batch, indices: Batch, *, keep_index: bool) -> dict[str, jax.Array]:
  """The batch of examples `indices['index']` (any leading shape, e.g. `[batch]` or a sweep's
  `[streams, batch]`) taken from a resident split (`{key: [N, ...]}`, row i = example i);
  `keep_index` also passes the positions on as `index` (CRL keys its history by them)."""
  index = indices["index"]
  batch = {key: jnp.take(value, index, axis=0, mode="clip") for key, value in resident.items()}
  if keep_index:
    batch["index"] = index
  return batch


def resident_step(train_step: Callable, *, keep_index: bool) -> Callable:
  """One step of `resident_steps` without the loop: `step(state, resident, indices)` gathers
  the batch of `indices['index']` from `resident` and applies `train_step`."""

  def one_step(state, resident, indices):
    return train_step(state, gather_batch(resident, indices, keep_index=keep_index))

  return one_step


def resident_steps(train_step: Callable, *, keep_index: bool) -> Callable:
  """`scan_steps` for a training set resident on the devices (`config.data.on_device`):
  `multi_step(state, resident, indices) -> (state, metrics)`, `indices['index']` stacking k
  steps' example positions `[k, batch]`. Each step gathers its batch from `resident`
  (`gather_batch`) and applies `train_step`, so with the same positions it is `scan_steps` on
  the host's batches: the same values through the same program."""

  one_step = resident_step(train_step, keep_index=keep_index)

  def multi_step(state, resident, indices):
    return jax.lax.scan(lambda s, step_indices: one_step(s, resident, step_indices),
                        state, indices)

  return multi_step


def jit_multi_step(multi_step: Callable, mesh: jax.sharding.Mesh, *,
                   resident: bool = False) -> Callable:
  """Compiles `scan_steps(...)` for the mesh: state replicated (and donated), each batch of the
  stack sharded along its batch axis. Stacks of another length compile once more.

  With `resident` it compiles `resident_steps(...)`: the resident split is an argument
  (replicated, not donated: every call reads it), not a constant of the program, so it is
  transferred once and the program stays small."""
  replicated = parallel.replicated(mesh)
  inputs = ((replicated, replicated, parallel.stacked_batch_sharded(mesh)) if resident else
            (replicated, parallel.stacked_batch_sharded(mesh)))
  return jax.jit(multi_step, in_shardings=inputs, out_shardings=(replicated, replicated),
                 donate_argnums=(0,))


def make_predict_fn(model: nn.Module, mesh: jax.sharding.Mesh) -> Callable[[Any, Batch], jax.Array]:
  """Returns jitted `predict(variables, batch) -> float32 logits`, sharded like the batch."""

  def predict(variables, batch):
    return model.apply(variables, model_input(batch), train=False).astype(jnp.float32)

  return jax.jit(predict,
                 in_shardings=(parallel.replicated(mesh), parallel.batch_sharded(mesh)),
                 out_shardings=parallel.batch_sharded(mesh))
