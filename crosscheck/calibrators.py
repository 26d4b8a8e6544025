"""Cross-check of calib_jax's post-hoc calibrators against reference implementations (not a
test; needs scikit-learn and scipy):

* `isotonic`, `isotonic_ovr` vs scikit-learn's `IsotonicRegression(out_of_bounds="clip")` (float64)
  on the same confidences, with the same top-label renormalisation / one-vs-rest normalisation;
* `vector`, `matrix`, `dirichlet` vs scipy's L-BFGS-B in float64 on the same objective (NLL,
  plus ODIR for matrix/Dirichlet);
* with netcal installed (a `bench` extra): `histogram_ovr`, `isotonic_ovr` vs netcal 1.4's
  `HistogramBinning` / `IsotonicRegression` on the probabilities (netcal's multi-class mode is
  one-vs-all, normalised), and `histogram` vs netcal's binary `HistogramBinning` on the
  top-label (confidence, correct) pairs;
* with netcal installed: `bbq` and `beta` (top-label) vs netcal 1.4's binary `BBQ()` and
  `BetaCalibration()` (defaults) on the top-label (confidence, correct) pairs: a table of the mean
  |calib_jax − netcal| of the calibrated test confidences and the test ECE (15 bins) after each
  (netcal's confidences put into the probability vectors with calib_jax's top-label rule);
  `--fixture PATH` writes a small case (N = 300, C = 5, and its netcal outputs) for the tests;
* with torch-uncertainty installed: `vector`, `matrix` (ODIR off), `dirichlet` (ODIR 1, 1) vs
  its `VectorScaler`, `MatrixScaler`, `DirichletScaler(lambda_reg=1, mu_reg=1)` fitted on the
  same logits (its L-BFGS as shipped: lr 0.1, 200 iterations at most, float32).

Prints the largest absolute difference of the calibrated test probabilities and, for the
scaling fits, of the objective.

  .venv/bin/python crosscheck/calibrators.py --n 5000 --classes 10
  .venv/bin/python crosscheck/calibrators.py --fixture tests/fixtures/netcal_bbq_beta.npz
"""
from absl import app, flags
import jax
import numpy as np
from scipy import optimize
from sklearn.isotonic import IsotonicRegression

from calib_jax import metrics
from calib_jax import posthoc
from calib_jax.posthoc import bbq, beta

_N = flags.DEFINE_integer("n", 5000, "samples in the fitting set and in the test set")
_CLASSES = flags.DEFINE_integer("classes", 10, "classes C")
_FIXTURE = flags.DEFINE_string("fixture", None, "write the small netcal BBQ/beta case here and "
                               "exit (the tests' fixture)")


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
  if _FIXTURE.value:
    _write_fixture(_FIXTURE.value)
    return
  n, num_classes = _N.value, _CLASSES.value
  z, y = _data(n, num_classes, 0)
  zq, yq = _data(n, num_classes, 1)
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
  _netcal(z, y, zq, p, pq, num_classes)
  _netcal_bbq_beta(z, y, zq, yq)
  _torch_uncertainty(z, y, zq, num_classes)


def _netcal(z, y, zq, p, pq, num_classes):
  try:
    from netcal import binning  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"netcal unavailable: {e}")
    return
  for ours, theirs in (("histogram_ovr", binning.HistogramBinning(bins=10)),
                       ("isotonic_ovr", binning.IsotonicRegression())):
    cal = posthoc.fit_calibrator(ours, z, y)
    ref = theirs.fit(p.astype(np.float64), y).transform(pq.astype(np.float64))
    print(f"{ours:<13} vs netcal {type(theirs).__name__} (one-vs-all): "
          f"{np.abs(cal(zq) - ref).max():.2e}")
  conf, right = p.max(1).astype(np.float64), (p.argmax(1) == y).astype(np.float64)
  cal = posthoc.fit_calibrator("histogram", z, y)
  ref = binning.HistogramBinning(bins=10).fit(conf, right).transform(pq.max(1).astype(np.float64))
  top = np.asarray(cal(zq))[np.arange(len(zq)), pq.argmax(1)]
  # calib_jax raises a bin value below r/(1 + r) (r: the runner-up's share of the rest) so the
  # top class stays the argmax (`_replace_top`); netcal returns the bin value as it is.
  rest = np.sort(pq.astype(np.float64), 1)
  r = rest[:, -2] / rest[:, :-1].sum(1)
  kept = ref > r / (1 + r) + 1e-6
  print(f"{'histogram':<13} vs netcal HistogramBinning (binary, top-label): "
        f"{np.abs(top - ref)[kept].max():.2e} on the {kept.sum()} samples whose bin value "
        f"keeps the top class on top, {np.abs(top - ref).max():.2e} on all")


def _netcal_top_label(z, y, zq):
  """netcal's binary BBQ() and BetaCalibration() on the top-label pairs: test confidences."""
  from netcal import binning, scaling  # pylint: disable=import-outside-toplevel
  p, pq = _softmax(z), _softmax(zq)
  conf, right = p.max(1), (p.argmax(1) == y).astype(np.float64)
  out = {}
  for name, model in (("bbq", binning.BBQ()), ("beta", scaling.BetaCalibration())):
    model.fit(conf, right)
    out[name] = np.asarray(model.transform(pq.max(1)), np.float64)
    if name == "bbq":
      out["bbq_models_kept"] = np.asarray(len(model._binning_models))  # pylint: disable=protected-access
    if name == "beta":
      # netcal 1.4's `weights` property reads a missing key; the fitted values are in `_sites`.
      out["beta_weights"] = np.asarray(model._sites["weights"]["values"], np.float64).ravel()  # pylint: disable=protected-access
      out["beta_intercept"] = np.asarray(model._sites["bias"]["values"], np.float64).ravel()  # pylint: disable=protected-access
  return out


def _netcal_bbq_beta(z, y, zq, yq):
  try:
    import netcal  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    print(f"netcal unavailable for BBQ/beta: {e}")
    return
  import contextlib, io  # pylint: disable=import-outside-toplevel
  with contextlib.redirect_stderr(io.StringIO()):  # netcal's tqdm bars
    theirs = _netcal_top_label(z, y, zq)
  pq = _softmax(zq)
  top = pq.argmax(1)
  ece = lambda q: float(metrics.ece(np.asarray(q, np.float32), yq))
  print(f"\nTop-label BBQ and beta, N = {len(z)} (fit) + {len(zq)} (test), C = {z.shape[1]}; "
        f"test ECE (15 bins) before calibration {ece(pq):.4f}")
  print("| calibrator | netcal | mean abs diff of the calibrated confidence | max | "
        "ECE calib_jax | ECE netcal |")
  print("|---|---|---|---|---|---|")
  conf_q = jax.numpy.asarray(pq.max(1), jax.numpy.float32)
  for name, reference in (("bbq", "BBQ() (BIC, equal-width bins, elbow)"),
                          ("beta", "BetaCalibration() (MLE)")):
    cal = posthoc.fit_calibrator(name, z, y)
    # The maps themselves, before the top-label rule raises a value below the runner-up's.
    if name == "bbq":
      mapped = bbq.bbq_confidence(conf_q, cal.edges, cal.bin_values, cal.model_weights,
                                  cal.num_bins)
    else:
      mapped = beta.beta_map(conf_q, cal.a, cal.b, cal.c)
    diff = np.abs(np.asarray(mapped, np.float64) - theirs[name])
    print(f"| `{name}` | {reference} | {diff.mean():.2e} | {diff.max():.2e} | "
          f"{ece(cal(zq)):.4f} | {ece(_replace_top(pq, theirs[name])):.4f} |")
    if name == "bbq":
      print(f"  calib_jax bbq: {int(cal.num_models)} BDeu-scored equal-frequency models, "
            f"{len(cal.model_weights)} kept, largest weight {float(cal.model_weights.max()):.3f} "
            f"(B = {int(cal.num_bins[int(np.argmax(cal.model_weights))])}); netcal kept "
            f"{int(theirs['bbq_models_kept'])} BIC-scored equal-width models")
    else:
      print(f"  (a, b, c): calib_jax ({float(cal.a):.5f}, {float(cal.b):.5f}, {float(cal.c):.5f})"
            f", netcal ({theirs['beta_weights'][0]:.5f}, {theirs['beta_weights'][1]:.5f}, "
            f"{theirs['beta_intercept'][0]:.5f})")


def _write_fixture(path):
  """A small case for tests/test_posthoc_bbq_beta.py: logits, labels and netcal's outputs."""
  import contextlib, io  # pylint: disable=import-outside-toplevel
  z, y = _data(300, 5, 7)
  zq, _ = _data(60, 5, 8)
  with contextlib.redirect_stderr(io.StringIO()):
    theirs = _netcal_top_label(z, y, zq)
  np.savez_compressed(path, logits=z, labels=y.astype(np.int32), test_logits=zq,
                      **{f"netcal_{k}": v for k, v in theirs.items()})
  print(f"wrote {path}")


def _nll(q, y):
  return float(-np.mean(np.log(np.asarray(q, np.float64)[np.arange(len(y)), y])))


def _torch_uncertainty(z, y, zq, num_classes):
  try:
    import torch  # pylint: disable=import-outside-toplevel
    from torch_uncertainty import post_processing as tu  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"torch-uncertainty unavailable: {e}")
    return
  loader = [(torch.from_numpy(z), torch.from_numpy(y.astype(np.int64)))]
  for ours, kw, scaler in (
      ("vector", {}, tu.VectorScaler(num_classes=num_classes)),
      ("matrix", {"odir_lambda": 0.0, "odir_mu": 0.0}, tu.MatrixScaler(num_classes=num_classes)),
      ("dirichlet", {}, tu.DirichletScaler(num_classes=num_classes, lambda_reg=1.0,
                                           mu_reg=1.0))):
    cal = posthoc.fit_calibrator(ours, z, y, **kw)
    scaler.fit(loader, progress=False)
    with torch.no_grad():
      ref = torch.softmax(scaler(torch.from_numpy(zq)), -1).numpy()
      fitted = torch.softmax(scaler(loader[0][0]), -1).numpy()
    print(f"{ours:<13} vs torch-uncertainty {type(scaler).__name__}: probabilities "
          f"{np.abs(np.asarray(cal(zq)) - ref).max():.2e}, fitting-set NLL "
          f"{_nll(cal(z), y):.6f} vs {_nll(fitted, y):.6f}")


if __name__ == "__main__":
  app.run(main)
