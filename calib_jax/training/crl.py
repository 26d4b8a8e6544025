"""Correctness Ranking Loss (CRL, Moon et al. 2020), the ACLS Table 3 baseline.

CRL adds to the classification loss a ranking term asking that an example that has been
classified correctly more often during training get a higher confidence than one classified
correctly less often. It lives in `training` rather than `losses` because it needs a history that
outlives the batch: the number of times each training example has been predicted correctly so
far, indexed by the example's position in the training set (`batch['index']`).

Following the official code (daintlab/confidence-aware-learning): confidence is the maximum
softmax probability; each example `i` of the batch is paired with example `i+1` (cyclically);
the history is min-max normalised with maximum = the current epoch number (1-based);
with `h1, h2` the normalised counts of a pair, the target is `sign(h1 − h2)` and the margin
`|h1 − h2|`, and the per-pair loss is `relu(−sign(h1 − h2)·(c1 − c2) + |h1 − h2|)`
(0 for ties), averaged over the pairs. The history is updated after the loss is computed.
"""
import jax
import jax.numpy as jnp


def normalized_history(correctness: jax.Array, epoch: jax.Array) -> jax.Array:
  """Min-max normalised correctness counts, with the maximum fixed to the current epoch.

  Args:
    correctness: float [N] counts of correct predictions for every training example.
    epoch: 1-based index of the current epoch (the most times an example can have been right).
  """
  low = jnp.min(correctness)
  return (correctness - low) / jnp.maximum(epoch - low, 1e-12)


def ranking_loss(confidence: jax.Array, history: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean pairwise margin-ranking loss between each example and the next one in the batch.

  Args:
    confidence: float [B] max-softmax confidence (differentiated).
    history: float [B] normalised correctness of the batch's examples (not differentiated).
    mask: bool [B]; a pair counts only when both of its examples are valid.
  """
  history = jax.lax.stop_gradient(history)
  other_conf = jnp.roll(confidence, -1)
  other_hist = jnp.roll(history, -1)
  target = jnp.sign(history - other_hist)
  margin = jnp.abs(history - other_hist)
  per_pair = jnp.where(target != 0,
                       jax.nn.relu(-target * (confidence - other_conf) + margin), 0.0)
  pair_mask = mask & jnp.roll(mask, -1)
  return jnp.sum(per_pair * pair_mask) / jnp.maximum(jnp.sum(pair_mask), 1)


def update_history(correctness: jax.Array, index: jax.Array, correct: jax.Array,
                   mask: jax.Array) -> jax.Array:
  """Adds 1 to the count of each valid example of the batch that was classified correctly."""
  return correctness.at[index].add(jnp.where(mask & correct, 1.0, 0.0))
