"""Loss gradients: the facts of docs/conventions.md#gradient-facts (CE/LS, MbLS and ACLS
regularisers, LR's zero region), finite differences for every loss, and the effective target.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import losses
from test_losses import B, C, np_log_softmax, np_onehot, random_batch  # the loss tests' helpers


# --- docs/conventions.md#gradient-facts ---------------------------------------------------------

def per_example_grad(name, z, y, **kw):
  """Per-example gradient: the loss averages over B entries, so scale by B."""
  z = jnp.asarray(z, jnp.float32)
  fn = losses.get(name, **kw)
  return np.asarray(jax.grad(lambda v: fn(v, jnp.asarray(y)))(z)) * z.shape[0]


def np_softmax(z):
  return np.exp(np_log_softmax(z))


def test_ce_and_ls_gradients():
  z, y = random_batch(seed=8)
  np.testing.assert_allclose(per_example_grad("ce", z, y), np_softmax(z) - np_onehot(y, C),
                             atol=1e-6)
  q = 0.8 * np_onehot(y, C) + 0.2 / C
  np.testing.assert_allclose(per_example_grad("ls", z, y, epsilon=0.2), np_softmax(z) - q,
                             atol=1e-6)


def test_mbls_regulariser_gradient():
  z, y = random_batch(scale=6.0, seed=9)
  m, alpha = 3.0, 0.2
  reg = per_example_grad("mbls", z, y, margin=m, alpha=alpha) - per_example_grad("ce", z, y)
  expected = np.zeros_like(z)
  for i, zi in enumerate(z):
    top = np.argmax(zi)
    active = (zi[top] - zi) > m
    expected[i] = -(alpha / C) * active
    expected[i, top] = (alpha / C) * active.sum()
  assert np.abs(expected).sum() > 0  # the margin is active somewhere
  np.testing.assert_allclose(reg, expected, atol=1e-6)


@pytest.mark.parametrize("winner_term", ["max", "max_minus_min"])
def test_acls_regulariser_gradient(winner_term):
  """Gradient facts: 2·lp·relu(z_top − M) at the argmax (max form; z_top − min z for max_minus_min,
  whose min is differentiated: the negative of it at the argmin), −2·ln/(C−1)·relu(z_top − z_j − M)
  at the losers, and nothing else."""
  z, y = random_batch(scale=6.0, seed=10)
  z[0] += 5.0  # the winner term of the `max` form is active on some rows, not on others
  m, lp, ln = 2.0, 0.1, 0.05
  reg = (per_example_grad("acls", z, y, margin=m, lambda_pos=lp, lambda_neg=ln,
                          winner_term=winner_term) - per_example_grad("ce", z, y))
  expected = np.zeros_like(z)
  for i, zi in enumerate(z):
    top, bottom = np.argmax(zi), np.argmin(zi)
    for j in range(C):
      if j != top:
        expected[i, j] = -2 * ln / (C - 1) * max(zi[top] - zi[j] - m, 0)
    if winner_term == "max":
      expected[i, top] = 2 * lp * max(zi[top] - m, 0)
    else:
      gap = max(zi[top] - zi[bottom] - m, 0)
      expected[i, top] = 2 * lp * gap
      expected[i, bottom] += -2 * lp * gap
  assert np.abs(expected).sum() > 0
  if winner_term == "max":
    assert (z.max(-1) > m).any() and (z.max(-1) < m).any()
  np.testing.assert_allclose(reg, expected, atol=1e-5)


def test_lr_zero_region_and_envelope_gradient():
  z, y = random_batch(scale=2.0, seed=11)
  z[np.arange(3), y[:3]] += 8.0  # the first three are confidently right: inside the zero region
  alpha = 0.3
  p = np_softmax(z)
  p_y = p[np.arange(B), y]
  grad = per_example_grad("lr", z, y, alpha=alpha)
  inside = p_y >= 1 - alpha
  assert inside.any() and (~inside).any()
  np.testing.assert_array_equal(grad[inside], 0.0)
  # Outside: gradient of KL(sg(t) ‖ p) = p − t.
  t = alpha * p / (1 - p_y)[:, None]
  t[np.arange(B), y] = 1 - alpha
  np.testing.assert_allclose(grad[~inside], (p - t)[~inside], atol=1e-5)


def test_maxsup_gradient():
  """Per example `p − onehot(y) + α(onehot(ŷ) − 1/C)`: the regulariser pulls the top logit
  (right or wrong) towards the mean, and its gradient sums to zero over the classes."""
  z, y = random_batch(scale=3.0, seed=23)
  z[0, y[0]] += 10.0  # row 0 is right
  alpha = 0.15
  top = np.argmax(z, -1)
  assert (top != y).any() and (top == y).any()  # both a wrong and a right top-1
  expected = np_softmax(z) - np_onehot(y, C) + alpha * (np_onehot(top, C) - 1.0 / C)
  np.testing.assert_allclose(per_example_grad("maxsup", z, y, alpha=alpha), expected, atol=1e-6)


@pytest.mark.parametrize("scale", [0.3, 5.0])
def test_logitnorm_gradient(scale):
  """Per example `(g − (g·z) z/(‖z‖ n)) / (τ n)`, `n = ‖z‖ + 1e-7`, `g = softmax(u) − onehot(y)`,
  `u = z/(τ n)`: orthogonal to z (the norm of z is not trained)."""
  z, y = random_batch(scale=scale, seed=24)
  tau = 0.1
  norm = np.linalg.norm(z, axis=-1, keepdims=True)
  n = norm + 1e-7
  g = np_softmax(z / (tau * n)) - np_onehot(y, C)
  expected = (g - (g * z).sum(-1, keepdims=True) * z / (norm * n)) / (tau * n)
  grad = per_example_grad("logitnorm", z, y, temperature=tau)
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5 / scale)
  np.testing.assert_allclose((grad * z).sum(-1), 0.0, atol=1e-4)


def test_logitnorm_gradient_at_zero_logits_is_finite():
  z = jnp.zeros((2, C))
  grad = jax.grad(lambda v: losses.get("logitnorm")(v, jnp.array([0, 1])))(z)
  assert np.all(np.isfinite(np.asarray(grad)))


FINITE_DIFFERENCE_NAMES = ("focal", "flsd", "ecp", "cpc", "mdca", "mmce", "als", "lr", "maxsup",
                           "logitnorm")
FD_STEP = 1e-2


@pytest.fixture(scope="module")
def gradients_and_finite_differences():
  """{name: (the gradient, its central finite differences)} of each loss on one batch: every
  loss's gradient and its values at the 2 x 20 shifted logits in one jitted program (op by op,
  each loss compiled each of its primitives and its gradient's, ~0.6 s a loss)."""
  z, y = random_batch(b=4, scale=1.5, seed=12)
  steps = np.zeros((z.size,) + z.shape)
  steps.reshape(z.size, z.size)[np.arange(z.size), np.arange(z.size)] = FD_STEP
  shifted = np.concatenate([z + steps, z - steps])  # float64, rounded to float32 as given
  objectness = {"als": {"objectness": jnp.array([0.3, -1.0, 0.8, 1.0])}}

  @jax.jit
  def both(z, shifted, y):
    out = {}
    for name in FINITE_DIFFERENCE_NAMES:
      fn = functools.partial(losses.get(name), **objectness.get(name, {}))
      out[name] = (jax.grad(lambda v, fn=fn: fn(v, y))(z),
                   jax.vmap(lambda v, fn=fn: fn(v, y))(shifted))
    return out

  got = both(jnp.asarray(z, jnp.float32), jnp.asarray(shifted, jnp.float32), jnp.asarray(y))
  result = {}
  for name, (grad, values) in got.items():
    values = np.asarray(values, np.float64)
    numeric = ((values[:z.size] - values[z.size:]) / (2 * FD_STEP)).reshape(z.shape)
    result[name] = np.asarray(grad), numeric
  return result


@pytest.mark.parametrize("name", FINITE_DIFFERENCE_NAMES)
def test_gradient_matches_finite_differences(name, gradients_and_finite_differences):
  grad, numeric = gradients_and_finite_differences[name]
  np.testing.assert_allclose(grad, numeric, atol=2e-3, rtol=2e-2)


# --- effective target ----------------------------------------------------------------------------

def test_effective_target_ce_is_onehot_and_ls_is_smoothed_labels():
  z, y = random_batch(seed=13)
  z, y = jnp.asarray(z, jnp.float32), jnp.asarray(y)
  np.testing.assert_allclose(losses.effective_target(losses.get("ce"), z, y), np_onehot(y, C),
                             atol=1e-6)
  np.testing.assert_allclose(losses.effective_target(losses.get("ls", epsilon=0.25), z, y),
                             losses.smoothed_targets(y, C, 0.25), atol=1e-6)


def test_effective_target_with_mask():
  z, y = random_batch(seed=14)
  z, y = jnp.asarray(z, jnp.float32), jnp.asarray(y)
  mask = jnp.array([True, False, True, True, False, True])
  t = np.asarray(losses.effective_target(losses.get("ce"), z, y, mask=mask))
  np.testing.assert_allclose(t[np.asarray(mask)], np_onehot(np.asarray(y), C)[np.asarray(mask)],
                             atol=1e-6)
  np.testing.assert_allclose(t[~np.asarray(mask)], np_softmax(np.asarray(z))[~np.asarray(mask)],
                             atol=1e-6)
