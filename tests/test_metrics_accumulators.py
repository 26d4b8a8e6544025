"""The streaming accumulators one by one: halves + merge = whole, psum over devices = one device,
compute() = the one-shot metrics of calib_jax.metrics; and the *_from_bins formulas."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from calib_jax import metrics
from calib_jax.metrics import accumulators

C, B = 5, 10

FACTORIES = {
    "scalars": metrics.ScalarSums.init,
    "calibration": lambda: metrics.BinnedCalibration.init(B),
    "classwise": lambda: metrics.ClasswiseCalibration.init(C, B),
    "classwise_counts": lambda: metrics.ClasswiseCalibration.init(C, B, counts=True),
    "histogram": lambda: metrics.ConfidenceHistogram.init(B, score_bits=8),
    "confusion": lambda: metrics.ConfusionMatrix.init(C),
    "streaming": lambda: metrics.StreamingMetrics.init(C, B, score_bits=8),
}


def _data(seed, n=640, c=C):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(n, c)) * 2.5).astype(np.float32)
  labels = np.where(rng.random(n) < 0.6, logits.argmax(1), rng.integers(0, c, n))
  mask = rng.random(n) < 0.85
  return logits, labels.astype(np.int32), mask


def _assert_trees_close(x, y, rtol=1e-6, atol=1e-6):
  assert jax.tree_util.tree_structure(x) == jax.tree_util.tree_structure(y)
  for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub":
      np.testing.assert_array_equal(a, b)
    else:
      np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _compute(acc):
  return acc.result() if isinstance(acc, metrics.StreamingMetrics) else acc.compute()


def _assert_results_close(x, y, atol=1e-6):
  assert set(x) == set(y)
  for key in x:
    np.testing.assert_allclose(np.asarray(x[key], np.float64), np.asarray(y[key], np.float64),
                               rtol=1e-6, atol=atol, err_msg=key)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_two_halves_merged_equal_the_whole(name):
  logits, labels, mask = _data(0)
  init = FACTORIES[name]()
  whole = init.update(logits=logits, labels=labels, mask=mask)
  first = init.update(logits=logits[:250], labels=labels[:250], mask=mask[:250])
  second = init.update(logits=logits[250:], labels=labels[250:], mask=mask[250:])
  merged = first.merge(second)
  _assert_trees_close(merged, whole)
  _assert_results_close(_compute(merged), _compute(whole))
  # Merging is symmetric and an empty accumulator is its identity.
  _assert_trees_close(second.merge(first), whole)
  _assert_trees_close(whole.merge(init), whole, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_psum_over_the_devices_equals_one_device(name):
  assert jax.device_count() > 1, "tests/conftest.py provides fake CPU devices"
  logits, labels, mask = _data(1)
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  init = FACTORIES[name]()

  def per_device(logits, labels, mask):
    return init.update(logits=logits, labels=labels, mask=mask).psum("data")

  sharded = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("data"),) * 3,
                                  out_specs=P()))
  shard = jax.sharding.NamedSharding(mesh, P("data"))
  multi = sharded(*(jax.device_put(x, shard) for x in (logits, labels, mask)))
  single = init.update(logits=logits, labels=labels, mask=mask)
  _assert_trees_close(multi, single, rtol=1e-5, atol=1e-5)
  _assert_results_close(_compute(multi), _compute(single), atol=2e-6)


def test_psum_under_vmap_is_the_sum_of_the_parts():
  logits, labels, mask = _data(2)
  parts = 4
  init = metrics.StreamingMetrics.init(C, B, score_bits=8)

  def one(logits, labels, mask):
    return init.update(logits=logits, labels=labels, mask=mask).psum("parts")

  summed = jax.vmap(one, axis_name="parts")(
      *(x.reshape((parts, -1) + x.shape[1:]) for x in (logits, labels, mask)))
  first = jax.tree_util.tree_map(lambda x: x[0], summed)
  for i in range(1, parts):  # every part holds the same total
    _assert_trees_close(jax.tree_util.tree_map(lambda x, i=i: x[i], summed), first, 0, 0)
  whole = init.update(logits=logits, labels=labels, mask=mask)
  _assert_trees_close(first, whole, rtol=1e-5, atol=1e-5)


def test_compute_equals_the_one_shot_metrics():
  logits, labels, mask = _data(3, n=3000)
  probs = jax.nn.softmax(logits)
  conf, correct = jnp.max(probs, -1), jnp.argmax(probs, -1) == labels

  def streamed(acc):
    return acc.update(logits=logits, labels=labels, mask=mask).compute()

  scalars = streamed(metrics.ScalarSums.init())
  assert scalars["num_samples"] == mask.sum()
  for name in ("accuracy", "brier", "average_confidence", "overconfidence", "underconfidence"):
    np.testing.assert_allclose(scalars[name], getattr(metrics, name)(probs, labels, mask=mask),
                               rtol=1e-5, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(scalars["nll"],
                             metrics.nll(logits, labels, mask, from_logits=True), rtol=1e-5)

  binned = streamed(metrics.BinnedCalibration.init(B))
  np.testing.assert_allclose(binned["ece"], metrics.ece(probs, labels, B, mask), atol=1e-6)
  np.testing.assert_allclose(binned["mce"], metrics.mce(probs, labels, B, mask), atol=1e-6)
  bins = metrics.reliability_bins(probs, labels, B, mask)
  np.testing.assert_array_equal(binned["reliability_counts"], bins.counts)
  np.testing.assert_allclose(binned["reliability_accuracy"], bins.accuracy, atol=1e-6)
  np.testing.assert_allclose(binned["reliability_confidence"], bins.confidence, atol=1e-6)

  classwise = streamed(metrics.ClasswiseCalibration.init(C, B, counts=True))
  np.testing.assert_allclose(classwise["classwise_ece"],
                             metrics.classwise_ece(probs, labels, B, mask), atol=1e-6)
  # Per class: the ECE of "label = k" against p_k, from numpy.
  p, y = np.asarray(probs, np.float64)[mask], labels[mask]
  for k in range(C):
    b = np.clip(np.ceil(np.asarray(probs)[mask][:, k] * B).astype(int) - 1, 0, B - 1)
    gap = sum(abs(np.sum(y[b == j] == k) - np.sum(p[b == j, k])) for j in range(B))
    np.testing.assert_allclose(classwise["per_class_ece"][k], gap / len(y), atol=1e-6)
  np.testing.assert_allclose(np.mean(classwise["per_class_ece"]), classwise["classwise_ece"],
                             atol=1e-7)

  histogram = streamed(metrics.ConfidenceHistogram.init(B))
  exact = metrics.selective_summary(conf, correct, mask)
  for name, bound in (("aurc", "aurc_error_bound"), ("eaurc", "aurc_error_bound"),
                      ("augrc", "augrc_error_bound")):
    assert abs(histogram[name] - exact[name]) <= histogram[bound] + 2e-6, name
  assert (abs(histogram["aece"] - metrics.aece(probs, labels, B, mask))
          <= histogram["aece_error_bound"] + 2e-6)

  confusion = streamed(metrics.ConfusionMatrix.init(C))
  pred = np.asarray(logits).argmax(-1)
  np.testing.assert_allclose(confusion["miou"], metrics.miou(pred, labels, C, mask), atol=1e-6)
  _, per_class = metrics.iou_from_confusion(metrics.confusion_matrix(pred, labels, C, mask))
  np.testing.assert_allclose(confusion["per_class_iou"], per_class, atol=1e-6)


def test_streaming_metrics_is_the_union_of_its_parts():
  logits, labels, mask = _data(4)
  parts = {name: FACTORIES[name]() for name in ("scalars", "calibration", "confusion")}
  combined = metrics.StreamingMetrics.of(**parts).update(logits=logits, labels=labels, mask=mask)
  assert combined.num_classes == C
  expected = {}
  for name, part in parts.items():
    expected.update(part.update(logits=logits, labels=labels, mask=mask).compute())
  result = combined.result()
  assert set(result) == set(expected)
  for key in result:
    np.testing.assert_array_equal(result[key], expected[key], err_msg=key)
  assert isinstance(combined["confusion"], metrics.ConfusionMatrix)
  # Turning parts off in init drops their keys and nothing else.
  lean = metrics.StreamingMetrics.init(C, B, confusion=False, classwise=False)
  keys = set(lean.update(logits=logits, labels=labels).result())
  assert not keys & {"miou", "per_class_iou", "classwise_ece"} and "aece" in keys


def test_mismatched_accumulators_do_not_merge_or_combine():
  with pytest.raises(ValueError, match="cannot merge"):
    metrics.BinnedCalibration.init(10).merge(metrics.BinnedCalibration.init(15))
  with pytest.raises(ValueError, match="cannot merge"):
    metrics.ClasswiseCalibration.init(C, counts=True).merge(metrics.ClasswiseCalibration.init(C))
  with pytest.raises(TypeError, match="can only merge with ScalarSums"):
    metrics.ScalarSums.init().merge(metrics.BinnedCalibration.init())
  with pytest.raises(ValueError, match="cannot merge"):
    metrics.StreamingMetrics.of(a=metrics.ScalarSums.init()).merge(
        metrics.StreamingMetrics.of(b=metrics.ScalarSums.init()))
  with pytest.raises(ValueError, match="disagree on num_classes"):
    metrics.StreamingMetrics.of(a=metrics.ConfusionMatrix.init(3),
                                b=metrics.ClasswiseCalibration.init(4))
  with pytest.raises(ValueError, match=r"\[\.\.\., 3\]"):
    metrics.ConfusionMatrix.init(3).update(logits=np.zeros((2, 4), np.float32),
                                           labels=np.zeros(2, np.int32))
  with pytest.raises(ValueError, match="score_bits"):
    metrics.ConfidenceHistogram.init(score_bits=17)
  with pytest.raises(ValueError, match="num_classes"):
    metrics.StreamingMetrics.init(0, confusion=False, classwise=False)


def test_update_inside_a_users_jit_equals_eager():
  logits, labels, mask = _data(5)
  init = metrics.StreamingMetrics.init(C, B, score_bits=8)
  jitted = jax.jit(lambda x, y, m: init.update(logits=x, labels=y, mask=m))(logits, labels, mask)
  _assert_trees_close(jitted, init.update(logits=logits, labels=labels, mask=mask), 0, 0)


def test_from_bins_formulas_agree_on_host_and_device():
  rng = np.random.default_rng(6)
  counts = rng.integers(0, 50, (C, B)).astype(np.int32)
  counts[0, 3] = 0
  hits = np.minimum(rng.integers(0, 50, (C, B)), counts).astype(np.int32)
  conf = (counts * rng.random((C, B))).astype(np.float32)
  n = int(counts[0].sum())
  host = metrics.ece_from_bins(conf, hits, n)
  assert host.dtype == np.float64 and host.shape == (C,)
  np.testing.assert_allclose(host, np.abs(hits - conf.astype(np.float64)).sum(1) / n)
  np.testing.assert_allclose(metrics.ece_from_bins(jnp.asarray(conf), jnp.asarray(hits), n),
                             host, rtol=1e-6)
  np.testing.assert_allclose(metrics.classwise_ece_from_bins(conf, hits, n), host.mean(),
                             rtol=1e-12)
  gaps = np.abs(hits - conf.astype(np.float64))[1] / np.maximum(counts[1], 1)
  np.testing.assert_allclose(metrics.mce_from_bins(counts[1], conf[1], hits[1]), gaps.max())
  np.testing.assert_allclose(
      metrics.mce_from_bins(jnp.asarray(counts[1]), jnp.asarray(conf[1]), jnp.asarray(hits[1])),
      gaps.max(), rtol=1e-6)
  rel = metrics.reliability_from_bins(counts[0], conf[0], hits[0])
  assert rel.accuracy[3] == 0.0 and rel.confidence[3] == 0.0
  assert float(metrics.ece_from_bins(conf, hits, 0)[0]) == 0.0


def test_subsample_pixel_indices_are_the_pixels_of_subsample_pixels():
  rng = np.random.default_rng(7)
  mask = rng.random((3, 12, 10)) < 0.4
  mask[2] = False
  mask[2, 0, :5] = True
  key = jax.random.key(3)
  index, chosen = metrics.subsample_pixel_indices(key, mask, 20)
  assert index.shape == chosen.shape == (3, 20)
  picked = np.zeros((3, 120), bool)
  for b in range(3):
    assert len(set(np.asarray(index[b]).tolist())) == 20
    picked[b, np.asarray(index[b])[np.asarray(chosen[b])]] = True
  np.testing.assert_array_equal(picked.reshape(mask.shape),
                                metrics.subsample_pixels(key, mask, 20))
  np.testing.assert_array_equal(np.asarray(chosen).sum(1), [20, 20, 5])


def test_evaluators_combine_the_accumulators_they_need():
  from calib_jax.evaluation import validation
  classification = types.SimpleNamespace(task="classification", num_classes=C)
  segmentation = types.SimpleNamespace(task="segmentation", num_classes=C)
  assert sorted(validation.accumulators(classification, B, classwise=False,
                                        histogram=True).parts) == [
      "calibration", "histogram", "scalars"]
  full = validation.accumulators(segmentation, B, classwise=True, histogram=True)
  assert sorted(full.parts) == ["calibration", "classwise", "confusion", "histogram", "scalars"]
  logits, labels, mask = _data(8)
  np.testing.assert_array_equal(
      full.update(logits=logits, labels=labels, mask=mask).result()["per_class_iou"],
      metrics.StreamingMetrics.init(C, B).update(
          logits=logits, labels=labels, mask=mask).result()["per_class_iou"])


def test_batch_values_are_the_one_shot_ones():
  logits, labels, mask = _data(9, n=50)
  batch = accumulators.make_batch(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask),
                                  from_logits=True)
  probs = jax.nn.softmax(logits)
  np.testing.assert_array_equal(batch.probs, probs)
  np.testing.assert_array_equal(batch.pred, np.asarray(logits).argmax(-1))
  np.testing.assert_array_equal(batch.confidence, jnp.max(probs, -1))
  np.testing.assert_allclose(-batch.log_prob, -np.take_along_axis(
      np.asarray(jax.nn.log_softmax(logits)), labels[:, None], 1)[:, 0], rtol=1e-6)
