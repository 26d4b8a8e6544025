"""Beta calibration (M. Kull, T. Silva Filho and P. Flach, "Beta calibration: a well-founded and
easily implemented improvement on logistic calibration for binary classifiers", AISTATS 2017),
top-label.

The three-parameter map of the paper's Eq. 4,

    μ(s; a, b, c) = 1 / (1 + 1 / (e^c · s^a / (1 − s)^b)) = σ(a ln s − b ln(1 − s) + c),

is a logistic regression on the two features `(ln s, −ln(1 − s))`; `a = b` gives a logistic
(Platt) map of the log-odds, `a = b = 1, c = 0` the identity. It is fitted by maximum likelihood
as the authors' `betacal` package does: scores clipped to `[ε, 1 − ε]` (`ε` the float32
machine epsilon, the scores' dtype), an (unregularised) logistic regression on both features,
and, where it gives `a < 0` (or else `b < 0`), a refit on the other feature alone with that
parameter 0, so that the map is non-decreasing. The fit is Newton's method on the mean
log-loss in float64 on the host; the apply is a jit-able function of `(a, b, c)`.

Top-label: `s` is the confidence `c = max_k p_k`, the target the correctness; the top class
gets `μ(s)` and the others share the rest in their old proportions
(`_fitting.replace_top_label`, as the top-label `isotonic` and `histogram` calibrators).
"""
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from calib_jax.posthoc import _fitting

ArrayLike = jax.typing.ArrayLike

EPSILON = float(np.finfo(np.float32).eps)
FREE_PARAMETERS = 3


def beta_features(scores):
  """`[ln s, −ln(1 − s)]` of scores clipped to `[ε, 1 − ε]` (numpy or jax, last axis 2)."""
  xp = jnp if isinstance(scores, jax.Array) else np
  scores = xp.clip(scores, EPSILON, 1.0 - EPSILON)
  return xp.stack([xp.log(scores), -xp.log1p(-scores)], axis=-1)


def _mean_log_loss(theta, features, targets):
  logit = features @ theta[:-1] + theta[-1]
  return float(np.mean(np.logaddexp(0.0, logit) - targets * logit))


def fit_logistic(features: np.ndarray, targets: np.ndarray, max_iter: int = 100,
                 tol: float = 1e-10) -> tuple[np.ndarray, int]:
  """Unregularised logistic regression `σ(features · w + c)` by damped Newton (float64).

  Returns `(theta = [w..., c], steps)`; stops when the gradient's largest entry is below `tol`
  or after `max_iter` steps (separable data have no finite optimum: the weights grow until
  then).
  """
  design = np.concatenate([features, np.ones((len(features), 1))], axis=1)
  theta = np.zeros(design.shape[1])
  value = _mean_log_loss(theta, features, targets)
  for step in range(1, max_iter + 1):
    prob = special.expit(design @ theta)
    grad = design.T @ (prob - targets) / len(targets)
    if np.max(np.abs(grad)) < tol:
      return theta, step - 1
    curvature = prob * (1.0 - prob)
    hessian = (design * curvature[:, None]).T @ design / len(targets)
    direction = np.linalg.solve(hessian + 1e-12 * np.eye(len(theta)), grad)
    size = 1.0
    while size > 1e-10:  # backtracking: the full Newton step can overshoot far from the optimum
      candidate = theta - size * direction
      new_value = _mean_log_loss(candidate, features, targets)
      if new_value <= value:
        break
      size /= 2
    else:
      return theta, step
    theta, value = candidate, new_value
  return theta, max_iter


def fit_beta_scores(scores: ArrayLike, targets: ArrayLike, max_iter: int = 100,
                    tol: float = 1e-10) -> dict:
  """Beta calibration of binary `targets [N]` on scores `[N]` in `[0, 1]` (host, float64).

  Returns:
    `{"a", "b", "c": float, "steps": int}` with `a, b ≥ 0` (the authors' refit).
  """
  features = beta_features(np.asarray(scores, np.float64))
  targets = np.asarray(targets, np.float64)
  theta, steps = fit_logistic(features, targets, max_iter, tol)
  a, b, c = theta
  if a < 0:
    (b, c), more = fit_logistic(features[:, 1:], targets, max_iter, tol)
    a, steps = 0.0, steps + more
  elif b < 0:
    (a, c), more = fit_logistic(features[:, :1], targets, max_iter, tol)
    b, steps = 0.0, steps + more
  return {"a": float(a), "b": float(b), "c": float(c), "steps": steps}


def fit_beta(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None, *,
             max_iter: int = 100, tol: float = 1e-10,
             min_samples_per_parameter: float = _fitting.SAMPLES_PER_PARAMETER) -> dict:
  """Top-label beta calibration fitted on held-out logits.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    max_iter: Newton steps at most per logistic fit (default 100).
    tol: stop when every entry of the mean log-loss's gradient is below this (default 1e-10).
    min_samples_per_parameter: refuse fewer valid samples than this times 3 (default 10).

  Returns:
    `{"a", "b", "c": float32, "steps": int32}` (pass `a, b, c` to `apply_beta`).
  """
  if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
    raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}.")
  if isinstance(tol, bool) or not isinstance(tol, (int, float, np.number)) or \
      not np.isfinite(tol) or tol <= 0:
    raise ValueError(f"tol must be a positive finite number, got {tol!r}.")
  conf, correct = _fitting.top_label_targets(logits, labels, mask, "beta calibration")
  _fitting.check_sample_size("beta calibration", len(conf), FREE_PARAMETERS,
                             min_samples_per_parameter,
                             "use temperature scaling or fit on more held-out samples")
  fit = fit_beta_scores(conf, correct, int(max_iter), float(tol))
  return {"a": jnp.float32(fit["a"]), "b": jnp.float32(fit["b"]), "c": jnp.float32(fit["c"]),
          "steps": jnp.int32(fit["steps"])}


def beta_map(scores: jax.Array, a: ArrayLike, b: ArrayLike, c: ArrayLike) -> jax.Array:
  """`σ(a ln s − b ln(1 − s) + c)` on device (scores clipped to `[ε, 1 − ε]`)."""
  features = beta_features(jnp.asarray(scores, jnp.float32))
  return jax.nn.sigmoid(a * features[..., 0] + b * features[..., 1] + c)


def apply_beta(logits: ArrayLike, a: ArrayLike, b: ArrayLike, c: ArrayLike) -> jax.Array:
  """Top-label beta-calibrated probabilities `[N, C]` (jit-able)."""
  probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  return _fitting.replace_top_label(probs, beta_map(jnp.max(probs, axis=-1), a, b, c))
