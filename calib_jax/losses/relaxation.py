"""Label relaxation (Lienen & Hüllermeier, AAAI 2021)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

from calib_jax.losses._common import LossInputs, take_label


def label_relaxation(x: LossInputs, *, alpha: float) -> jax.Array:
  """Label relaxation loss: the KL divergence from the credal set `Q = {q : q_y ≥ 1 − α}` to `p`.

      L = 0                                           if p_y ≥ 1 − α
      L = KL(t ‖ p),  t_y = 1 − α,  t_k = α·p_k / Σ_{j≠y} p_j
        = (1−α)·log((1−α)/p_y) + α·log(α/(1−p_y))      otherwise

  (paper Eq. 6, closed form of its appendix). Computed in log space: `log(1 − p_y)` is the
  log-sum-exp of the other classes' log-probabilities, finite for every logit, so both branches
  and their gradients stay finite. Because `t` minimises the KL over the set, the gradient equals
  that of `KL(sg(t) ‖ p)`, i.e. `p − t`, outside the zero region (envelope theorem).
  """
  log_p = jax.nn.log_softmax(x.logits)
  log_p_y = take_label(log_p, x.labels)
  is_label = jax.nn.one_hot(x.labels, x.logits.shape[-1], dtype=bool)
  log_rest = jax.nn.logsumexp(jnp.where(is_label, -jnp.inf, log_p), axis=-1)
  keep = 1.0 - alpha
  kl = (xlogy(keep, keep) - keep * log_p_y) + (xlogy(alpha, alpha) - alpha * log_rest)
  inside = log_p_y >= jnp.log(keep)
  return jnp.where(inside, 0.0, kl)
