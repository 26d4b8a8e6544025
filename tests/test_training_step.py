"""The train step: data parallelism (the suite's devices == 1 device), SAM and CRL against references."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import losses
from calib_jax.training import crl, optim, parallel, programs, state as state_lib
from calib_jax.training import step as step_lib


class TinyNet(nn.Module):
  """Conv - BatchNorm - ReLU - pool - dropout - Dense: exercises batch stats and dropout."""

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Conv(4, (3, 3))(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.relu(x).mean(axis=(1, 2))
    x = nn.Dropout(0.25, deterministic=not train)(x)
    return nn.Dense(3, name="head")(x)


class Linear(nn.Module):
  """Logits = x @ W + b: simple enough for hand-written reference gradients."""

  @nn.compact
  def __call__(self, x, train=False):
    return nn.Dense(3, name="head")(x)


def _batch(seed, n=16, image=True):
  rng = np.random.default_rng(seed)
  shape = (n, 6, 6, 2) if image else (n, 5)
  return {"image": rng.normal(size=shape).astype(np.float32),
          "label": rng.integers(0, 3, n).astype(np.int32),
          "mask": np.ones(n, bool),
          "index": rng.permutation(n).astype(np.int32)}


def _train(model, mesh, batches, *, sam_rho=0.0, crl_weight=0.0, lr=0.1, momentum=0.9):
  sched = optim.make_schedule(name="constant", base_lr=lr, total_steps=10, steps_per_epoch=2)
  tx = optim.make_optimizer(name="sgd", learning_rate=sched, momentum=momentum,
                            weight_decay=1e-3)
  variables = model.init({"params": jax.random.key(0)}, batches[0]["image"][:1])
  state = parallel.replicate(
      state_lib.create(variables, tx, jax.random.key(1), crl_num_examples=16), mesh)
  train_step = programs.train_program(programs.of_train_step(
      step_lib.make_train_step(model, losses.get("ce"), tx, sched, sam_rho=sam_rho,
                               crl_weight=crl_weight, steps_per_epoch=2)),
      programs.single_run_layout(mesh), per_step=True, resident=False)
  all_metrics = []
  for batch in batches:
    state, metrics = train_step(state, parallel.to_global(batch, mesh))
    all_metrics.append(jax.device_get(metrics))
  return jax.device_get(state), all_metrics


def test_the_devices_equal_one_device():
  devices = jax.device_count()
  assert devices > 1, "conftest.py provides fake CPU devices"
  batches = [_batch(0), _batch(1)]
  results = {n: _train(TinyNet(), parallel.make_mesh(jax.devices()[:n]), batches)
             for n in (1, devices)}
  (state1, metrics1), (state_n, metrics_n) = results[1], results[devices]
  assert int(state_n.step) == 2
  # BatchNorm statistics are over the global batch, gradients the global mean, dropout masks
  # the same: the two runs agree up to float reassociation.
  for a, b in zip(jax.tree.leaves(state1.params) + jax.tree.leaves(state1.batch_stats),
                  jax.tree.leaves(state_n.params) + jax.tree.leaves(state_n.batch_stats)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for m1, m_n in zip(metrics1, metrics_n):
    np.testing.assert_allclose(m1["loss"], m_n["loss"], rtol=1e-6)
  # The update did something (not a trivially equal pair of untrained states).
  init = TinyNet().init({"params": jax.random.key(0)}, batches[0]["image"][:1])["params"]
  assert np.abs(state_n.params["head"]["kernel"] - init["head"]["kernel"]).max() > 1e-4


def _ce(params, x, y):
  logits = x @ params["head"]["kernel"] + params["head"]["bias"]
  return -np.mean(np.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def test_sam_step_uses_gradient_at_perturbed_point():
  batch = _batch(2, image=False)
  mesh = parallel.make_mesh(jax.devices()[:1])
  rho, lr = 0.5, 0.3
  state, _ = _train(Linear(), mesh, [batch], sam_rho=rho, lr=lr, momentum=0.0)
  params0 = Linear().init({"params": jax.random.key(0)}, batch["image"][:1])["params"]
  x, y = batch["image"], batch["label"]
  g = jax.grad(_ce)(params0, x, y)
  norm = np.sqrt(sum(np.sum(np.square(v)) for v in jax.tree.leaves(g)))
  perturbed = jax.tree.map(lambda p, gi: p + rho * gi / norm, params0, g)
  g_sam = jax.grad(_ce)(perturbed, x, y)
  expected = jax.tree.map(lambda p, gs: p - lr * (gs + 1e-3 * p), params0, g_sam)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # ... and differs from the plain gradient step.
  plain = jax.tree.map(lambda p, gi: p - lr * (gi + 1e-3 * p), params0, g)
  assert max(np.abs(a - b).max() for a, b in
             zip(jax.tree.leaves(state.params), jax.tree.leaves(plain))) > 1e-4


def _torch_style_ranking_loss(conf, hist):
  """CRL's official formulation: MarginRankingLoss(margin=0) on (c1, roll(c) + margin/target)."""
  c2, h2 = np.roll(conf, -1), np.roll(hist, -1)
  target = (hist > h2).astype(float) - (hist < h2).astype(float)
  margin = np.abs(hist - h2)
  target_nonzero = np.where(target == 0, 1.0, target)
  input2 = c2 + margin / target_nonzero
  return np.mean(np.maximum(0.0, -target * (conf - input2)))


def test_crl_ranking_loss_and_history_match_reference():
  rng = np.random.default_rng(3)
  conf = rng.uniform(size=8).astype(np.float32)
  counts = np.array([0, 3, 1, 1, 2, 0, 3, 2], np.float32)
  epoch = 4
  hist = (counts - counts.min()) / (epoch - counts.min())
  np.testing.assert_allclose(crl.normalized_history(jnp.asarray(counts), epoch), hist, rtol=1e-6)
  got = crl.ranking_loss(jnp.asarray(conf), jnp.asarray(hist), jnp.ones(8, bool))
  np.testing.assert_allclose(got, _torch_style_ranking_loss(conf, hist), rtol=1e-5)
  updated = crl.update_history(jnp.zeros(5), jnp.array([4, 1, 4, 0]),
                               jnp.array([True, False, True, True]),
                               jnp.array([True, True, True, False]))
  np.testing.assert_array_equal(updated, [0, 0, 0, 0, 2])


def test_crl_train_step_adds_weighted_ranking_term_and_counts_correct():
  batch = _batch(4, image=False)
  mesh = parallel.make_mesh(jax.devices()[:1])
  state, metrics = _train(Linear(), mesh, [batch], crl_weight=0.7, momentum=0.0)
  params0 = Linear().init({"params": jax.random.key(0)}, batch["image"][:1])["params"]
  logits = batch["image"] @ params0["head"]["kernel"] + params0["head"]["bias"]
  probs = np.asarray(jax.nn.softmax(logits))
  # Empty history at the first step: every pair ties, so the ranking term is 0.
  np.testing.assert_allclose(metrics[0]["crl_loss"], 0.0, atol=1e-7)
  np.testing.assert_allclose(metrics[0]["loss"], _ce(params0, batch["image"], batch["label"]),
                             rtol=1e-5)
  correct = probs.argmax(-1) == batch["label"]
  expected_counts = np.zeros(16)
  expected_counts[batch["index"][correct]] = 1
  np.testing.assert_array_equal(state.crl_correctness, expected_counts)
  # With a non-trivial history, the step's loss is CE + weight * reference ranking loss.
  counts = np.arange(16, dtype=np.float32) % 3
  sched = optim.make_schedule(name="constant", base_lr=0.1, total_steps=10, steps_per_epoch=2)
  tx = optim.make_optimizer(name="sgd", learning_rate=sched, momentum=0.0)
  state = state_lib.create({"params": params0}, tx, jax.random.key(1), crl_num_examples=16)
  state = state.replace(crl_correctness=jnp.asarray(counts), step=jnp.asarray(4, jnp.int32))
  step_fn = jax.jit(step_lib.make_train_step(Linear(), losses.get("ce"), tx, sched,
                                             crl_weight=0.7, steps_per_epoch=2))
  _, m = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()})
  epoch = 4 // 2 + 1
  hist = ((counts - counts.min()) / (epoch - counts.min()))[batch["index"]]
  expected = (_ce(params0, batch["image"], batch["label"])
              + 0.7 * _torch_style_ranking_loss(probs.max(-1), hist))
  np.testing.assert_allclose(m["loss"], expected, rtol=1e-5)
  assert float(m["crl_loss"]) > 0


def test_non_finite_loss_is_flagged():
  batch = _batch(5, image=False)
  batch["image"][0, 0] = np.nan
  _, metrics = _train(Linear(), parallel.make_mesh(jax.devices()[:1]), [batch])
  assert metrics[0]["finite"] == 0.0


def test_ensemble_predict_is_the_members_predicts_in_one_program():
  mesh = parallel.make_mesh(jax.devices()[:2])
  model, batch = TinyNet(), _batch(3, n=8)
  members = [model.init({"params": jax.random.key(seed)}, batch["image"][:1])
             for seed in (4, 5, 6)]
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *members)
  global_batch = parallel.to_global(batch, mesh)
  logits = step_lib.make_ensemble_predict_fn(model, mesh)(stacked, global_batch)
  predict = step_lib.make_predict_fn(model, mesh)
  expected = np.stack([predict(variables, global_batch) for variables in members])
  assert logits.shape == (3, 8, 3) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
  assert np.abs(expected[0] - expected[1]).max() > 1e-3  # distinct members, not one repeated
