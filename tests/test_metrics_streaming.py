"""StreamingMetrics: batches, merge and devices must reproduce the one-shot metrics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from calib_jax import metrics

C = 6
EXACT_KEYS = ("accuracy", "ece", "mce", "classwise_ece", "brier", "average_confidence",
              "overconfidence", "underconfidence")


def _logits(seed, n, c=C, scale=3.0):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(n, c)) * scale).astype(np.float32)
  labels = np.where(rng.random(n) < 0.6, logits.argmax(1), rng.integers(0, c, n))
  return logits, labels


def _one_shot(probs, labels, mask=None):
  out = {name: getattr(metrics, name)(probs, labels, mask=mask) for name in EXACT_KEYS}
  out["aece"] = metrics.aece(probs, labels, mask=mask)
  conf = jnp.max(probs, -1)
  correct = jnp.argmax(probs, -1) == labels
  out.update(metrics.selective_summary(conf, correct, mask, risks=(0.05, 0.2),
                                       coverages=(0.5, 0.9)))
  return out


def _assert_matches_one_shot(res, exact):
  for name in EXACT_KEYS:
    np.testing.assert_allclose(res[name], exact[name], rtol=1e-5, atol=1e-6, err_msg=name)
  for name, bound in (("aurc", "aurc_error_bound"), ("augrc", "augrc_error_bound"),
                      ("aece", "aece_error_bound"), ("eaurc", "aurc_error_bound")):
    assert abs(float(res[name]) - float(exact[name])) <= float(res[bound]) + 2e-6, name
  # Bin ends are a subset of the exact tie-group ends, with exact risks there.
  for q, value in zip((5, 20), exact["coverage_at_risk"]):
    assert float(res[f"coverage_at_{q}pct_risk"]) <= float(value) + 1e-7


def test_batches_with_padding_equal_one_shot():
  logits, labels = _logits(0, 700)
  probs = jax.nn.softmax(logits)
  acc = metrics.StreamingMetrics.init(num_classes=C)
  # Uneven batches, the last one padded to a fixed size with mask=False.
  for lo, hi in ((0, 256), (256, 512), (512, 700)):
    batch_logits = np.zeros((256, C), np.float32)
    batch_labels = np.full(256, 255)  # padding label must be ignored
    batch_logits[:hi - lo], batch_labels[:hi - lo] = logits[lo:hi], labels[lo:hi]
    acc = acc.update(logits=batch_logits, labels=batch_labels,
                     mask=np.arange(256) < hi - lo)
  res = acc.result(risks=(0.05, 0.2), coverages=(0.5, 0.9))
  assert int(res["num_samples"]) == 700
  exact = _one_shot(probs, labels)
  _assert_matches_one_shot(res, exact)
  np.testing.assert_allclose(res["nll"], metrics.nll(logits, labels, from_logits=True),
                             rtol=1e-5)
  bins = metrics.reliability_bins(probs, labels)
  np.testing.assert_array_equal(res["reliability_counts"], bins.counts)
  np.testing.assert_allclose(res["reliability_accuracy"], bins.accuracy, atol=1e-6)
  np.testing.assert_allclose(res["reliability_confidence"], bins.confidence, atol=1e-6)
  for c in (0.5, 0.9):
    np.testing.assert_allclose(res[f"risk_at_{c * 100:g}pct_coverage"],
                               metrics.risk_at_coverage(jnp.max(probs, -1),
                                                        jnp.argmax(probs, -1) == labels, c),
                               atol=2e-3)


def test_merge_equals_sequential_updates():
  logits, labels = _logits(1, 300)
  init = metrics.StreamingMetrics.init(num_classes=C, num_bins=10)
  a = init.update(logits=logits[:120], labels=labels[:120])
  b = init.update(logits=logits[120:], labels=labels[120:])
  sequential = a.update(logits=logits[120:], labels=labels[120:])
  merged = a.merge(b)
  for x, y in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(sequential)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="cannot merge"):
    a.merge(metrics.StreamingMetrics.init(num_classes=C))


def test_the_devices_with_psum_equal_one_device():
  devices = jax.device_count()
  assert devices > 1, "tests/conftest.py provides fake CPU devices"
  logits, labels = _logits(2, devices * 40)
  mask = np.random.default_rng(3).random(devices * 40) < 0.9
  mesh = jax.make_mesh((devices,), ("data",))

  def per_device(logits, labels, mask):
    acc = metrics.StreamingMetrics.init(num_classes=C)
    return acc.update(logits=logits, labels=labels, mask=mask).psum("data")

  sharded = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("data"),) * 3,
                                  out_specs=P()))
  shard = jax.sharding.NamedSharding(mesh, P("data"))
  args = [jax.device_put(x, shard) for x in (logits, labels, mask)]
  multi = jax.block_until_ready(sharded(*args))
  single = metrics.StreamingMetrics.init(num_classes=C).update(logits=logits, labels=labels,
                                                                mask=mask)
  for x, y in zip(jax.tree_util.tree_leaves(multi), jax.tree_util.tree_leaves(single)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
  res_multi, res_single = multi.result(), single.result()
  for key in res_single:
    np.testing.assert_allclose(res_multi[key], res_single[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)


def _skewed_confidences(seed, n):
  """Realistic MSPs: a block saturated at exactly 1, many within 1e-6..1e-1 of 1, the rest
  spread over [0.5, 1]; accuracy rises with confidence."""
  rng = np.random.default_rng(seed)
  kind = rng.choice(3, size=n, p=[0.15, 0.55, 0.30])
  near_one = 1.0 - 10.0 ** -rng.uniform(1, 6, n)
  conf = np.where(kind == 0, 1.0, np.where(kind == 1, near_one, rng.uniform(0.5, 1.0, n)))
  conf = conf.astype(np.float32)
  correct = rng.random(n) < conf ** 3
  probs = np.stack([conf, 1 - conf], 1)
  return probs, np.where(correct, 0, 1), correct


@pytest.mark.parametrize("score_bits", [3, 12])
def test_histogram_estimates_stay_within_their_error_bound(score_bits):
  n = 400_000 if score_bits == 12 else 50_000
  probs, labels, correct = _skewed_confidences(4, n)
  acc = metrics.StreamingMetrics.init(num_classes=2, score_bits=score_bits)
  res = acc.update(probs=probs, labels=labels).result()
  exact_aece = float(metrics.aece(probs, labels))
  exact = metrics.selective_summary(probs[:, 0], correct)
  for name, bound, value in (("aurc", "aurc_error_bound", exact["aurc"]),
                             ("eaurc", "aurc_error_bound", exact["eaurc"]),
                             ("augrc", "augrc_error_bound", exact["augrc"]),
                             ("aece", "aece_error_bound", exact_aece)):
    err = abs(float(res[name]) - float(value))
    assert err <= float(res[bound]) + 2e-6, (name, err, float(res[bound]))
  if score_bits == 12:
    # The default resolution: the documented guarantee, |error| < 1e-3 at large N.
    for bound in ("aurc_error_bound", "augrc_error_bound", "aece_error_bound"):
      assert float(res[bound]) < 1e-3, (bound, float(res[bound]))
  else:
    # Coarse bins really do move the estimate, so the bound above is not vacuous.
    assert abs(float(res["aurc"]) - float(exact["aurc"])) > 1e-5


def test_segmentation_pixels_with_ignore_label_and_miou():
  rng = np.random.default_rng(5)
  logits = (rng.normal(size=(2, 6, 5, C)) * 2).astype(np.float32)
  labels = rng.integers(0, C, (2, 6, 5))
  labels[:, :2, :2] = 255
  mask = metrics.valid_mask(labels, ignore_index=255)
  acc = metrics.StreamingMetrics.init(num_classes=C).update(logits=logits, labels=labels,
                                                             mask=mask)
  res = acc.result()
  valid = np.asarray(mask).reshape(-1)
  flat_probs = np.asarray(jax.nn.softmax(logits)).reshape(-1, C)[valid]
  flat_labels = labels.reshape(-1)[valid]
  np.testing.assert_allclose(res["ece"], metrics.ece(flat_probs, flat_labels), atol=1e-6)
  pred = logits.argmax(-1)
  np.testing.assert_allclose(res["miou"], metrics.miou(pred, labels, C, mask), atol=1e-6)
  assert int(res["num_samples"]) == valid.sum()


def test_empty_accumulator_and_empty_batch_give_zeros_not_nan():
  acc = metrics.StreamingMetrics.init(num_classes=3)
  acc = acc.update(logits=np.zeros((0, 3), np.float32), labels=np.zeros((0,), np.int32))
  res = acc.result()
  for key, value in res.items():
    assert np.all(np.isfinite(np.asarray(value))), key
  assert float(res["ece"]) == 0.0 and int(res["num_samples"]) == 0


def test_bad_inputs_raise_clear_errors():
  acc = metrics.StreamingMetrics.init(num_classes=3)
  logits, labels = np.zeros((4, 3), np.float32), np.zeros(4, np.int32)
  with pytest.raises(ValueError, match="exactly one"):
    acc.update(logits=logits, probs=logits, labels=labels)
  with pytest.raises(ValueError, match=r"\[\.\.\., 3\]"):
    acc.update(logits=np.zeros((4, 5), np.float32), labels=labels)
  with pytest.raises(ValueError, match="outside"):
    acc.update(logits=logits, labels=np.full(4, 3))
  with pytest.raises(ValueError, match="num_classes"):
    metrics.StreamingMetrics.init(num_classes=0)
  with pytest.raises(ValueError, match="coverages"):
    acc.result(coverages=(0.0,))
