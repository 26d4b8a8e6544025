"""Member disagreement: how often two members predict different classes.

    disagreement(x) = (2 / (M (M−1))) · Σ_{m < m'} 1[argmax p_m(x) ≠ argmax p_m'(x)]

the mean over the M(M−1)/2 member pairs (Fort et al. 2019, "Deep ensembles: a loss landscape
perspective", measure diversity this way). In [0, 1]; 0 when all members predict the same
class. Ties in a member's argmax take the first index, as everywhere in calib_jax. It needs
M >= 2 members (a single member has no pair).
"""
import jax
import jax.numpy as jnp

from calib_jax import arrays
from calib_jax.ensemble import _inputs

ArrayLike = jax.typing.ArrayLike


def disagreement(logits: ArrayLike) -> jax.Array:
  """Fraction of member pairs whose predicted classes differ; `[M, ..., C]` -> `[...]`.

  The pairs are counted one member at a time (`lax.scan`), so memory stays `O(N)` beyond the
  predictions `[M, ...]` whatever M is.
  """
  return _disagreement(_inputs.member_logits(logits, min_members=2))


# Jitted (after the eager checks): outside `jit`, each jnp operation would compile a
# one-operation program of its own per shape (~20-60 ms each).
@jax.jit
def _disagreement(logits: jax.Array) -> jax.Array:
  preds = arrays.first_argmax(logits)
  num = preds.shape[0]

  def count(agreeing, pred):
    # Ordered pairs (m, m') with equal predictions, the m = m' pairs included.
    return agreeing + jnp.sum(preds == pred, axis=0, dtype=jnp.int32), None

  agreeing, _ = jax.lax.scan(count, jnp.zeros(preds.shape[1:], jnp.int32), preds)
  return 1.0 - (agreeing - num).astype(jnp.float32) / (num * (num - 1))
