"""calib_jax.ensemble against numpy transcriptions of its formulas (docs/ensembles.md)."""
import itertools

import jax
import numpy as np
import pytest

from calib_jax import ensemble


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _entropy(p):
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)


@pytest.fixture(scope="module")
def members():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 50, 5)).astype(np.float32) * 3
  labels = rng.integers(0, 5, size=50)
  return logits, labels


def test_mean_probs_and_log_probs_are_the_average_of_softmaxes(members):
  logits, _ = members
  expected = _softmax(logits.astype(np.float64)).mean(0)
  np.testing.assert_allclose(ensemble.mean_probs(logits), expected, atol=1e-6)
  np.testing.assert_allclose(ensemble.ensemble_log_probs(logits), np.log(expected), atol=1e-5)


def test_log_probs_stay_finite_where_every_member_is_sure():
  logits = np.array([[[0.0, -200.0]], [[0.0, -300.0]]], np.float32)  # p(1) underflows in f32
  logp = np.asarray(ensemble.ensemble_log_probs(logits))
  assert np.isfinite(logp).all()
  np.testing.assert_allclose(logp[0, 1], np.log((np.exp(-200.0) + np.exp(-300.0)) / 2),
                             rtol=1e-5)


def test_entropy_decomposition(members):
  logits, _ = members
  p = _softmax(logits.astype(np.float64))
  total, expected = _entropy(p.mean(0)), _entropy(p).mean(0)
  np.testing.assert_allclose(ensemble.predictive_entropy(logits), total, atol=1e-5)
  np.testing.assert_allclose(ensemble.expected_entropy(logits), expected, atol=1e-5)
  mi = np.asarray(ensemble.mutual_information(logits))
  np.testing.assert_allclose(mi, total - expected, atol=1e-5)
  assert (mi >= 0).all() and mi.max() > 0.1


def test_mutual_information_is_zero_for_identical_members(members):
  logits, _ = members
  same = np.stack([logits[0]] * 3)
  mi = np.asarray(ensemble.mutual_information(same))
  assert (mi >= 0).all() and mi.max() < 1e-6  # 0 up to float32 rounding of log p̄
  np.testing.assert_allclose(ensemble.predictive_entropy(same), _entropy(_softmax(logits[0])),
                             atol=1e-5)


def test_disagreement_on_a_hand_example():
  # Predictions per sample (members 0..2): (0,0,0) -> 0; (0,1,0) -> 2 of 3 pairs; (0,1,2) -> 1.
  preds = np.array([[0, 0, 0], [0, 1, 0], [0, 1, 2]]).T  # [M=3, N=3]
  logits = np.eye(3, dtype=np.float32)[preds] * 5
  np.testing.assert_allclose(ensemble.disagreement(logits), [0.0, 2 / 3, 1.0], atol=1e-7)


def test_disagreement_equals_the_pairwise_mean(members):
  logits, _ = members
  preds = logits.argmax(-1)
  pairs = list(itertools.combinations(range(len(preds)), 2))
  expected = np.mean([preds[a] != preds[b] for a, b in pairs], axis=0)
  np.testing.assert_allclose(ensemble.disagreement(logits), expected, atol=1e-6)


def test_member_metrics_are_each_members_own(members):
  logits, labels = members
  per_member, mean = ensemble.member_metrics(logits, labels, num_bins=10)
  assert list(per_member) == list(mean) == list(ensemble.MEMBER_METRICS)
  p = _softmax(logits.astype(np.float64))
  onehot = np.eye(5)[labels]
  acc = (p.argmax(-1) == labels).mean(1)
  nll = -np.log(np.take_along_axis(p, labels[None, :, None], -1)[..., 0]).mean(1)
  brier = ((p - onehot) ** 2).sum(-1).mean(1)
  conf, correct = p.max(-1), p.argmax(-1) == labels
  ece = []
  for c, k in zip(conf, correct):
    bins = np.minimum((c * 10).astype(int), 9)
    ece.append(sum(abs(k[bins == b].mean() - c[bins == b].mean()) * (bins == b).mean()
                   for b in range(10) if (bins == b).any()))
  for name, value in {"accuracy": acc, "nll": nll, "brier": brier, "ece": ece}.items():
    np.testing.assert_allclose(per_member[name], value, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(mean[name], np.mean(value), atol=1e-5, err_msg=name)


def test_greedy_selection_picks_the_obviously_best_members():
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 3, size=60)
  good = np.eye(3, dtype=np.float32)[labels] * 3 + rng.normal(size=(60, 3)).astype(np.float32)
  bad = rng.normal(size=(60, 3)).astype(np.float32) * 3
  # Members 1 and 3 are informative, 0, 2 and 4 noise; 3 is sharper than 1.
  logits = np.stack([bad, good, bad[::-1], 1.5 * good, -good])
  chosen = np.asarray(ensemble.greedy_select(logits, labels, 2, with_replacement=False))
  np.testing.assert_array_equal(chosen, [3, 1])
  again = np.asarray(ensemble.greedy_select(logits, labels, 4))
  assert again[0] == 3 and set(again) <= {1, 3}


def test_greedy_selection_matches_an_exhaustive_numpy_search(members):
  logits, labels = members
  p_y = np.take_along_axis(_softmax(logits.astype(np.float64)), labels[None, :, None], -1)[..., 0]
  chosen = []
  for _ in range(5):
    nll = [-np.log(p_y[chosen + [m]].mean(0)).mean() for m in range(len(p_y))]
    chosen.append(int(np.argmin(nll)))
  np.testing.assert_array_equal(ensemble.greedy_select(logits, labels, 5), chosen)


def test_everything_jits(members):
  logits, labels = members
  scores = jax.jit(lambda z: (ensemble.predictive_entropy(z), ensemble.mutual_information(z),
                              ensemble.disagreement(z), ensemble.ensemble_log_probs(z)))(logits)
  np.testing.assert_allclose(scores[2], ensemble.disagreement(logits))
  chosen = jax.jit(ensemble.greedy_select, static_argnums=2)(logits, labels, 3)
  np.testing.assert_array_equal(chosen, ensemble.greedy_select(logits, labels, 3))
  per_member, _ = jax.jit(ensemble.member_metrics)(logits, labels)
  assert per_member["nll"].shape == (4,)


def test_leading_sample_dims(members):
  logits, _ = members
  grid = logits.reshape(4, 5, 10, 5)
  np.testing.assert_allclose(ensemble.mutual_information(grid),
                             np.asarray(ensemble.mutual_information(logits)).reshape(5, 10))


@pytest.mark.parametrize("call, message", [
    (lambda: ensemble.stack_members([np.zeros((3, 2)), np.zeros((4, 2))]),
     r"member 1 has logits \(4, 2\) but member 0 has \(3, 2\)"),
    (lambda: ensemble.mean_probs(np.zeros(3)), "at least 2 dims"),
    (lambda: ensemble.disagreement(np.zeros((1, 3, 2))), "at least 2 ensemble members"),
    (lambda: ensemble.greedy_select(np.zeros((3, 4, 2)), np.zeros(4, int), 4,
                                    with_replacement=False), r"k must be in \[1, 3\]"),
    (lambda: ensemble.greedy_select(np.zeros((3, 4, 2)), np.zeros(4, int), 0), "positive int"),
    (lambda: ensemble.member_metrics(np.zeros((3, 4, 2)), np.zeros(5, int)), "labels shape"),
])
def test_one_line_errors(call, message):
  with pytest.raises(ValueError, match=message) as info:
    call()
  assert "\n" not in str(info.value)
