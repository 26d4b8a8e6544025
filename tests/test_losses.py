"""Losses vs docs/conventions.md#losses: numpy references, shapes, stability, errors (gradients:
test_losses_gradients.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import losses

RNG = np.random.default_rng(0)
B, C = 6, 5


# --- independent float64 numpy references (not calling the library) -----------------------------

def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_onehot(y, c):
  return np.eye(c)[y]


def ref_ce(z, y):
  return -np_log_softmax(z)[np.arange(len(y)), y]


def ref_ls(z, y, epsilon=0.1):
  q = (1 - epsilon) * np_onehot(y, z.shape[-1]) + epsilon / z.shape[-1]
  return -(q * np_log_softmax(z)).sum(-1)


def ref_focal(z, y, gamma=3.0):
  p_y = np.exp(np_log_softmax(z))[np.arange(len(y)), y]
  return -(1 - p_y) ** gamma * np.log(p_y)


def ref_flsd(z, y, gamma=3.0):
  p_y = np.exp(np_log_softmax(z))[np.arange(len(y)), y]
  g = np.where(p_y < 0.2, 5.0, np.where(p_y < 0.5, 3.0, gamma))
  return -(1 - p_y) ** g * np.log(p_y)


def ref_ecp(z, y, beta=0.1):
  logp = np_log_softmax(z)
  entropy = -(np.exp(logp) * logp).sum(-1)
  return ref_ce(z, y) - beta * entropy


def ref_mbls(z, y, margin=10.0, alpha=0.1):
  d = z.max(-1, keepdims=True) - z
  return ref_ce(z, y) + alpha * np.maximum(d - margin, 0).mean(-1)


def ref_acls(z, y, margin=10.0, lambda_pos=0.1, lambda_neg=0.01, winner_term="max"):
  out = []
  for zi, yi in zip(z, y):
    top = int(np.argmax(zi))
    gap = zi[top] - zi.min() if winner_term == "max_minus_min" else zi[top]
    winner = max(gap - margin, 0) ** 2
    losers = [max(zi[top] - zi[j] - margin, 0) ** 2 for j in range(len(zi)) if j != top]
    out.append(lambda_pos * winner + lambda_neg * np.mean(losers))
  return ref_ce(z, y) + np.array(out)


def ref_lr(z, y, alpha=0.1):
  p_y = np.exp(np_log_softmax(z))[np.arange(len(y)), y]
  kl = (1 - alpha) * np.log((1 - alpha) / p_y) + alpha * np.log(alpha / (1 - p_y))
  return np.where(p_y >= 1 - alpha, 0.0, kl)


def ref_als_target(y, objectness, c, beta=1.0):
  t = []
  for yi, o in zip(y, objectness):
    if o < 0:
      t.append(np.full(c, 1.0 / c))
      continue
    a = 1 - o
    row = np.full(c, a / (c - 1))
    row[yi] = 1 - a
    hard = np_onehot(yi, c)
    t.append(beta * row + (1 - beta) * hard)
  return np.array(t)


def ref_als(z, y, objectness, beta=1.0):
  return -(ref_als_target(y, objectness, z.shape[-1], beta) * np_log_softmax(z)).sum(-1)


def ref_mdca(z, y, beta=1.0):
  p = np.exp(np_log_softmax(z))
  term = np.abs(p.mean(0) - np_onehot(y, z.shape[-1]).mean(0)).mean()
  return ref_ce(z, y).mean() + beta * term


def ref_cpc(z, y, lambda_1v1=1.0, lambda_be=1.0):
  """docs/conventions.md#cpc with probabilities: log σ(z_a − z_b) = log(p_a / (p_a + p_b))."""
  p = np.exp(np_log_softmax(z))
  c = z.shape[-1]
  out = []
  for pi, yi in zip(p, y):
    others = [k for k in range(c) if k != yi]
    one = np.mean([-np.log(pi[yi] / (pi[yi] + pi[k])) for k in others])
    be = -sum(np.log(pi[k] / (pi[k] + pi[l])) for k in others for l in others if l != k)
    out.append(lambda_1v1 * one + lambda_be * be / (2 * (c - 1) * (c - 2)))
  return ref_ce(z, y) + np.array(out)


def ref_mmce(z, y, weight=1.0):
  p = np.exp(np_log_softmax(z))
  r = p.max(-1)
  correct = p.argmax(-1) == y
  k = lambda a, b: np.exp(-np.abs(a[:, None] - b[None, :]) / 0.4)
  rc, rw = r[correct], r[~correct]
  mc, mw = len(rc), len(rw)
  total = 0.0
  if mc:
    total += ((1 - rc)[:, None] * (1 - rc)[None, :] * k(rc, rc)).sum() / mc**2
  if mw:
    total += (rw[:, None] * rw[None, :] * k(rw, rw)).sum() / mw**2
  if mc and mw:
    total -= 2 * ((1 - rc)[:, None] * rw[None, :] * k(rc, rw)).sum() / (mc * mw)
  return ref_ce(z, y).mean() + weight * np.sqrt(max(total, 0.0))


def ref_maxsup(z, y, alpha=0.1):
  return ref_ce(z, y) + alpha * (z.max(-1) - z.mean(-1))


def ref_logitnorm(z, y, temperature=0.04):
  norm = np.sqrt((z * z).sum(-1, keepdims=True)) + 1e-7
  return ref_ce(z / (temperature * norm), y)


PER_EXAMPLE_REFS = {
    "ce": ref_ce, "ls": ref_ls, "focal": ref_focal, "flsd": ref_flsd, "ecp": ref_ecp,
    "mbls": ref_mbls, "acls": ref_acls, "lr": ref_lr, "cpc": ref_cpc, "maxsup": ref_maxsup,
    "logitnorm": ref_logitnorm,
}


def random_batch(b=B, c=C, scale=4.0, seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(b, c)) * scale, rng.integers(0, c, size=b)


def call(name, z, y, **kw):
  extra = {}
  if name == "als":
    extra["objectness"] = kw.pop("objectness", jnp.linspace(-0.5, 1.0, z.shape[0]))
  return losses.get(name, **kw)(jnp.asarray(z, jnp.float32), jnp.asarray(y), **extra)


# --- registry -----------------------------------------------------------------------------------

def test_names_cover_the_spec_table():
  assert losses.names() == ["ce", "ls", "focal", "flsd", "ecp", "mbls", "acls", "lr", "als",
                            "mdca", "cpc", "mmce", "maxsup", "logitnorm"]


# --- values against the numpy references ---------------------------------------------------------

# Several tests below check every loss on the same inputs: their cases are computed in one
# jitted program per test (a module fixture), each case still asserted by its own test. Called
# op by op, each case compiled each primitive of its loss at its shapes (~0.3 s a case); the
# losses are jit-able by contract, and test_jit_vmap_and_bfloat16 checks each one op by op
# against its jitted form.
SCALES = (1.0, 8.0)


def _per_example_kw(name):
  # Small margins so the margin terms are active at this logit scale.
  return {"margin": 2.0} if name in ("mbls", "acls") else {}


@pytest.fixture(scope="module")
def per_example_values():
  """{(name, scale): the loss} of test_per_example_values_match_numpy, one program."""
  batches = [random_batch(scale=scale, seed=int(scale)) for scale in SCALES]
  fns = {name: losses.get(name, **_per_example_kw(name)) for name in PER_EXAMPLE_REFS}

  @jax.jit
  def values(zs, ys):
    return {name: [fn(z, y) for z, y in zip(zs, ys)] for name, fn in fns.items()}

  got = values([jnp.asarray(z, jnp.float32) for z, _ in batches],
               [jnp.asarray(y) for _, y in batches])
  return {(name, scale): got[name][i] for name in fns for i, scale in enumerate(SCALES)}


@pytest.mark.parametrize("name", sorted(PER_EXAMPLE_REFS))
@pytest.mark.parametrize("scale", SCALES)
def test_per_example_values_match_numpy(name, scale, per_example_values):
  z, y = random_batch(scale=scale, seed=int(scale))
  kw = _per_example_kw(name)
  np.testing.assert_allclose(per_example_values[name, scale],
                             PER_EXAMPLE_REFS[name](z, y, **kw).mean(), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kw", [dict(epsilon=0.0), dict(epsilon=0.3), dict(epsilon=1.0)])
def test_ls_hparams(kw):
  z, y = random_batch(seed=3)
  np.testing.assert_allclose(call("ls", z, y, **kw), ref_ls(z, y, **kw).mean(), rtol=1e-5)


@pytest.mark.parametrize("winner_term", ["max", "max_minus_min"])
def test_acls_winner_terms_match_numpy(winner_term):
  z, y = random_batch(scale=6.0, seed=4)
  kw = dict(margin=3.0, winner_term=winner_term)
  np.testing.assert_allclose(call("acls", z, y, **kw), ref_acls(z, y, **kw).mean(), rtol=1e-5)


def test_acls_default_is_the_official_code():
  assert losses.default_hparams("acls") == {"margin": 10.0, "lambda_pos": 0.1,
                                            "lambda_neg": 0.01, "winner_term": "max"}


@pytest.mark.parametrize("c", [5, 12])
def test_cpc_normalisation_matches_spec(c):
  z, y = random_batch(b=7, c=c, scale=3.0, seed=21)
  kw = dict(lambda_1v1=0.7, lambda_be=1.3)
  np.testing.assert_allclose(call("cpc", z, y, **kw), ref_cpc(z, y, **kw).mean(), rtol=1e-5)


def test_cpc_terms_convert_from_the_supplements_plain_sums():
  """ACLS supplement Eqs. 2-4 sum where the public code averages: lambda x (C-1), x 4(C-1)(C-2)."""
  c = 10
  z, y = random_batch(b=5, c=c, scale=2.0, seed=22)
  p = np.exp(np_log_softmax(z))
  sums_1v1, sums_be = [], []
  for pi, yi in zip(p, y):
    others = [k for k in range(c) if k != yi]
    sums_1v1.append(-sum(np.log(pi[yi] / (pi[yi] + pi[k])) for k in others))
    sums_be.append(-sum(np.log(pi[k] / (pi[k] + pi[l])) + np.log(pi[l] / (pi[k] + pi[l]))
                        for k in others for l in others if l != k))
  ce = ref_ce(z, y).mean()
  np.testing.assert_allclose(call("cpc", z, y, lambda_1v1=c - 1.0, lambda_be=0.0) - ce,
                             np.mean(sums_1v1), rtol=1e-5)
  np.testing.assert_allclose(call("cpc", z, y, lambda_1v1=0.0,
                                  lambda_be=4.0 * (c - 1) * (c - 2)) - ce,
                             np.mean(sums_be), rtol=1e-5)


def test_als_matches_numpy_and_targets():
  z, y = random_batch(seed=5)
  obj = np.array([-1.0, 0.0, 0.25, 0.5, 0.9, 1.0])
  for beta in (1.0, 0.5, 0.0):
    np.testing.assert_allclose(call("als", z, y, objectness=jnp.asarray(obj), beta=beta),
                               ref_als(z, y, obj, beta).mean(), rtol=1e-5)
  t = np.asarray(losses.objectness_targets(jnp.asarray(y), jnp.asarray(obj, jnp.float32), C, 1.0))
  np.testing.assert_allclose(t, ref_als_target(y, obj, C), atol=1e-7)
  np.testing.assert_allclose(t.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("name,ref", [("mdca", ref_mdca), ("mmce", ref_mmce)])
def test_batch_losses_match_numpy(name, ref):
  z, y = random_batch(b=16, scale=2.0, seed=6)
  np.testing.assert_allclose(call(name, z, y), ref(z, y), rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(call(name, z, y, **{"beta" if name == "mdca" else "weight": 0.3}),
                             ref(z, y, 0.3), rtol=2e-5, atol=1e-6)


def test_hand_derived_values():
  y = jnp.array([0, 3])
  uniform = jnp.zeros((2, C))
  log_c = np.log(C)
  np.testing.assert_allclose(call("ce", uniform, y), log_c, rtol=1e-6)
  np.testing.assert_allclose(call("ls", uniform, y), log_c, rtol=1e-6)
  np.testing.assert_allclose(call("ecp", uniform, y, beta=0.5), log_c - 0.5 * log_c, rtol=1e-6)
  np.testing.assert_allclose(call("focal", uniform, y, gamma=2.0), (1 - 1 / C) ** 2 * log_c,
                             rtol=1e-6)
  # LR: KL((1-α, α/(C-1), ...) ‖ uniform) = (1-α)log((1-α)C) + α log(αC/(C-1))
  a = 0.1
  np.testing.assert_allclose(call("lr", uniform, y, alpha=a),
                             (1 - a) * np.log((1 - a) * C) + a * np.log(a * C / (C - 1)), rtol=1e-5)
  # A confident correct prediction is inside LR's zero region.
  confident = jnp.array([[9.0, 0, 0, 0, 0], [0, 0, 0, 9.0, 0]])
  assert float(call("lr", confident, y, alpha=a)) == 0.0
  # Margins not exceeded: MbLS and ACLS reduce to CE.
  for name in ("mbls", "acls"):
    np.testing.assert_allclose(call(name, confident, y), call("ce", confident, y), rtol=1e-6)
  # γ = 0 focal is CE.
  z, yy = random_batch(seed=7)
  np.testing.assert_allclose(call("focal", z, yy, gamma=0.0), call("ce", z, yy), rtol=1e-6)
  # MaxSup is MbLS with margin 0 (mean_k relu(max z − z_k) = max z − mean z), any α.
  np.testing.assert_allclose(call("maxsup", z, yy, alpha=0.3),
                             call("mbls", z, yy, margin=0.0, alpha=0.3), rtol=1e-6)
  # MaxSup on equal logits is CE (max = mean); LogitNorm at z = 0 too (u = 0: log C).
  np.testing.assert_allclose(call("maxsup", uniform + 2.0, y), log_c, rtol=1e-6)
  np.testing.assert_allclose(call("logitnorm", uniform, y), log_c, rtol=1e-6)
  # LogitNorm sees only the direction of z: CE of z scaled to norm 1/τ, whatever z's norm.
  direction = z / np.linalg.norm(z, axis=-1, keepdims=True)
  for scale in (0.5, 30.0):
    np.testing.assert_allclose(call("logitnorm", scale * z, yy, temperature=0.25),
                               ref_ce(direction / 0.25, yy).mean(), rtol=1e-5)


# --- shapes, masks, transformations --------------------------------------------------------------

ALL_KW = {"mbls": {"margin": 1.0}, "acls": {"margin": 1.0}}


def objectness_for(name, shape):
  return {"objectness": jnp.linspace(-0.2, 1.0, int(np.prod(shape))).reshape(shape)} \
      if name == "als" else {}


@pytest.fixture(scope="module")
def segmentation_values():
  """{name: (the loss of a [2, 3, 4] segmentation batch with masked pixels, the loss of its
  valid pixels flattened)} of every loss, one program; and the `ce` of the first op by op."""
  rng = np.random.default_rng(15)
  z = jnp.asarray(rng.normal(size=(2, 3, 4, C)) * 3, jnp.float32)
  y = rng.integers(0, C, size=(2, 3, 4))
  mask = rng.random((2, 3, 4)) > 0.3
  y_ignore = jnp.asarray(np.where(mask, y, 255))  # ignore index at masked pixels
  obj = objectness_for("als", (2, 3, 4))["objectness"]
  fns = {name: losses.get(name, **ALL_KW.get(name, {})) for name in losses.names()}

  @jax.jit
  def values(z, y_ignore, mask, obj, flat_z, flat_y, flat_obj):
    return {name: (fn(z, y_ignore, mask=mask, **({"objectness": obj} if name == "als" else {})),
                   fn(flat_z, flat_y, **({"objectness": flat_obj} if name == "als" else {})))
            for name, fn in fns.items()}

  got = values(z, y_ignore, jnp.asarray(mask), obj, z[mask], jnp.asarray(y[mask]), obj[mask])
  # Op by op the labels are checked on the host: the ignore index is accepted where masked.
  eager_ce = fns["ce"](z, y_ignore, mask=jnp.asarray(mask))
  return got, eager_ce


@pytest.mark.parametrize("name", losses.names())
def test_segmentation_equals_flattened_valid_pixels(name, segmentation_values):
  got, eager_ce = segmentation_values
  seg, flat = got[name]
  np.testing.assert_allclose(seg, flat, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(eager_ce, got["ce"][0], rtol=1e-6)


def test_objectness_per_image_broadcasts_over_pixels():
  rng = np.random.default_rng(16)
  z = jnp.asarray(rng.normal(size=(2, 3, 3, C)), jnp.float32)
  y = jnp.asarray(rng.integers(0, C, size=(2, 3, 3)))
  per_image = jnp.array([0.25, -1.0])
  fn = losses.get("als")
  np.testing.assert_allclose(fn(z, y, objectness=per_image),
                             fn(z, y, objectness=jnp.broadcast_to(per_image[:, None, None], y.shape)),
                             rtol=1e-6)


@pytest.fixture(scope="module")
def all_masked_values_and_gradients():
  """{name: (value, gradient)} of every loss on a batch with every entry masked, one program."""
  z, y = random_batch(seed=17)
  z, y = jnp.asarray(z, jnp.float32), jnp.asarray(y)
  mask = jnp.zeros(y.shape, bool)

  @jax.jit
  def values_and_gradients(z, y, mask):
    return {name: jax.value_and_grad(
        lambda v, fn=losses.get(name), obj=objectness_for(name, y.shape): fn(v, y, mask=mask,
                                                                             **obj))(z)
            for name in losses.names()}

  return values_and_gradients(z, y, mask)


@pytest.mark.parametrize("name", losses.names())
def test_all_masked_is_zero_with_zero_gradient(name, all_masked_values_and_gradients):
  value, grad = all_masked_values_and_gradients[name]
  assert float(value) == 0.0
  np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize("name", losses.names())
def test_jit_vmap_and_bfloat16(name):
  rng = np.random.default_rng(18)
  z = jnp.asarray(rng.normal(size=(3, B, C)) * 3, jnp.float32)
  y = jnp.asarray(rng.integers(0, C, size=(3, B)))
  fn = losses.get(name, **ALL_KW.get(name, {}))
  obj = objectness_for(name, (3, B))
  eager = [fn(z[i], y[i], **({"objectness": obj["objectness"][i]} if obj else {})) for i in range(3)]
  vmapped = jax.jit(jax.vmap(lambda a, b, *o: fn(a, b, **({"objectness": o[0]} if o else {}))))(
      z, y, *obj.values())
  np.testing.assert_allclose(vmapped, np.array(eager), rtol=1e-5, atol=1e-6)
  obj0 = {"objectness": obj["objectness"][0]} if obj else {}
  low = fn(z[0].astype(jnp.bfloat16), y[0], **obj0)
  assert low.dtype == jnp.float32
  # bf16 inputs are computed in float32: same value as the rounded logits given in float32.
  np.testing.assert_allclose(low, fn(z[0].astype(jnp.bfloat16).astype(jnp.float32), y[0], **obj0),
                             rtol=1e-6)


@pytest.fixture(scope="module")
def extreme_values_and_gradients():
  """{(name, dtype name): (value, gradient)} of every loss on extreme logits, one program."""
  z = np.array([[1e4, 0, -1e4, 0, 0], [-1e4, 1e4, 0, 0, 0], [0, 0, 0, 0, 1e4],
                [1e4, 1e4, 0, 0, -1e4]])
  y = jnp.array([0, 2, 4, 1])  # confident right, confident wrong, right, tie
  dtypes = (jnp.float32, jnp.bfloat16)

  @jax.jit
  def values_and_gradients(zs, y):
    return {(name, jnp.dtype(z.dtype).name): jax.value_and_grad(
        lambda v, fn=losses.get(name), obj=objectness_for(name, y.shape): fn(v, y, **obj))(z)
            for name in losses.names() for z in zs}

  return values_and_gradients([jnp.asarray(z, dtype) for dtype in dtypes], y)


@pytest.mark.parametrize("name", losses.names())
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_extreme_logits_are_finite(name, dtype, extreme_values_and_gradients):
  value, grad = extreme_values_and_gradients[name, jnp.dtype(dtype).name]
  assert grad.dtype == dtype  # the gradient of the logits given in this dtype
  assert np.isfinite(float(value)), name
  assert np.all(np.isfinite(np.asarray(grad, np.float32))), name


# --- bad input -----------------------------------------------------------------------------------

def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match=r"unknown loss 'lss'; valid names: ce, ls, .*mbls"):
    losses.get("lss")


@pytest.mark.parametrize("name,kw,pattern", [
    ("ls", {"eps": 0.1}, r"unknown hyper-parameter.*'eps'.*epsilon"),
    ("ce", {"epsilon": 0.1}, r"unknown hyper-parameter.*valid: none"),
    ("ls", {"epsilon": 1.5}, r"epsilon=1.5 is outside \[0.0, 1.0\]"),
    ("mbls", {"margin": -1.0}, r"margin=-1.0 is outside"),
    ("focal", {"gamma": float("nan")}, r"gamma=nan is outside"),
    ("lr", {"alpha": 1.0}, r"alpha=1.0 is outside \[0.0, 1.0\)"),
    ("acls", {"winner_term": "min"}, r"winner_term='min' is not one of"),
    ("als", {"beta": 2.0}, r"beta=2.0 is outside"),
    ("maxsup", {"alpha": -0.1}, r"alpha=-0.1 is outside \[0.0, inf\]"),
    ("logitnorm", {"temperature": 0.0}, r"temperature=0.0 is outside \(0.0, inf\]"),
    ("logitnorm", {"tau": 0.1}, r"unknown hyper-parameter.*'tau'.*temperature"),
])
def test_bad_hparams_rejected_at_get(name, kw, pattern):
  with pytest.raises(ValueError, match=pattern):
    losses.get(name, **kw)


def test_non_numeric_hparam_rejected():
  with pytest.raises(TypeError, match="epsilon must be a real number"):
    losses.get("ls", epsilon="0.1")
  with pytest.raises(TypeError, match="margin must be a real number"):
    losses.get("mbls", margin=True)


def test_bad_arrays_rejected():
  fn = losses.get("ce")
  z = jnp.zeros((4, C))
  with pytest.raises(ValueError, match="labels shape"):
    fn(z, jnp.zeros((3,), jnp.int32))
  with pytest.raises(TypeError, match="labels must be integer"):
    fn(z, jnp.zeros((4,), jnp.float32))
  with pytest.raises(TypeError, match="mask must be boolean"):
    fn(z, jnp.zeros((4,), jnp.int32), mask=jnp.ones((4,), jnp.int32))
  with pytest.raises(ValueError, match="mask shape"):
    fn(z, jnp.zeros((4,), jnp.int32), mask=jnp.ones((5,), bool))
  with pytest.raises(ValueError, match=r"label 7 out of range \[0, 5\)"):
    fn(z, jnp.array([0, 7, 1, 2]))
  with pytest.raises(ValueError, match=r"label -1 out of range"):
    fn(z, jnp.array([0, -1, 1, 2]))
  with pytest.raises(ValueError, match="at least 2 classes"):
    fn(jnp.zeros((4, 1)), jnp.zeros((4,), jnp.int32))


def test_out_of_range_label_under_jit_is_loud_nan():
  fn = jax.jit(losses.get("ls"))
  assert np.isnan(float(fn(jnp.zeros((2, C)), jnp.array([0, 9]))))
  # ... but not when that entry is masked out.
  assert np.isfinite(float(fn(jnp.zeros((2, C)), jnp.array([0, 9]), mask=jnp.array([True, False]))))


def test_als_objectness_errors():
  fn = losses.get("als")
  z, y = jnp.zeros((4, C)), jnp.zeros((4,), jnp.int32)
  with pytest.raises(ValueError, match="needs `objectness`"):
    fn(z, y)
  with pytest.raises(ValueError, match="objectness must be in"):
    fn(z, y, objectness=jnp.array([0.5, 1.5, 0.0, 0.0]))
  with pytest.raises(ValueError, match="objectness shape"):
    fn(z, y, objectness=jnp.zeros((3,)))
