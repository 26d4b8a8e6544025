"""Each member's own metrics, and the mean member.

The "mean member" of an ensemble is the mean over its M members of each member's own metric,
(1/M) Σ_m metric(softmax(z_m)), which is what an ensemble is compared against (Lakshminarayanan
et al. 2017, Ovadia et al. 2019): not the metric of the averaged prediction (`averaging`).
"""
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import arrays
from calib_jax import metrics
from calib_jax.ensemble import _inputs

ArrayLike = jax.typing.ArrayLike

MEMBER_METRICS = ("accuracy", "ece", "nll", "brier")


def member_metrics(logits: ArrayLike, labels: ArrayLike, num_bins: int = 15,
                   mask: ArrayLike | None = None) -> tuple[dict[str, jax.Array],
                                                           dict[str, jax.Array]]:
  """Accuracy, ECE (equal-width, `num_bins`), NLL and Brier of every member, and their mean.

  Args:
    logits: member-stacked logits `[M, ..., C]`.
    labels: integer labels `[...]`, shared by the members.
    num_bins: ECE bins (static under jit).
    mask: optional bool `[...]`, True where an entry counts.

  Returns:
    `(per_member, mean_member)`: `{name: [M] float32}` and `{name: float32 scalar}`, with
    names `MEMBER_METRICS`. NLL is the exact `−log softmax(z_m)_y` (from the logits).
  """
  num_bins = arrays.check_num_bins(num_bins)
  logits = _inputs.member_logits(logits)
  if tuple(np.shape(labels)) != logits.shape[1:-1]:
    raise ValueError(f"labels shape {tuple(np.shape(labels))} must equal the sample shape "
                     f"{logits.shape[1:-1]} of member-stacked logits {logits.shape}.")
  # The checks (label range, mask) run once here, on concrete values, not per member.
  _, labels, mask = arrays.flatten_probs_labels(logits[0], labels, mask)
  flat = logits.reshape(logits.shape[0], -1, logits.shape[-1])

  def one(member_logits):
    probs = jax.nn.softmax(member_logits, axis=-1)
    return {"accuracy": metrics.accuracy(probs, labels, mask),
            "ece": metrics.ece(probs, labels, num_bins, mask),
            "nll": metrics.nll(member_logits, labels, mask, from_logits=True),
            "brier": metrics.brier(probs, labels, mask)}

  # A Python loop over the (few) members: each member's metrics are the same compiled
  # functions, and the public metrics' concrete-value checks stay valid (they skip tracers).
  rows = [one(member) for member in flat]
  per_member = {name: jnp.stack([row[name] for row in rows]) for name in MEMBER_METRICS}
  return per_member, {name: jnp.mean(value) for name, value in per_member.items()}
