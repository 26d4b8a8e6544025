"""Post-hoc calibrators (`fit_calibrator`) and the energy score vs numpy transcriptions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import posthoc
from calib_jax.posthoc import _fitting, binning, isotonic, scaling

N, C = 600, 5


def _data(seed, n=N, c=C, true_t=2.0):
  """Logits and labels drawn from softmax(z / T + class bias): miscalibrated at T = 1."""
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(n, c)) * 3).astype(np.float32)
  p = _np_softmax(z / true_t + rng.normal(size=c))
  labels = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
  return z, labels, rng


@pytest.fixture(scope="module")
def fitted():
  """Every calibrator fitted once on one data set: the tests share its compiled fits.

  Integer logits make many confidences tie, which PAV must pool.
  """
  z, labels, rng = _data(0)
  z = np.round(z)
  calibrators = {name: posthoc.fit_calibrator(name, z, labels)
                 for name in posthoc.calibrator_names()}
  return z, labels, rng, calibrators


def _np_softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_nll(probs, labels):
  return float(-np.mean(np.log(np.asarray(probs, np.float64)[np.arange(len(labels)), labels])))


def _np_pav(x, y):
  """Textbook PAV with a stack (ties in x pooled first): fitted value at each unique x."""
  ux, inverse = np.unique(x, return_inverse=True)
  sums = np.bincount(inverse, y.astype(np.float64))
  counts = np.bincount(inverse).astype(np.float64)
  blocks = []  # [sum, count, number of unique x]
  for s, n in zip(sums, counts):
    blocks.append([s, n, 1])
    while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
      s2, n2, k2 = blocks.pop()
      blocks[-1][0] += s2
      blocks[-1][1] += n2
      blocks[-1][2] += k2
  return ux, np.concatenate([[s / n] * k for s, n, k in blocks])


def _np_replace_top(p, new_top):
  """Top class gets new_top (at least the runner-up's share), the rest keep proportions."""
  p = np.asarray(p, np.float64)
  top = p.argmax(1)
  rows = np.arange(len(p))
  rest = p.copy()
  rest[rows, top] = 0.0
  share = rest / rest.sum(1, keepdims=True)
  r = share.max(1)
  t = np.maximum(new_top, r / (1 + r) + 2.0 ** -20)  # the top class stays strictly first
  out = share * (1 - t)[:, None]
  out[rows, top] = t
  return out


def _check_probabilities(q, shape):
  q = np.asarray(q)
  assert q.shape == shape
  assert np.all(np.isfinite(q)) and q.min() >= 0 and q.max() <= 1 + 1e-6
  np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-5)


def _queries(rng, n=N):
  """Fresh logits of the fitted shape (the calibrators' compiled apply is reused)."""
  zq = (rng.normal(size=(n, C)) * 3).astype(np.float32)
  return zq, np.asarray(jax.nn.softmax(zq))


def test_energy_matches_numpy_and_tends_to_max_logit():
  z, _, _ = _data(1, n=50)
  for t in (1.0, 2.5):
    zt = z.astype(np.float64) / t
    ref = t * (zt.max(1) + np.log(np.exp(zt - zt.max(1, keepdims=True)).sum(1)))
    np.testing.assert_allclose(posthoc.energy(z, temperature=t), ref, rtol=1e-5)
  np.testing.assert_allclose(posthoc.energy(z, 1e-3), z.max(1), atol=1e-2)
  assert np.all(np.isfinite(posthoc.energy(np.array([[1e30, -1e30]], np.float32))))
  with pytest.raises(ValueError, match="temperature must be"):
    posthoc.energy(z, 0.0)


def test_isotonic_top_label_matches_numpy_pav(fitted):
  z, labels, rng, calibrators = fitted
  cal = calibrators["isotonic"]
  p = np.asarray(jax.nn.softmax(z))
  conf, correct = p.max(1), p.argmax(1) == labels
  ux, ref = _np_pav(conf, correct)
  assert len(ux) < N  # ties were there to pool
  scores, values = np.asarray(cal.scores), np.asarray(cal.fitted)
  assert np.all(np.diff(scores) >= 0) and np.all(np.diff(values) >= 0)
  # The jitted softmax may differ from the eager one by an ulp: match scores to the nearest.
  nearest = np.clip(np.searchsorted(ux, scores - 1e-7), 0, len(ux) - 1)
  np.testing.assert_allclose(values, ref[nearest], atol=1e-6)
  # Prediction: linear between fitted scores, clipped beyond, then renormalised.
  zq, pq = _queries(rng)
  q = np.asarray(cal(zq))
  _check_probabilities(q, (N, C))
  np.testing.assert_allclose(q, _np_replace_top(pq, np.interp(pq.max(1), ux, ref)), atol=2e-6)
  assert np.array_equal(q.argmax(1), pq.argmax(1))  # predictions kept
  # Monotone in the confidence wherever the runner-up does not hold the top class up.
  free = np.abs(q.max(1) - np.interp(pq.max(1), ux, ref)) < 1e-6
  order = np.argsort(pq.max(1)[free])
  assert free.sum() > N // 2 and np.all(np.diff(q.max(1)[free][order]) >= -1e-6)


def test_isotonic_ovr_matches_numpy_pav_per_class(fitted):
  z, labels, rng, calibrators = fitted
  cal = calibrators["isotonic_ovr"]
  p = np.asarray(jax.nn.softmax(z))
  zq, pq = _queries(rng)
  per_class = np.empty(pq.shape)
  for k in range(C):
    ux, ref = _np_pav(p[:, k], labels == k)
    per_class[:, k] = np.interp(pq[:, k], ux, ref)
    assert np.all(np.diff(np.asarray(cal.fitted[k])) >= 0)
  q = np.asarray(cal(zq))
  _check_probabilities(q, (N, C))
  np.testing.assert_allclose(q, per_class / per_class.sum(1, keepdims=True), atol=1e-5)


def test_isotonic_pav_worst_cases_and_mask(fitted):
  z, labels, rng, _ = fitted
  # Decreasing targets pool into one block; alternating ones need several rounds.
  x = jnp.arange(12, dtype=jnp.float32)
  _, values, _ = isotonic.pav_binary(x, jnp.arange(12) < 3, jnp.ones(12))
  np.testing.assert_allclose(values, np.full(12, 3 / 12))
  y = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0], bool)
  _, values, rounds = isotonic.pav_binary(x, jnp.asarray(y), jnp.ones(12))
  np.testing.assert_allclose(values, _np_pav(np.arange(12), y)[1], atol=1e-7)
  assert int(rounds) >= 2
  # Masked-out samples (label 255) change nothing: the fit is PAV of the kept ones.
  keep = rng.random(N) < 0.6
  cal = posthoc.fit_calibrator("isotonic", z, np.where(keep, labels, 255), mask=keep)
  p = np.asarray(jax.nn.softmax(z))
  ux, ref = _np_pav(p.max(1)[keep], (p.argmax(1) == labels)[keep])
  zq, pq = _queries(rng)
  np.testing.assert_allclose(cal(zq), _np_replace_top(pq, np.interp(pq.max(1), ux, ref)),
                             atol=2e-6)


@pytest.mark.parametrize("mode", ["top_label", "ovr"])
def test_histogram_binning_matches_numpy(fitted, mode):
  z, labels, rng, _ = fitted
  num_bins = 7
  name = "histogram" if mode == "top_label" else "histogram_ovr"
  cal = posthoc.fit_calibrator(name, z, labels, num_bins=num_bins)
  p = np.asarray(jax.nn.softmax(z))

  def np_bins(s):  # equal width, (lo, hi]
    return np.clip(np.ceil(s * num_bins).astype(int) - 1, 0, num_bins - 1)

  def np_values(s, y):
    b = np_bins(s)
    count = np.bincount(b, minlength=num_bins)
    hits = np.bincount(b, y.astype(np.float64), minlength=num_bins)
    centre = (np.arange(num_bins) + 0.5) / num_bins
    return np.where(count > 0, hits / np.maximum(count, 1), centre)

  zq, pq = _queries(rng)
  if mode == "top_label":
    values = np_values(p.max(1), p.argmax(1) == labels)
    ref = _np_replace_top(pq, values[np_bins(pq.max(1))])
  else:
    values = np.stack([np_values(p[:, k], labels == k) for k in range(C)])
    per_class = values[np.arange(C)[None, :], np_bins(pq)]
    ref = per_class / per_class.sum(1, keepdims=True)
  np.testing.assert_allclose(cal.bin_values, values, atol=1e-6)
  q = np.asarray(cal(zq))
  _check_probabilities(q, (N, C))
  np.testing.assert_allclose(q, ref, atol=2e-6)


def test_vector_scaling_is_temperature_with_equal_weights_and_lowers_nll(fitted):
  z, labels, _, calibrators = fitted
  t = 1.7
  np.testing.assert_allclose(
      jax.nn.softmax(scaling.apply_vector_scaling(z, jnp.full(C, 1 / t), jnp.zeros(C))),
      _np_softmax(z / t), atol=1e-6)
  vector, temp = calibrators["vector"], calibrators["temperature"]
  nll_raw = _np_nll(_np_softmax(z), labels)
  nll_t, nll_v = _np_nll(temp(z), labels), _np_nll(vector(z), labels)
  assert nll_v <= nll_t + 1e-4 < nll_raw  # more parameters fit at least as well
  # The reported objective is the numpy NLL of the fitted map.
  ref = _np_nll(_np_softmax(z * np.asarray(vector.weights) + np.asarray(vector.bias)), labels)
  assert abs(float(vector.nll) - ref) < 1e-4
  # A stationary point: the gradient there is finite and small.
  grad = jax.grad(lambda w, b: -jnp.mean(jnp.take_along_axis(
      jax.nn.log_softmax(z * w + b), jnp.asarray(labels)[:, None], 1)), argnums=(0, 1))(
          vector.weights, vector.bias)
  assert all(np.all(np.isfinite(g)) and float(jnp.linalg.norm(g)) < 1e-3 for g in grad)


# Blocks of 256 rows: an overlapping last one, one, part of one.
@pytest.mark.parametrize("n", [600, 256, 50])
def test_vector_nll_and_grad_is_mean_nll_and_its_gradient(n):
  z, labels, rng = _data(3, n=n)
  mask = rng.random(n) < 0.8  # zero-weight samples count nowhere
  z, labels, weights = _fitting.fit_inputs(z, labels, mask)
  params = {"weights": jnp.asarray(1 + 0.3 * rng.normal(size=C), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=C), jnp.float32)}
  # The references jitted, each one program (op by op, each of their operations compiled on
  # its own for every n).
  want_value, want_grad = jax.jit(jax.value_and_grad(lambda p: _fitting.mean_nll(
      scaling.apply_vector_scaling(z, p["weights"], p["bias"]), labels, weights)))(params)
  value, grad = jax.jit(scaling.vector_nll_and_grad)(z, labels, weights, params)
  np.testing.assert_allclose(value, want_value, rtol=1e-6)
  for name in params:  # float32 sums taken in another order
    np.testing.assert_allclose(grad[name], want_grad[name], rtol=1e-5, atol=1e-7)
  # The fit's objective: `jax.value_and_grad` of it is this pair.
  value, grad = jax.jit(jax.value_and_grad(scaling._vector_nll(z, labels, weights)))(params)
  np.testing.assert_allclose(value, want_value, rtol=1e-6)
  np.testing.assert_allclose(grad["weights"], want_grad["weights"], rtol=1e-5, atol=1e-7)


def test_matrix_and_dirichlet_scaling_reduce_nll_and_regularise(fitted):
  z, labels, _, calibrators = fitted
  nll_raw = _np_nll(_np_softmax(z), labels)
  eye = np.eye(C, dtype=bool)
  for name, features in (("matrix", z.astype(np.float64)),
                         ("dirichlet", np.log(_np_softmax(z)))):
    cal = calibrators[name]
    w, b = np.asarray(cal.weights, np.float64), np.asarray(cal.bias, np.float64)
    ref = _np_softmax(features @ w.T + b)
    np.testing.assert_allclose(cal(z), ref, atol=1e-5)
    penalty = np.sum(w[~eye] ** 2) / (C * (C - 1)) + np.sum(b ** 2) / C  # λ = μ = 1
    assert abs(float(cal.nll) - (_np_nll(ref, labels) + penalty)) < 1e-4
    assert _np_nll(ref, labels) < nll_raw - 0.05
    # Huge λ and μ: off-diagonals and biases vanish; a diagonal, temperature-like map is left.
    stiff = posthoc.fit_calibrator(name, z, labels, odir_lambda=1e6, odir_mu=1e6)
    w_stiff = np.asarray(stiff.weights)
    assert np.abs(w_stiff[~eye]).max() < 1e-3 and np.abs(np.asarray(stiff.bias)).max() < 1e-3
    assert np.all(np.diag(w_stiff) > 0)
    loose = np.abs(w[~eye]).max()
    assert loose > 10 * np.abs(w_stiff[~eye]).max()
  grads = jax.grad(lambda w, b: scaling.odir_penalty(w, b, 1.0, 1.0)
                   + jnp.mean(jax.nn.logsumexp(z @ w.T + b, -1)), argnums=(0, 1))(
                       jnp.eye(C), jnp.zeros(C))
  assert all(np.all(np.isfinite(g)) for g in grads)


def test_overfitting_fits_are_refused_with_one_line(fitted):
  z, labels, _, _ = fitted
  with pytest.raises(ValueError, match=r"^matrix scaling has 25 free parameters.*vector") as e:
    posthoc.fit_calibrator("matrix", z[:200], labels[:200], odir_lambda=0.0)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="Dirichlet calibration has 30 free parameters"):
    posthoc.fit_calibrator("dirichlet", z[:200], labels[:200], odir_lambda=0.0, odir_mu=0.0)
  with pytest.raises(ValueError, match="use temperature scaling"):
    posthoc.fit_calibrator("vector", z[:90], labels[:90])


def test_every_calibrator_gives_probabilities_under_jit_and_any_leading_shape(fitted):
  z, labels, rng, calibrators = fitted
  zq, _ = _queries(rng)
  assert posthoc.calibrator_names() == ["temperature", "vector", "matrix", "dirichlet",
                                        "isotonic", "isotonic_ovr", "histogram",
                                        "histogram_ovr", "bbq", "beta"]
  for name, cal in calibrators.items():
    assert repr(cal).startswith(f"Calibrator({name!r}") and "\n" not in repr(cal)
    q = cal(zq)
    _check_probabilities(q, zq.shape)
    np.testing.assert_allclose(jax.jit(lambda c, x: c(x))(cal, zq), q, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(cal(zq.reshape(20, 30, C)), np.asarray(q).reshape(20, 30, C),
                               atol=1e-6, err_msg=name)
  # The fits trace under jit too.
  values = jax.jit(lambda x, y: binning.fit_histogram_binning(x, y)["bin_values"])(z, labels)
  np.testing.assert_allclose(values, calibrators["histogram"].bin_values, atol=1e-6)
  fit = jax.jit(isotonic.fit_isotonic)(z, labels)
  assert fit["fitted"].shape == (N,)
  # The registry keeps the ends of each block only; they interpolate as the full table does.
  scores, values = isotonic.compress(fit["scores"], fit["fitted"])
  np.testing.assert_allclose(values, calibrators["isotonic"].fitted, atol=1e-6)
  assert len(values) < N // 2
  grid = np.linspace(0, 1, 1001)
  np.testing.assert_allclose(np.interp(grid, scores, values),
                             np.interp(grid, fit["scores"], fit["fitted"]), atol=1e-6)


def test_bad_input_gets_one_line_errors(fitted):
  z, labels, _, calibrators = fitted
  cases = [
      (lambda: posthoc.fit_calibrator("platt", z, labels), "unknown calibrator 'platt'.*vector"),
      (lambda: posthoc.fit_calibrator("matrix", z, labels, lam=1.0),
       "no option 'lam'; valid options: odir_lambda"),
      (lambda: posthoc.fit_calibrator("isotonic", z, labels, num_bins=3),
       "no option 'num_bins'; valid options: none"),
      (lambda: posthoc.fit_calibrator("vector", np.where(z > 4, np.nan, z), labels), "NaN"),
      (lambda: posthoc.fit_calibrator("isotonic", z, labels + 5), "outside"),
      (lambda: posthoc.fit_calibrator("histogram", z[:, :1], labels * 0), "C >= 2"),
      (lambda: posthoc.fit_calibrator("histogram", z, labels, num_bins=0), "num_bins"),
      (lambda: posthoc.fit_calibrator("matrix", z, labels, odir_lambda=-1.0), "odir_lambda"),
      (lambda: calibrators["temperature"](z[:, :3]), "fitted on 5"),
      (lambda: calibrators["temperature"].weights, "fitted parameters: \\['temperature'\\]"),
  ]
  for call, message in cases:
    with pytest.raises((ValueError, AttributeError), match=message) as e:
      call()
    assert "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("seed", [0, 1])
def test_isotonic_host_pav_equals_the_jitted_pav_and_sklearn_with_ties_and_a_mask(seed):
  """Concrete inputs fit on the host (`pav_binary_host`); the jitted PAV (traced inputs) and
  scikit-learn's IsotonicRegression are the references: scores rounded to 2 decimals make many
  ties, a random mask zero-weights a third of the samples."""
  from sklearn.isotonic import IsotonicRegression
  rng = np.random.default_rng(seed)
  n = 3000
  scores = np.round(rng.random(n), 2).astype(np.float32)
  targets = rng.random(n) < scores ** 2
  weights = (rng.random(n) < 0.67).astype(np.float32)
  xs, fitted, _ = isotonic.pav_binary_host(scores, targets, weights)
  xs_jit, fitted_jit, _ = isotonic.pav_binary(jnp.asarray(scores), jnp.asarray(targets),
                                              jnp.asarray(weights))
  np.testing.assert_array_equal(xs, xs_jit)
  np.testing.assert_allclose(fitted, fitted_jit, atol=1e-6)
  keep = weights > 0
  reference = IsotonicRegression(out_of_bounds="clip").fit(
      scores[keep].astype(np.float64), targets[keep].astype(np.float64))
  # Masked entries sit at the top valid score, in its block: the prediction there.
  np.testing.assert_allclose(fitted, reference.predict(xs.astype(np.float64)), atol=1e-6)
  # Through the calibrators: the host fit (concrete) equals the jitted one (traced).
  z = rng.normal(size=(n, 4)).astype(np.float32) * 2
  labels = rng.integers(0, 4, n)
  for fit in (isotonic.fit_isotonic, isotonic.fit_isotonic_ovr):
    host, traced = fit(z, labels, keep), jax.jit(fit)(z, labels, keep)
    np.testing.assert_array_equal(host["scores"], traced["scores"])
    np.testing.assert_allclose(host["fitted"], traced["fitted"], atol=1e-6)


class _CompiledPrograms:
  """The names of the XLA programs compiled (or found in the persistent cache) inside the
  `with` block, as `jax.monitoring` reports them."""

  def __enter__(self):
    self.names = []
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    return self

  def _on_duration(self, event, seconds, **kwargs):
    del seconds
    if event == "/jax/core/compile/backend_compile_duration":
      self.names.append(kwargs.get("fun_name"))

  def __exit__(self, *exc_info):
    jax.monitoring.unregister_event_duration_listener(self._on_duration)


def test_an_isotonic_apply_is_one_program_after_the_softmax_with_the_op_by_op_values():
  # A shape no other test uses, so the call compiles here. Op by op, the top-label part was
  # ~20 one-operation programs (eval.py --predictions compiles each of them).
  z, labels, _ = _data(3, n=131, c=7)
  calibrator = posthoc.fit_calibrator("isotonic", z, labels)
  with _CompiledPrograms() as compiled:
    probs = calibrator(z)
  assert compiled.names.count("jit(_top_label_apply)") == 1, compiled.names
  assert len(compiled.names) <= 7, compiled.names  # the softmax's operations and that one
  with jax.disable_jit():
    op_by_op = calibrator(z)
  np.testing.assert_array_equal(probs, op_by_op)
