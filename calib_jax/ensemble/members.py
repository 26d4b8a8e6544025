"""Each member's own metrics, and the mean member.

The "mean member" of an ensemble is the mean over its M members of each member's own metric,
(1/M) Σ_m metric(softmax(z_m)), which is what an ensemble is compared against (Lakshminarayanan
et al. 2017, Ovadia et al. 2019): not the metric of the averaged prediction (`averaging`).
"""
import functools

import jax
import jax.numpy as jnp

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
  # The checks (shape, label range, mask) run once here, on concrete values, not per member.
  labels, mask = _inputs.member_labels(logits, labels, mask)
  per_member, mean = _member_metrics(logits, labels, mask, num_bins)
  # In `MEMBER_METRICS`' order (a jitted function's dicts come back with their keys sorted).
  return ({name: per_member[name] for name in MEMBER_METRICS},
          {name: mean[name] for name in MEMBER_METRICS})


# Jitted (after the eager checks of `member_metrics`): outside `jit`, slicing the members,
# their softmax, stacking and averaging would each compile a one-operation program of its own
# per shape (~20-60 ms each).
@functools.partial(jax.jit, static_argnames="num_bins")
def _member_metrics(logits: jax.Array, labels: jax.Array, mask: jax.Array | None,
                    num_bins: int) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  flat = logits.reshape(logits.shape[0], -1, logits.shape[-1])

  def one(member_logits):
    probs = jax.nn.softmax(member_logits, axis=-1)
    return {"accuracy": metrics.accuracy(probs, labels, mask),
            "ece": metrics.ece(probs, labels, num_bins, mask),
            "nll": metrics.nll(member_logits, labels, mask, from_logits=True),
            "brier": metrics.brier(probs, labels, mask)}

  # One member at a time (`lax.map`): each member's metrics are one compiled body whatever M
  # is, and memory stays that of one member's probabilities.
  per_member = jax.lax.map(one, flat)
  return per_member, {name: jnp.mean(value) for name, value in per_member.items()}
