"""Calibration metrics vs independent numpy references (docs/conventions.md#calibration-metrics)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import metrics

N, C, B = 600, 7, 15


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _data(seed=0, n=N, c=C, scale=2.5):
  rng = np.random.default_rng(seed)
  probs = _softmax(rng.normal(size=(n, c)) * scale)
  labels = rng.integers(0, c, n)
  # Make the model better than chance so every bin mixes right and wrong predictions.
  agree = rng.random(n) < 0.6
  labels = np.where(agree, probs.argmax(1), labels)
  return probs, labels


# ---------------------------------------------------------------- numpy references
def ref_bins(probs, labels, num_bins):
  conf = probs.max(1)
  correct = probs.argmax(1) == labels
  b = np.clip(np.ceil(conf * np.float32(num_bins)).astype(np.int64) - 1, 0, num_bins - 1)
  return conf.astype(np.float64), correct, b


def ref_ece(probs, labels, num_bins=B):
  conf, correct, b = ref_bins(probs, labels, num_bins)
  total = 0.0
  for k in range(num_bins):
    sel = b == k
    if sel.any():
      total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
  return total


def ref_mce(probs, labels, num_bins=B):
  conf, correct, b = ref_bins(probs, labels, num_bins)
  return max(abs(correct[b == k].mean() - conf[b == k].mean())
             for k in range(num_bins) if (b == k).any())


def ref_aece(probs, labels, num_bins=B):
  conf = probs.max(1).astype(np.float64)
  correct = probs.argmax(1) == labels
  order = np.argsort(conf, kind="stable")
  return sum(len(g) / len(conf) * abs(correct[g].mean() - conf[g].mean())
             for g in np.array_split(order, num_bins) if len(g))


def ref_classwise(probs, labels, num_bins=B):
  n, c = probs.shape
  total = 0.0
  for k in range(c):
    pk = probs[:, k]
    b = np.clip(np.ceil(pk * np.float32(num_bins)).astype(np.int64) - 1, 0, num_bins - 1)
    hit = (labels == k).astype(np.float64)
    for j in range(num_bins):
      sel = b == j
      if sel.any():
        total += sel.sum() / n * abs(hit[sel].mean() - pk[sel].astype(np.float64).mean())
  return total / c


def ref_scalars(probs, labels):
  p64 = probs.astype(np.float64)
  conf = p64.max(1)
  correct = probs.argmax(1) == labels
  onehot = np.eye(probs.shape[1])[labels]
  return {
      "accuracy": correct.mean(),
      "nll": -np.log(p64[np.arange(len(labels)), labels]).mean(),
      "brier": ((p64 - onehot) ** 2).sum(1).mean(),
      "average_confidence": conf.mean(),
      "overconfidence": conf[~correct].mean(),
      "underconfidence": (1 - conf[correct]).mean(),
  }


# ---------------------------------------------------------------- tests
def test_binned_metrics_match_numpy_reference():
  probs, labels = _data(0)
  np.testing.assert_allclose(metrics.ece(probs, labels), ref_ece(probs, labels), atol=2e-6)
  np.testing.assert_allclose(metrics.mce(probs, labels), ref_mce(probs, labels), atol=2e-6)
  np.testing.assert_allclose(metrics.aece(probs, labels), ref_aece(probs, labels), atol=2e-6)
  np.testing.assert_allclose(metrics.classwise_ece(probs, labels),
                             ref_classwise(probs, labels), atol=2e-6)
  conf, correct, b = ref_bins(probs, labels, B)
  bins = metrics.reliability_bins(probs, labels)
  counts = np.bincount(b, minlength=B)
  np.testing.assert_array_equal(bins.counts, counts)
  filled = counts > 0
  np.testing.assert_allclose(
      np.asarray(bins.accuracy)[filled],
      np.bincount(b, correct, B)[filled] / counts[filled], atol=1e-6)
  np.testing.assert_allclose(
      np.asarray(bins.confidence)[filled],
      np.bincount(b, conf, B)[filled] / counts[filled], atol=1e-6)
  assert np.all(np.asarray(bins.confidence)[~filled] == 0)


def test_scalar_metrics_match_numpy_reference():
  probs, labels = _data(1)
  ref = ref_scalars(probs, labels)
  for name, value in ref.items():
    got = getattr(metrics, name)(probs, labels)
    assert got.dtype == jnp.float32 and got.shape == ()
    np.testing.assert_allclose(got, value, rtol=2e-6, atol=1e-6, err_msg=name)


def test_nll_from_logits_is_exact_log_softmax():
  rng = np.random.default_rng(2)
  logits = (rng.normal(size=(50, 5)) * 40).astype(np.float32)  # p_y underflows for many rows
  labels = rng.integers(0, 5, 50)
  z = logits.astype(np.float64)
  ref = (np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
         - z[np.arange(50), labels]).mean()
  np.testing.assert_allclose(metrics.nll(logits, labels, from_logits=True), ref, rtol=1e-5)
  # From probabilities the value stays finite: p_y is clipped at the float32 tiny.
  assert np.isfinite(metrics.nll(_softmax(logits), labels))


def test_classwise_ece_top_k_path_for_many_classes():
  # C = 100 > 4 * B takes the top-B path; it must equal the full per-class binning.
  probs, labels = _data(3, n=300, c=100, scale=4.0)
  np.testing.assert_allclose(metrics.classwise_ece(probs, labels),
                             ref_classwise(probs, labels), atol=2e-6)


def test_hand_derived_small_case():
  # Confidences 0.9 (right), 0.9 (wrong), 0.6 (right), 0.3 of class 0 (wrong); B = 2 bins.
  probs = np.array([[0.9, 0.1, 0.0], [0.05, 0.9, 0.05], [0.6, 0.3, 0.1], [0.3, 0.3, 0.4]],
                   np.float32)
  labels = np.array([0, 0, 0, 1])
  # conf = .9, .9, .6, .4 -> bins (.5,1]: {.9,.9,.6} acc 2/3 conf .8 ; (0,.5]: {.4} acc 0.
  expected_ece = 3 / 4 * abs(2 / 3 - 0.8) + 1 / 4 * 0.4
  np.testing.assert_allclose(metrics.ece(probs, labels, 2), expected_ece, atol=1e-6)
  np.testing.assert_allclose(metrics.mce(probs, labels, 2), 0.4, atol=1e-6)
  # AECE, 2 groups of 2: {.4 wrong, .6 right} and {.9, .9 one right}.
  np.testing.assert_allclose(metrics.aece(probs, labels, 2),
                             0.5 * abs(0.5 - 0.5) + 0.5 * abs(0.5 - 0.9), atol=1e-6)
  np.testing.assert_allclose(metrics.overconfidence(probs, labels), (0.9 + 0.4) / 2, atol=1e-6)
  np.testing.assert_allclose(metrics.underconfidence(probs, labels), (0.1 + 0.4) / 2, atol=1e-6)
  # Brier of row 0: .01 + .01 = .02; row 1: .95^2+.9^2+.05^2; row 2: .16+.09+.01; row 3.
  rows = [0.02, 0.9025 + 0.81 + 0.0025, 0.16 + 0.09 + 0.01, 0.09 + 0.49 + 0.16]
  np.testing.assert_allclose(metrics.brier(probs, labels), np.mean(rows), atol=1e-6)


def test_bin_edges_follow_ceil_convention():
  # c exactly on an edge belongs to the lower bin (bins are (lo, hi]); c = 0.5 with B = 2.
  probs = np.array([[0.5, 0.5], [0.75, 0.25]], np.float32)
  labels = np.array([0, 1])
  bins = metrics.reliability_bins(probs, labels, 2)
  np.testing.assert_array_equal(bins.counts, [1, 1])


def test_aece_tie_cut_by_group_boundary_uses_mean_accuracy():
  # Sorted confidences .6(right) .7(wrong) .7(right) .9(right); the 2|2 cut splits the .7 tie.
  conf = np.array([0.7, 0.9, 0.6, 0.7], np.float32)
  probs = np.stack([conf, 1 - conf], 1)
  labels = np.array([1, 0, 0, 0])
  left = abs((1 + 0.5) - (0.6 + 0.7))
  right = abs((0.5 + 1) - (0.7 + 0.9))
  np.testing.assert_allclose(metrics.aece(probs, labels, 2), (left + right) / 4, atol=1e-6)


def test_perfect_calibration_gives_zero_ece():
  # Every sample has confidence 0.8 and exactly 80% of each bin is right.
  n, c = 500, 4
  probs = np.full((n, c), 0.2 / 3, np.float32)
  probs[:, 0] = 0.8
  labels = np.where(np.arange(n) % 5 == 0, 1, 0)
  # float32 0.8 and float32 sums: zero up to ~1e-6.
  assert abs(float(metrics.ece(probs, labels))) < 1e-5
  assert abs(float(metrics.mce(probs, labels))) < 1e-5
  assert abs(float(metrics.aece(probs, labels))) < 1e-5
  assert float(metrics.ece(probs, 1 - labels)) > 0.5  # and it can fail


def test_mask_equals_the_reference_on_the_valid_subset():
  probs, labels = _data(4)
  rng = np.random.default_rng(5)
  mask = rng.random(N) < 0.7
  sub_p, sub_l = probs[mask], labels[mask]
  labels = np.where(mask, labels, 255)  # an ignore label at masked positions is fine
  expected = dict(ref_scalars(sub_p, sub_l), ece=ref_ece(sub_p, sub_l),
                  mce=ref_mce(sub_p, sub_l), aece=ref_aece(sub_p, sub_l),
                  classwise_ece=ref_classwise(sub_p, sub_l))
  for name, value in expected.items():
    np.testing.assert_allclose(getattr(metrics, name)(probs, labels, mask=mask), value,
                               rtol=2e-6, atol=2e-6, err_msg=name)


def test_leading_dims_are_flattened_for_segmentation():
  probs, labels = _data(6, n=4 * 5 * 6)
  probs_img = probs.reshape(4, 5, 6, C)
  labels_img = labels.reshape(4, 5, 6)
  np.testing.assert_allclose(metrics.ece(probs_img, labels_img), ref_ece(probs, labels),
                             atol=2e-6)


def test_jit_with_static_num_bins_and_bfloat16_input():
  probs, labels = _data(7)
  jitted = jax.jit(metrics.ece, static_argnames="num_bins")
  np.testing.assert_allclose(jitted(probs, labels, num_bins=10),
                             ref_ece(probs, labels, 10), atol=2e-6)
  p16 = jnp.asarray(probs, jnp.bfloat16)
  ref16 = ref_ece(np.asarray(p16.astype(jnp.float32)), labels)
  np.testing.assert_allclose(metrics.ece(p16, labels), ref16, atol=2e-6)


def test_bad_inputs_raise_clear_errors():
  probs, labels = _data(8, n=10)
  with pytest.raises(ValueError, match="empty"):
    metrics.ece(np.zeros((0, 3), np.float32), np.zeros((0,), np.int32))
  with pytest.raises(ValueError, match="leading shape"):
    metrics.ece(probs, labels[:5])
  with pytest.raises(ValueError, match="outside"):
    metrics.ece(probs, np.full(10, C))
  with pytest.raises(ValueError, match="outside"):
    metrics.brier(probs, np.full(10, -1))
  with pytest.raises(ValueError, match="no entries"):
    metrics.aece(probs, labels, mask=np.zeros(10, bool))
  with pytest.raises(ValueError, match="mask shape"):
    metrics.ece(probs, labels, mask=np.ones(9, bool))
  with pytest.raises(ValueError, match="num_bins"):
    metrics.ece(probs, labels, num_bins=0)
  with pytest.raises(ValueError, match="integer"):
    metrics.ece(probs, labels.astype(np.float32))
  with pytest.raises(ValueError, match="at least 2 dims"):
    metrics.ece(probs[0], labels[0])


def test_blocked_argmax_keeps_the_first_index_on_ties():
  from calib_jax import arrays  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(9)
  probs = rng.random((6, 1000)).astype(np.float32)
  probs[0, [700, 3]] = 2.0          # tie across blocks: index 3 comes first
  probs[1, [41, 40]] = 2.0          # tie inside one block
  probs[2, :] = 0.5                 # all equal: index 0
  assert arrays._argmax_block(1000) > 0  # the blocked path is the one under test
  np.testing.assert_array_equal(arrays.first_argmax(probs), np.argmax(probs, -1))


def test_classwise_bin_sums_stay_accurate_over_many_rows():
  # 60,000 rows: a (class, bin) cell adds tens of thousands of float32 values, which a single
  # sequential sum gets wrong by ~1e-5 relative; the per-chunk partials keep ~1e-7. Rows not a
  # multiple of the chunk, and a mask, included.
  from calib_jax.metrics import calibration  # pylint: disable=import-outside-toplevel
  n, c = 60_001, 5
  probs, labels = _data(11, n=n, c=c)
  mask = np.random.default_rng(12).random(n) < 0.9
  conf, hits = calibration.classwise_bin_sums(jnp.asarray(probs), jnp.asarray(labels, jnp.int32),
                                              jnp.asarray(mask), B)
  b = np.clip(np.ceil(probs * np.float32(B)).astype(np.int64) - 1, 0, B - 1)
  cell = (np.arange(c) * B + b)[mask]
  expected = np.bincount(cell.ravel(), probs[mask].astype(np.float64).ravel(), c * B)
  np.testing.assert_allclose(np.asarray(conf).ravel(), expected, rtol=1e-6)
  label_cell = (labels * B + b[np.arange(n), labels])[mask]
  np.testing.assert_array_equal(np.asarray(hits).ravel(), np.bincount(label_cell, minlength=c * B))
