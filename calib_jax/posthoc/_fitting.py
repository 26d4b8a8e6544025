"""Shared pieces of the post-hoc calibrators: input checks, the weighted NLL, an L-BFGS loop
that runs under `jit`, the sample-size rule, the top-label targets of the host fits, and the
top-label renormalisation."""
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from calib_jax import program_store
from calib_jax import arrays

ArrayLike = jax.typing.ArrayLike

# Rule of thumb for a maximum-likelihood fit: at least ten samples per free parameter (the
# "ten events per variable" of logistic regression, Peduzzi et al. 1996). Penalised parameters
# (ODIR's off-diagonals and biases) do not count as free.
SAMPLES_PER_PARAMETER = 10

# How far above the runner-up a top-label calibrator keeps the top class (`replace_top_label`).
TOP_MARGIN = 2.0 ** -20


def fit_inputs(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike]):
  """Validates held-out `logits [..., C]` (C >= 2, finite), `labels [...]`, `mask [...]`.

  Returns `(logits [N, C] f32, labels [N] i32 (masked entries clipped into range),
  weights [N] f32 in {0, 1})`.
  """
  if np.ndim(logits) >= 1 and np.shape(logits)[-1] < 2:
    raise ValueError(f"calibrators need C >= 2 classes, got logits of shape {np.shape(logits)}.")
  logits, labels, mask = arrays.flatten_probs_labels(logits, labels, mask)
  finite, labels, weights = _fit_arrays(logits, labels, mask)
  if arrays.is_concrete(logits) and not bool(finite):
    raise ValueError("logits hold NaN or inf; calibrators need finite logits.")
  return logits, labels, weights


@program_store.jit
def _fit_arrays(logits, labels, mask):
  """Whether every logit is finite, the labels clipped into range and the 0/1 weights: one
  program (op by op they were four, each compiled or looked up in the persistent cache)."""
  weights = jnp.ones(labels.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
  # Masked entries may hold 255 (ignore_index); their weight is 0, any class index will do.
  return jnp.all(jnp.isfinite(logits)), jnp.clip(labels, 0, logits.shape[1] - 1), weights


class TooFewSamplesError(ValueError):
  """A calibrator refused to fit: too few held-out samples for its free parameters (it would
  overfit). A report that fits several calibrators skips this one and says why."""


def check_sample_size(name: str, num_samples: int, free_parameters: int, minimum_per: float,
                      instead: str) -> None:
  """Refuses a fit with fewer than `minimum_per` samples per free parameter (one line)."""
  if num_samples < minimum_per * free_parameters:
    raise TooFewSamplesError(
        f"{name} has {free_parameters} free parameters but only {num_samples} held-out samples "
        f"(< {minimum_per:g} per parameter): it would overfit; {instead}.")


def mean_nll(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """`Σ_i w_i (logsumexp(z_i) − z_{i,y_i}) / Σ_i w_i` (float32)."""
  z_label = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
  per = jax.nn.logsumexp(logits, axis=-1) - z_label
  return jnp.sum(weights * per) / jnp.maximum(jnp.sum(weights), 1.0)


def minimize_lbfgs(fun: Callable, init, max_iter: int, tol: float):
  """Minimises `fun(params)` with optax's L-BFGS (zoom line search) inside `lax.while_loop`.

  Stops after `max_iter` steps or when the gradient's l2 norm falls below `tol`.

  Returns:
    `(params, steps, value)`.
  """
  solver = optax.lbfgs()
  value_and_grad = optax.value_and_grad_from_state(fun)

  def step(carry):
    params, state = carry
    value, grad = value_and_grad(params, state=state)
    updates, state = solver.update(grad, state, params, value=value, grad=grad, value_fn=fun)
    return optax.apply_updates(params, updates), state

  def keep_going(carry):
    _, state = carry
    count = optax.tree.get(state, "count")
    grad_norm = optax.tree.norm(optax.tree.get(state, "grad"))
    return (count == 0) | ((count < max_iter) & (grad_norm >= tol))

  params, state = lax.while_loop(keep_going, step, (init, solver.init(init)))
  return params, optax.tree.get(state, "count"), optax.tree.get(state, "value")


def replace_top_label(probs: jax.Array, new_top: jax.Array) -> jax.Array:
  """Rows whose top class gets probability `new_top`, the others rescaled to sum to 1.

  The other classes keep their proportions: `p'_k = p_k (1 − t) / (1 − c)` with `c` the old top
  probability and `t` the new one (uniform over the others when `c = 1`). `t` is first raised
  to `r / (1 + r) + 2⁻²⁰`, `r = p_2 / (1 − c)` the runner-up's share: at `r / (1 + r)` the
  top class ties with the runner-up, and the margin keeps it strictly first through float32
  rounding, so a top-label calibrator changes confidences, never predictions.
  """
  num_classes = probs.shape[-1]
  top = arrays.first_argmax(probs)
  is_top = jax.nn.one_hot(top, num_classes, dtype=bool)
  rest_mass = jnp.sum(jnp.where(is_top, 0.0, probs), axis=-1)
  has_rest = rest_mass > 0
  share = jnp.where(has_rest[:, None], probs / jnp.where(has_rest, rest_mass, 1.0)[:, None],
                    1.0 / max(num_classes - 1, 1))
  runner_up = jnp.max(jnp.where(is_top, 0.0, share), axis=-1)
  t = jnp.clip(jnp.maximum(new_top, runner_up / (1.0 + runner_up) + TOP_MARGIN), 0.0, 1.0)
  return jnp.where(is_top, t[:, None], (1.0 - t)[:, None] * share)


@jax.jit
def _top_label(logits, labels):
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.max(probs, axis=-1), arrays.first_argmax(probs) == labels


def top_label_targets(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike],
                      method: str) -> tuple[np.ndarray, np.ndarray]:
  """Host copies of the valid samples' confidences (float32, as the apply sees them) and
  correctness; refuses a split whose labels or whose correctness hold one value (one line)."""
  logits, labels, weights = fit_inputs(logits, labels, mask)
  conf, correct = _top_label(logits, labels)
  valid = np.asarray(weights) > 0
  conf, correct, labels = np.asarray(conf)[valid], np.asarray(correct)[valid], np.asarray(
      labels)[valid]
  if np.all(labels == labels[0]):
    raise ValueError(f"{method} needs held-out labels of at least two classes; every one of the "
                     f"{len(labels)} valid labels is {int(labels[0])}.")
  if np.all(correct == correct[0]):
    verdict = "correct" if correct[0] else "wrong"
    raise ValueError(f"{method} needs both correct and wrong top-label predictions on the "
                     f"held-out split; all {len(labels)} are {verdict}.")
  return conf, correct
