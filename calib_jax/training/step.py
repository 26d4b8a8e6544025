"""The jit-compiled train and predict steps, shared by every task.

One step function serves classification, segmentation and text: the model maps the batch's
input (`image` or `tokens`) to logits `[..., C]`, the loss averages over `mask`-selected label
entries, and the optimiser updates the parameters. `make_train_step` returns the step un-jitted:
`programs.train_program` makes it (or a population of it) the compiled program the loop calls,
with its shardings.
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


def make_predict_fn(model: nn.Module, mesh: jax.sharding.Mesh) -> Callable[[Any, Batch], jax.Array]:
  """Returns jitted `predict(variables, batch) -> float32 logits`, sharded like the batch."""

  def predict(variables, batch):
    return model.apply(variables, model_input(batch), train=False).astype(jnp.float32)

  return jax.jit(predict,
                 in_shardings=(parallel.replicated(mesh), parallel.batch_sharded(mesh)),
                 out_shardings=parallel.batch_sharded(mesh))


def make_ensemble_predict_fn(model: nn.Module, mesh: jax.sharding.Mesh
                             ) -> Callable[[Any, Batch], jax.Array]:
  """Returns jitted `predict(stacked_variables, batch) -> float32 logits [M, B, ...]`.

  `stacked_variables` are M members' variables stacked on a leading axis (a sweep's state,
  `state.variables()`); the members' forward passes are ONE program, `jax.vmap` over the
  member axis of the variables with the batch shared, as a sweep's train step is. The
  variables are replicated, the logits' batch axis (axis 1) sharded like the batch.
  """

  def predict(stacked_variables, batch):
    x = model_input(batch)
    member = lambda variables: model.apply(variables, x, train=False).astype(jnp.float32)
    return jax.vmap(member)(stacked_variables)

  return jax.jit(predict,
                 in_shardings=(parallel.replicated(mesh), parallel.batch_sharded(mesh)),
                 out_shardings=parallel.stacked_batch_sharded(mesh))


ShiftImages = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def make_shifted_predict_fn(model: nn.Module, mesh: jax.sharding.Mesh,
                            shift_images: ShiftImages, mean: Any, std: Any, *,
                            stacked: bool = False) -> Callable[..., jax.Array]:
  """Returns jitted `predict(variables, batch, key, param) -> float32 logits` for batches whose
  'image' is uint8 (the data option `raw_images`): ONE program that shifts the images on the
  device, `shift_images(images, key, param) -> uint8 images` (a corruption, a rotation by the
  traced angle `param`, or the identity), normalises them as the input pipeline does,
  `(x / 255 - mean) / std` per channel, and runs the forward pass, of one model or, with
  `stacked`, of M members' stacked variables (`make_ensemble_predict_fn`'s vmap; logits
  `[M, B, ...]`). The key and `param` are replicated, the batch and logits sharded like the
  batch."""
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)

  def predict(variables, batch, key, param):
    images = shift_images(batch["image"], key, param)
    x = (images.astype(jnp.float32) / 255.0 - mean) / std
    forward = lambda v: model.apply(v, x, train=False).astype(jnp.float32)
    return jax.vmap(forward)(variables) if stacked else forward(variables)

  replicated = parallel.replicated(mesh)
  return jax.jit(predict,
                 in_shardings=(replicated, parallel.batch_sharded(mesh), replicated, replicated),
                 out_shardings=(parallel.stacked_batch_sharded(mesh) if stacked
                                else parallel.batch_sharded(mesh)))
