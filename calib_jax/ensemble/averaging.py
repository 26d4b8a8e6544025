"""The ensemble's predictive distribution: the members' softmax probabilities, averaged.

A deep ensemble (Lakshminarayanan et al. 2017, "Simple and scalable predictive uncertainty
estimation using deep ensembles") and a hyper-parameter ensemble (Wenzel et al. 2020,
"Hyperparameter ensembles for robustness and uncertainty quantification") predict the uniform
mixture of their M members,

    p̄(y | x) = (1/M) · Σ_m softmax(z_m(x))_y ,

i.e. they average probabilities, not logits. Every metric of the ensemble is the metric of p̄
(NLL = −log p̄_y, ECE on p̄, ...), and post-hoc calibrators of an ensemble take `log p̄` as its
logits (softmax(log p̄) = p̄, since p̄ sums to one).
"""
import jax
import jax.numpy as jnp

from calib_jax.ensemble import _inputs

ArrayLike = jax.typing.ArrayLike


def member_log_probs(logits: ArrayLike) -> jax.Array:
  """Each member's `log softmax(z_m)`, shape `[M, ..., C]`."""
  return jax.nn.log_softmax(_inputs.member_logits(logits), axis=-1)


def ensemble_log_probs(logits: ArrayLike) -> jax.Array:
  """`log p̄ = logsumexp_m log softmax(z_m) − log M`, shape `[..., C]` (float32).

  Computed in log space, so a class every member gives a tiny probability keeps a finite log
  probability (no `log(0)`); usable as the ensemble's logits.

  Args:
    logits: member-stacked logits `[M, ..., C]` (or a list of M arrays `[..., C]`).
  """
  return _log_mean_probs(_inputs.member_logits(logits))


def mean_probs(logits: ArrayLike) -> jax.Array:
  """`p̄ = (1/M) · Σ_m softmax(z_m)`, shape `[..., C]` (float32)."""
  return _mean_probs(_inputs.member_logits(logits))


# The formulas run as one jitted program each (per shape), after the eager checks: called
# outside `jit` (the evaluation's report, a user's script), each of their jnp operations would
# otherwise compile a one-operation program of its own on first use (~20-60 ms each).


@jax.jit
def _log_mean_probs(logits: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jax.nn.logsumexp(logp, axis=0) - jnp.log(jnp.float32(logp.shape[0]))


@jax.jit
def _mean_probs(logits: jax.Array) -> jax.Array:
  return jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
