"""The training state: every array a run needs to continue exactly where it stopped.

The state holds arrays only (no functions), so orbax saves and restores it as one pytree and
`jax.jit` can take it with a single sharding. The model's `apply` and the optimiser live in the
train step's closure instead (see `step.make_train_step`).
"""
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """Arrays of a training run.

  Attributes:
    step: optimiser steps taken so far (int32 scalar). It is also the data position: the train
      iterator is deterministic given the seed, so batch `step` is the next one to train on.
    params: model parameters.
    batch_stats: BatchNorm running statistics (`{}` for models without them).
    opt_state: optimiser state.
    rng: raw key data (uint32 [2]) of the run's base key; the key for step `s` is
      `fold_in(rng, s)`, so randomness depends only on the seed and the step, never on history.
    crl_correctness: CRL's per-example count of correct predictions so far, float32
      `[num_train_examples]`; None when CRL is off.
  """
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: optax.OptState
  rng: jax.Array
  crl_correctness: jax.Array | None

  def variables(self) -> dict[str, Any]:
    """The Flax variables dict to pass to `model.apply`."""
    if self.batch_stats:
      return {"params": self.params, "batch_stats": self.batch_stats}
    return {"params": self.params}

  def step_key(self) -> jax.Array:
    """The PRNG key of the current step (dropout, stochastic layers)."""
    return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)


def create(
    variables: dict[str, Any],
    tx: optax.GradientTransformation,
    rng: jax.Array,
    crl_num_examples: int = 0,
) -> TrainState:
  """Builds the initial state from freshly initialised (or pre-trained) model variables.

  Args:
    variables: `{'params': ..., 'batch_stats'?: ...}` as returned by `model.init`.
    tx: the optimiser.
    rng: a typed or raw PRNG key; only its key data is stored.
    crl_num_examples: size of the CRL correctness history (0 when CRL is off).
  """
  params = variables["params"]
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      batch_stats=variables.get("batch_stats", {}),
      opt_state=tx.init(params),
      rng=rng,
      crl_correctness=(jnp.zeros((crl_num_examples,), jnp.float32) if crl_num_examples else None),
  )
