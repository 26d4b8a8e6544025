"""Cross-check of calib_jax's post-hoc calibrators against reference implementations (not a
test; needs scikit-learn and scipy):

* `isotonic`, `isotonic_ovr` vs scikit-learn's `IsotonicRegression(out_of_bounds="clip")` (float64)
  on the same confidences, with the same top-label renormalisation / one-vs-rest normalisation;
* `vector`, `matrix`, `dirichlet` vs scipy's L-BFGS-B in float64 on the same objective (NLL,
  plus ODIR for matrix/Dirichlet).

Prints the largest absolute difference of the calibrated test probabilities and, for the
scaling fits, of the objective.

  .venv/bin/python crosscheck/calibrators.py --n 5000 --classes 10
"""
from absl import app, flags
import jax
import numpy as np
from scipy import optimize
from sklearn.isotonic import IsotonicRegression

from calib_jax import posthoc

_N = flags.DEFINE_integer("n", 5000, "samples in the fitting set and in the test set")
_CLASSES = flags.DEFINE_integer("classes", 10, "classes C")


def _softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _data(n, c, seed):
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(n, c)) * 4).astype(np.float32)
  p = _softmax(z / 2 + rng.normal(size=c))
  return z, (p.cumsum(1) > rng.random((n, 1))).argmax(1)


def _replace_top(p, t):
  top, rows = p.argmax(1), np.arange(len(p))
  rest = p.copy()
  rest[rows, top] = 0
  share = rest / rest.sum(1, keepdims=True)
  r = share.max(1)
  t = np.maximum(t, r / (1 + r) + 2.0 ** -20)
  out = share * (1 - t)[:, None]
  out[rows, top] = t
  return out


def _scipy_affine(features, labels, kind, odir_lambda=1.0, odir_mu=1.0):
  """The same objective minimised by scipy's L-BFGS-B in float64; returns (q-map, objective)."""
  n, c = features.shape
  off = ~np.eye(c, dtype=bool)

  def unpack(theta):
    w = theta[:c] if kind == "vector" else theta[:c * c].reshape(c, c)
    return w, theta[-c:]

  def objective(theta):
    w, b = unpack(theta)
    logits = features * w + b if kind == "vector" else features @ w.T + b
    shifted = logits - logits.max(1, keepdims=True)
    log_q = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    value = -log_q[np.arange(n), labels].mean()
    grad_logits = np.exp(log_q)
    grad_logits[np.arange(n), labels] -= 1
    grad_logits /= n
    grad_b = grad_logits.sum(0)
    if kind == "vector":
      return value, np.concatenate([(grad_logits * features).sum(0), grad_b])
    grad_w = grad_logits.T @ features
    value += odir_lambda * np.sum(w[off] ** 2) / (c * (c - 1)) + odir_mu * np.sum(b ** 2) / c
    grad_w += 2 * odir_lambda * np.where(off, w, 0) / (c * (c - 1))
    grad_b += 2 * odir_mu * b / c
    return value, np.concatenate([grad_w.ravel(), grad_b])

  init = np.concatenate([np.ones(c) if kind == "vector" else np.eye(c).ravel(), np.zeros(c)])
  result = optimize.minimize(objective, init, jac=True, method="L-BFGS-B",
                             options={"maxiter": 2000, "gtol": 1e-10, "ftol": 1e-15})
  w, b = unpack(result.x)
  apply = (lambda f: _softmax(f * w + b)) if kind == "vector" else (
      lambda f: _softmax(f @ w.T + b))
  return apply, result.fun


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  n, num_classes = _N.value, _CLASSES.value
  z, y = _data(n, num_classes, 0)
  zq, _ = _data(n, num_classes, 1)
  p, pq = np.asarray(jax.nn.softmax(z)), np.asarray(jax.nn.softmax(zq))
  print(f"N = {n}, C = {num_classes}; max |calib_jax − reference| of test probabilities")

  cal = posthoc.fit_calibrator("isotonic", z, y)
  iso = IsotonicRegression(out_of_bounds="clip").fit(p.max(1).astype(np.float64),
                                                     (p.argmax(1) == y).astype(np.float64))
  ref = _replace_top(pq.astype(np.float64), iso.predict(pq.max(1).astype(np.float64)))
  print(f"isotonic      vs sklearn IsotonicRegression: {np.abs(cal(zq) - ref).max():.2e}")

  cal = posthoc.fit_calibrator("isotonic_ovr", z, y)
  per_class = np.stack([IsotonicRegression(out_of_bounds="clip").fit(
      p[:, k].astype(np.float64), (y == k).astype(np.float64)).predict(
          pq[:, k].astype(np.float64)) for k in range(num_classes)], 1)
  ref = per_class / per_class.sum(1, keepdims=True)
  print(f"isotonic_ovr  vs sklearn IsotonicRegression: {np.abs(cal(zq) - ref).max():.2e}")

  for name, kind, features, features_q in (
      ("vector", "vector", z, zq), ("matrix", "matrix", z, zq),
      ("dirichlet", "matrix", np.log(_softmax(z)), np.log(_softmax(zq)))):
    cal = posthoc.fit_calibrator(name, z, y)
    apply, objective = _scipy_affine(np.asarray(features, np.float64), y, kind)
    print(f"{name:<13} vs scipy L-BFGS-B (float64): probabilities "
          f"{np.abs(cal(zq) - apply(np.asarray(features_q, np.float64))).max():.2e}, objective "
          f"{float(cal.nll):.6f} vs {objective:.6f} ({int(cal.steps)} steps)")


if __name__ == "__main__":
  app.run(main)
