"""Bootstrap intervals: calibration, smooth, selective and detection metrics; statistical
properties checked against closed forms and a numpy bootstrap written here."""
import functools
import importlib

import jax
import numpy as np
import pytest

from calib_jax import metrics


def _data(n, seed, c=5):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, c)) * 2
  probs = (np.exp(z) / np.exp(z).sum(1, keepdims=True)).astype(np.float32)
  labels = np.where(rng.random(n) < 0.7, probs.argmax(1), rng.integers(0, c, n))
  return probs, labels


def test_accuracy_interval_matches_the_binomial_standard_error():
  probs, labels = _data(2000, 0)
  out = metrics.bootstrap(metrics.accuracy, probs, labels, num_samples=400,
                          key=jax.random.key(1))
  acc = float(out["value"])
  np.testing.assert_allclose(acc, np.mean(probs.argmax(1) == labels), rtol=1e-6)
  # The bootstrap standard error of a mean of 0/1 outcomes is sqrt(p(1 − p)/n) (±15 % with
  # 400 resamples); the 95 % percentile interval spans about ±1.96 of them.
  se = np.sqrt(acc * (1 - acc) / 2000)
  np.testing.assert_allclose(float(out["std"]), se, rtol=0.15)
  np.testing.assert_allclose(float(out["upper"] - out["lower"]), 2 * 1.96 * se, rtol=0.2)


def test_ece_interval_contains_the_estimate_and_narrows_with_n():
  widths = []
  for n in (1000, 16000):
    probs, labels = _data(n, 2)
    out = metrics.bootstrap(metrics.ece, probs, labels, num_samples=200)
    assert float(out["lower"]) <= float(out["value"]) <= float(out["upper"])
    widths.append(float(out["upper"] - out["lower"]))
  assert widths[1] < 0.5 * widths[0]   # ~1/sqrt(n): a quarter of the width at 16x the data


def test_ece_std_matches_a_numpy_bootstrap():
  probs, labels = _data(1000, 3)
  conf, correct = probs.max(1), probs.argmax(1) == labels
  rng = np.random.default_rng(0)
  values = []
  for _ in range(300):
    i = rng.integers(0, 1000, 1000)
    b = np.clip(np.ceil(conf[i] * 15).astype(int) - 1, 0, 14)
    gap = np.bincount(b, correct[i], 15) - np.bincount(b, conf[i], 15)
    values.append(np.abs(gap).sum() / 1000)
  out = metrics.bootstrap(functools.partial(metrics.ece, num_bins=15), probs, labels,
                          num_samples=300, key=jax.random.key(4))
  np.testing.assert_allclose(float(out["std"]), np.std(values, ddof=1), rtol=0.2)


def test_smooth_selective_and_detection_metrics():
  probs, labels = _data(800, 5)
  conf, correct = probs.max(1), probs.argmax(1) == labels
  for fn, args in ((metrics.smooth_ece, (probs, labels)), (metrics.aurc, (conf, correct)),
                   (metrics.auroc, (conf, ~correct))):
    out = metrics.bootstrap(fn, *args, num_samples=50, batch_size=16)
    np.testing.assert_allclose(out["value"], fn(*args), rtol=1e-6)
    assert float(out["lower"]) <= float(out["value"]) <= float(out["upper"])
    assert 0 < float(out["std"]) < 0.1


def test_flat_mask_resamples_only_valid_samples():
  probs, labels = _data(1000, 6)
  mask = np.arange(1000) < 500
  masked = metrics.bootstrap(metrics.accuracy, probs, labels, num_samples=300, mask=mask)
  subset = metrics.bootstrap(metrics.accuracy, probs[:500], labels[:500], num_samples=300)
  np.testing.assert_allclose(masked["value"], subset["value"], rtol=1e-6)
  np.testing.assert_allclose(float(masked["std"]), float(subset["std"]), rtol=0.2)
  # Pixel masks [B, H] resample whole images (axis 0) with their mask.
  pixels = metrics.bootstrap(metrics.accuracy, probs.reshape(100, 10, 5),
                             labels.reshape(100, 10), num_samples=20,
                             mask=mask.reshape(100, 10))
  np.testing.assert_allclose(pixels["value"], masked["value"], rtol=1e-6)


def test_bad_input():
  probs, labels = _data(20, 7)
  with pytest.raises(ValueError, match="share their axis 0"):
    metrics.bootstrap(metrics.ece, probs, labels[:10])
  with pytest.raises(ValueError, match="num_samples"):
    metrics.bootstrap(metrics.ece, probs, labels, num_samples=1)
  with pytest.raises(ValueError, match="confidence"):
    metrics.bootstrap(metrics.ece, probs, labels, confidence=95)
  with pytest.raises(ValueError, match="callable"):
    metrics.bootstrap("ece", probs, labels)
  with pytest.raises(ValueError, match="at least one array"):
    metrics.bootstrap(metrics.ece)
  with pytest.raises(ValueError, match="mask selects no entries"):
    metrics.bootstrap(metrics.ece, probs, labels, mask=np.zeros(20, bool))


def test_index_draws_are_the_exact_high_word_and_uniform():
  # The module (the package's `bootstrap` attribute is the function).
  bootstrap_lib = importlib.import_module("calib_jax.metrics.bootstrap")
  words = np.array([0, 1, 65535, 65536, 2**31, 2**32 - 1, 123456789, 3141592653], np.uint32)
  for n in (1, 7, 1000, 10**6, 2**22, 2**31 - 1):
    want = [(int(w) * n) >> 32 for w in words]   # Python integers: the exact floor(u·n/2³²)
    np.testing.assert_array_equal(bootstrap_lib._scale_to_range(jax.numpy.asarray(words), n),
                                  want)
  counts = np.bincount(np.asarray(bootstrap_lib._draw_indices(jax.random.key(0), 70000, 7)),
                       minlength=7)
  assert counts.shape == (7,)
  # Binomial(70000, 1/7): mean 10000, sd 92.6; 5 sd either side.
  assert np.all(np.abs(counts - 10000) < 5 * 92.6), counts


def test_random_bits_are_jax_random_bits():
  # The unrolled threefry gives `jax.random.bits`' words exactly: the same resamples.
  bootstrap_lib = importlib.import_module("calib_jax.metrics.bootstrap")
  keys = [jax.random.key(0), jax.random.key(2**31 + 5), jax.random.PRNGKey(7),
          jax.random.key(3, impl="rbg")]  # the last: another implementation, JAX's own
  for key in keys:
    for size in (1, 2, 7, 1000, 25001):
      np.testing.assert_array_equal(bootstrap_lib._random_bits(key, size),
                                    jax.random.bits(key, (size,), jax.numpy.uint32))
  split = jax.random.split(jax.random.key(1), 4)  # vmapped as the bootstrap draws them
  np.testing.assert_array_equal(
      jax.jit(jax.vmap(lambda k: bootstrap_lib._random_bits(k, 333)))(split),
      jax.vmap(lambda k: jax.random.bits(k, (333,), jax.numpy.uint32))(split))


@pytest.mark.parametrize("metric", [metrics.ece, functools.partial(metrics.aece, num_bins=10),
                                    metrics.smooth_ece])
def test_top_label_metrics_resample_two_column_rows_with_the_same_result(metric):
  """The bootstrap reduces `[N, C]` to `[conf, 0]` rows for top-label metrics; the same
  resamples of rows built here give the same interval."""
  probs, labels = _data(600, 7, c=12)
  rows = np.stack([probs.max(1), np.zeros(600, np.float32)], 1)
  right = np.where(probs.argmax(1) == labels, 0, 1)
  full = metrics.bootstrap(metric, probs, labels, num_samples=40, key=jax.random.key(2))
  reduced = metrics.bootstrap(metric, rows, right, num_samples=40, key=jax.random.key(2))
  for name in ("value", "lower", "upper", "std"):
    np.testing.assert_allclose(full[name], reduced[name], rtol=1e-6, atol=1e-7)


def test_top_label_rows_stand_for_the_probabilities():
  """`top_label_rows(*confidence_and_correct(probs, labels))` gives every top-label metric the
  same value as `(probs, labels)`, exactly: the argmax is column 0 (first index on ties, so a
  confidence of 0 still predicts 0), labelled 0 exactly when the prediction was right."""
  probs, labels = _data(700, 11, c=12)
  probs[:3] = 1.0 / 12  # all-tied rows: argmax 0, right only for label 0
  labels[:3] = [0, 5, 11]
  rows, wrong = metrics.top_label_rows(*metrics.confidence_and_correct(probs, labels))
  assert rows.shape == (700, 2) and wrong.dtype == np.int32
  np.testing.assert_array_equal(wrong, (probs.argmax(1) != labels).astype(np.int32))
  for metric in (metrics.ece, metrics.mce, metrics.aece, metrics.accuracy, metrics.smooth_ece,
                 metrics.average_confidence, metrics.rms_calibration_error):
    assert float(metric(rows, wrong)) == float(metric(probs, labels)), metric.__name__
  for got, want in zip(metrics.reliability_bins(rows, wrong),
                       metrics.reliability_bins(probs, labels)):
    np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match=r"^confidence and correct must have the same shape, "
                     r"got \(4,\) and \(5,\)\.$"):
    metrics.top_label_rows(np.ones(4, np.float32), np.ones(5, bool))


def test_a_given_value_is_returned_as_given_with_the_same_interval():
  """`value=` (a report's own number) replaces only the metric on the data: the resamples,
  hence lower, upper and std, are those without it."""
  # The shapes of test_smooth_ece_batched_searches_equal_one_resample_at_a_time's unmasked
  # `from_conf`: one program for both.
  probs, labels = _data(3000, 12)
  conf, right = metrics.confidence_and_correct(probs, labels)
  plain = metrics.bootstrap(metrics.top_label_smooth_ece, conf, right, num_samples=120)
  given = metrics.bootstrap(metrics.top_label_smooth_ece, conf, right, num_samples=120,
                            value=np.float32(0.125))
  assert float(given["value"]) == 0.125 != float(plain["value"])
  for name in ("lower", "upper", "std"):
    assert float(given[name]) == float(plain[name]), name


@pytest.mark.parametrize("metric_fn", [metrics.aurc, metrics.eaurc, metrics.augrc])
@pytest.mark.parametrize("masked", [False, True])
def test_ranked_chunks_equal_one_resample_at_a_time(metric_fn, masked):
  """AURC-type metrics rank a chunk of resamples in one host call and reduce each alone
  (`selective.ranked_reduction`): bit for bit the values of one resample at a time
  (`batch_size=1`), ties and masks included."""
  rng = np.random.default_rng(3)
  scores = np.round(rng.uniform(0.2, 1.0, 300), 2).astype(np.float32)  # many ties
  correct = rng.uniform(size=300) < scores
  mask = rng.uniform(size=300) < 0.8 if masked else None
  key = jax.random.key(7)
  fast = metrics.bootstrap(metric_fn, scores, correct, num_samples=60, key=key, mask=mask)
  slow = metrics.bootstrap(metric_fn, scores, correct, num_samples=60, key=key, mask=mask,
                           batch_size=1)
  for stat in ("value", "lower", "upper", "std"):
    np.testing.assert_array_equal(np.asarray(fast[stat]), np.asarray(slow[stat]), stat)


@pytest.mark.parametrize("calibrated", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_smooth_ece_batched_searches_equal_one_resample_at_a_time(calibrated, masked):
  """smooth ECE's bandwidth searches run batched over chunks of resamples
  (`smooth.search_bandwidth_batched`); the intervals equal those of one resample at a time
  (`batch_size=1`), on the coarse grid and where the search goes to the fine one (calibrated
  data, σ < 1/64), from probabilities or from precomputed confidences. Both data sets have
  the same shapes: the four cases compile two sets of programs (with and without the mask)."""
  rng = np.random.default_rng(11)
  n = 3000
  if calibrated:
    # Smooth ECE ~ sqrt(conf (1 - conf) / n) on calibrated data: confidences near 1 take it
    # below 1/64 at this n (0.008; 0.017 for confidences in [0.5, 1]).
    conf = rng.uniform(0.9, 1.0, n).astype(np.float32)
    correct = rng.uniform(size=n) < conf
  else:
    conf = rng.uniform(0.6, 1.0, n).astype(np.float32)
    correct = rng.uniform(size=n) < 0.6
  probs = np.stack([conf, 1.0 - conf], axis=1)
  labels = np.where(correct, 0, 1)
  _, sigma = metrics.smooth_ece(probs, labels, return_bandwidth=True)
  assert (float(sigma) < 1 / 64) == calibrated   # the fine grid is (not) reached
  mask = rng.uniform(size=n) < 0.8 if masked else None
  key = jax.random.key(5)
  slow = metrics.bootstrap(metrics.smooth_ece, probs, labels, num_samples=120, key=key,
                           mask=mask, batch_size=1)
  fast = metrics.bootstrap(metrics.smooth_ece, probs, labels, num_samples=120, key=key,
                           mask=mask)  # 2 chunks of 60
  from_conf = metrics.bootstrap(metrics.top_label_smooth_ece, conf, correct, num_samples=120,
                                key=key, mask=mask)
  for stat in ("value", "lower", "upper", "std"):
    np.testing.assert_allclose(fast[stat], slow[stat], rtol=1e-6, atol=1e-8, err_msg=stat)
    np.testing.assert_allclose(from_conf[stat], slow[stat], rtol=1e-6, atol=1e-8, err_msg=stat)


def test_ranked_from_counts_equals_rank_errors_of_the_resample():
  """A resample ranked from its counts of the samples (no sort) gives `rank_errors` of the
  resampled arrays bit for bit: huge tie groups (five distinct scores, as an isotonic
  calibrator gives), singletons, and a masked resample whose counts sum to fewer than N."""
  from calib_jax.metrics import ranked_counts, selective  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(8)
  n = 3000
  scores = np.where(rng.uniform(size=n) < 0.5, rng.choice([0.2, 0.4, 0.6, 0.8, 1.0], n),
                    rng.uniform(size=n)).astype(np.float32)
  correct = rng.uniform(size=n) < scores
  points = ranked_counts.rank_points(jax.numpy.asarray(scores), jax.numpy.asarray(correct))
  for drawn in (n, 2100):
    idx = rng.integers(0, n, drawn)
    counts = np.bincount(idx, minlength=n).astype(np.int32)
    got = ranked_counts.ranked_from_counts(points, jax.numpy.asarray(counts),
                                           None if drawn == n else jax.numpy.int32(drawn))
    padded = np.zeros(n, np.int64)
    padded[:drawn] = idx
    mask = None if drawn == n else np.arange(n) < drawn
    want = selective.rank_errors(jax.numpy.asarray(scores[padded]),
                                 jax.numpy.asarray(~correct[padded]),
                                 None if mask is None else jax.numpy.asarray(mask))
    np.testing.assert_array_equal(np.asarray(got.errors), np.asarray(want.errors))
    np.testing.assert_array_equal(np.asarray(got.boundary), np.asarray(want.boundary))
    assert int(got.num_errors) == int(want.num_errors) and int(got.n) == int(want.n)


def test_running_sums_and_the_tie_spread_are_exact():
  """`running_sums` (triangular float32 products) is cumsum exactly, across the block sizes;
  the tie spread's division by a corrected float32 quotient gives `_ranking`'s values bit for
  bit, groups past the exact-division limit (46,340) and products near 2³¹ included."""
  from calib_jax.metrics import _ranking, ranked_counts  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(9)
  for n in (1, 31, 32, 33, 1025, 40000):
    x = rng.integers(0, 400, n).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(ranked_counts.running_sums(x)), np.cumsum(x))
  size = np.concatenate([rng.integers(1, 50, 500), rng.integers(40000, 46341, 500),
                         rng.integers(46341, 10**6, 100)]).astype(np.int32)
  taken = (rng.uniform(size=size.shape) * size).astype(np.int32) + 1
  taken = np.minimum(taken, size)
  group_errors = (rng.uniform(size=size.shape) * (size + 1)).astype(np.int32)
  group_errors = np.minimum(group_errors, size)
  above = rng.integers(0, 10**6, size.shape).astype(np.int32)
  got = ranked_counts._spread_tie_errors(*(jax.numpy.asarray(a) for a in
                                           (above, taken, group_errors, size)))
  want = _ranking.spread_tie_errors(above, taken, group_errors, size, np)
  np.testing.assert_array_equal(np.asarray(got), want)


def test_running_sums_ask_for_full_precision_whatever_the_default():
  """Its float32 products hold integers, exact only at full precision: the program asks for it
  even where a user's default would round the operands (TF32 on a GPU, bfloat16 on a TPU; the
  CPU computes float32 fully either way, so the request is what can be checked here)."""
  from calib_jax.metrics import ranked_counts  # pylint: disable=import-outside-toplevel
  x = jax.numpy.ones(1025, jax.numpy.int32)
  with jax.default_matmul_precision("bfloat16"):
    text = jax.jit(ranked_counts.running_sums).lower(x).as_text()
  dots = [line for line in text.splitlines() if "dot_general" in line]
  assert dots and all("HIGHEST" in line for line in dots), dots
