"""Greedy ensemble selection (Caruana et al. 2004, "Ensemble selection from libraries of
models"): forward selection of members by the validation NLL of the averaged probabilities.

Start from the empty ensemble; at each of `k` steps add the candidate member whose addition
gives the lowest validation NLL of the averaged prediction,

    NLL(S) = −(1/N) Σ_i log( (1/|S|) Σ_{m∈S} softmax(z_m(x_i))_{y_i} ) ,

ties going to the lowest member index. With replacement (`with_replacement=True`, Caruana's
variant and the default) a member may be added again, which weights it by its multiplicity, and
the selection never gets stuck; without replacement the k members are distinct (`k <= M`). The
first step picks the best single member. NLL needs only each member's probability of the label,
so the search runs on `[M, N]` log probabilities and costs `O(k·M·N)` after one softmax.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.ensemble import _inputs

ArrayLike = jax.typing.ArrayLike


def check_k(k, num_members: int, with_replacement: bool) -> int:
  """Validates the number of selection steps `k` against the M members."""
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be a positive int (the number of members to select), got {k!r}.")
  if not with_replacement and k > num_members:
    raise ValueError(f"k = {k} is out of range: without replacement k must be in "
                     f"[1, {num_members}] (the number of members).")
  return int(k)


def label_log_probs(logits: ArrayLike, labels: ArrayLike,
                    mask: ArrayLike | None = None) -> jax.Array:
  """Each member's `log softmax(z_m)_y` per sample, `[M, N]` (masked-out samples are 0)."""
  logits = _inputs.member_logits(logits)
  labels, mask = _inputs.member_labels(logits, labels, mask)
  return _label_log_probs(logits, labels, mask)


def greedy_select(val_logits: ArrayLike, val_labels: ArrayLike, k: int, *,
                  with_replacement: bool = True,
                  mask: ArrayLike | None = None) -> jax.Array:
  """Caruana's forward selection of `k` members by validation NLL of `p̄`.

  Args:
    val_logits: the members' validation logits `[M, ..., C]`.
    val_labels: validation labels `[...]`.
    k: number of selection steps (static under jit); the ensemble is the chosen members'
      average, a member chosen twice counting twice.
    with_replacement: Caruana's variant (True, default) or distinct members (`k <= M`).
    mask: optional bool `[...]`, True where a sample counts.

  Returns:
    int32 `[k]`: the chosen member indices in the order they were added.
  """
  val_logits = _inputs.member_logits(val_logits)
  k = check_k(k, val_logits.shape[0], bool(with_replacement))
  labels, mask = _inputs.member_labels(val_logits, val_labels, mask)
  return _greedy_select(val_logits, labels, mask, k, bool(with_replacement))


# Both jitted (after the eager checks): outside `jit`, each jnp operation would compile a
# one-operation program of its own per shape (~20-60 ms each).


@jax.jit
def _label_log_probs(logits: jax.Array, labels: jax.Array, mask: jax.Array | None) -> jax.Array:
  flat = logits.reshape(logits.shape[0], -1, logits.shape[-1])
  logp = jnp.take_along_axis(jax.nn.log_softmax(flat, axis=-1), labels[None, :, None],
                             axis=-1)[..., 0]
  return logp if mask is None else jnp.where(mask[None], logp, 0.0)


@functools.partial(jax.jit, static_argnames=("k", "with_replacement"))
def _greedy_select(logits: jax.Array, labels: jax.Array, mask: jax.Array | None, k: int,
                   with_replacement: bool) -> jax.Array:
  logp = _label_log_probs(logits, labels, mask)
  count = logp.shape[1] if mask is None else jnp.sum(mask, dtype=jnp.float32)

  def step(carry, size):
    log_sum, used = carry
    # Candidate ensembles S ∪ {m}: log p̄_y = logaddexp(log Σ_S p_y, log p_m,y) − log(|S|+1).
    candidate = jnp.logaddexp(log_sum[None], logp) - jnp.log(size + 1.0)
    nll = -jnp.sum(candidate, axis=1) / count
    if not with_replacement:
      nll = jnp.where(used, jnp.inf, nll)
    best = jnp.argmin(nll).astype(jnp.int32)
    return (jnp.logaddexp(log_sum, logp[best]), used.at[best].set(True)), best

  start = (jnp.full(logp.shape[1:], -jnp.inf, jnp.float32), jnp.zeros(logits.shape[0], bool))
  _, chosen = jax.lax.scan(step, start, jnp.arange(k, dtype=jnp.float32))
  return chosen
