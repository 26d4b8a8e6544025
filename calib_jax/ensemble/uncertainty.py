"""The ensemble's uncertainty scores and their entropy decomposition (natural log).

With `p_m = softmax(z_m)` and `p̄ = (1/M) Σ_m p_m` (`averaging`):

    predictive entropy   H(p̄)                  = −Σ_k p̄_k log p̄_k          (total uncertainty)
    expected entropy     (1/M) Σ_m H(p_m)                                    (aleatoric part)
    mutual information   H(p̄) − (1/M) Σ_m H(p_m)  ≥ 0                       (epistemic part)

The mutual information between the label and the member index is the ensemble's disagreement
in distribution (Depeweg et al. 2018, "Decomposition of uncertainty in Bayesian deep learning
for efficient and risk-sensitive learning"; Malinin & Gales 2018, "Predictive uncertainty
estimation via prior networks"; Malinin et al. 2020, "Ensemble distribution distillation").
It is ≥ 0 by the concavity of H (Jensen) and 0 exactly when all members predict the same
distribution; the float32 difference is clipped at 0 so rounding never makes it negative.

All three are uncertainties (higher = less confident); negate them to use them as confidence
scores (AUROC for misclassification, selective risk).
"""
import jax
import jax.numpy as jnp

from calib_jax.ensemble import _inputs
from calib_jax.ensemble import averaging

ArrayLike = jax.typing.ArrayLike


def _entropy(logp: jax.Array) -> jax.Array:
  # p·log p is 0 where p underflowed to 0 (log p = −inf would otherwise give NaN).
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def decomposition(logits: ArrayLike) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`(predictive_entropy, expected_entropy, mutual_information)` of member-stacked logits
  `[M, ..., C]`, each `[...]`, from one program (the three functions below each take theirs
  from it, so a score is the same bits whichever way it is asked for)."""
  return _decomposition(_inputs.member_logits(logits))


def predictive_entropy(logits: ArrayLike) -> jax.Array:
  """`H(p̄) = −Σ_k p̄_k log p̄_k` of member-stacked logits `[M, ..., C]`; shape `[...]`."""
  return decomposition(logits)[0]


def expected_entropy(logits: ArrayLike) -> jax.Array:
  """`(1/M) Σ_m H(softmax(z_m))` of member-stacked logits `[M, ..., C]`; shape `[...]`."""
  return decomposition(logits)[1]


def mutual_information(logits: ArrayLike) -> jax.Array:
  """`H(p̄) − (1/M) Σ_m H(p_m)` (≥ 0; 0 for identical members); shape `[...]`."""
  return decomposition(logits)[2]


# Jitted (after the eager checks of `decomposition`): outside `jit`, each jnp operation of the
# three formulas would compile a one-operation program of its own per shape (~20-60 ms each);
# one program gives all three.
@jax.jit
def _decomposition(logits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  total = _entropy(averaging.ensemble_log_probs(logits))
  expected = jnp.mean(_entropy(averaging.member_log_probs(logits)), axis=0)
  return total, expected, jnp.maximum(total - expected, 0.0)
