"""`conformal.method_scores` (several methods from one sort) and `conformal.threshold` give
bit for bit what `conformal.fit` and its predictor give, blocked rows included."""
import importlib

import jax
import numpy as np
import pytest

from calib_jax import conformal


def _data(n, c, seed):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(n, c)) * 3).astype(np.float32)
  logits[:, 1] = logits[:, 2]  # ties between classes: ranked by class index
  return logits, rng.integers(0, c, n).astype(np.int32)


@pytest.mark.parametrize("n", [200, 2100])  # 2100: more than one block of rows
def test_method_scores_and_threshold_equal_fit_and_predictor(n):
  val_x, val_y = _data(n, 12, 0)
  test_x, _ = _data(300, 12, 1)
  names = ("thr", "aps", "raps", "saps")
  val_scores = conformal.method_scores(val_x, names, calibration=True, labels=val_y)
  test_scores = conformal.method_scores(test_x, names, calibration=False)
  for name in names:
    for conditional in (None, "class"):
      predictor = conformal.fit(name, val_x, val_y, 0.1, conditional=conditional)
      qhat = conformal.threshold(val_scores[name], val_y, 12, 0.1, conditional)
      np.testing.assert_array_equal(np.asarray(qhat), np.asarray(predictor.qhat),
                                    f"{name} {conditional}")
    np.testing.assert_array_equal(np.asarray(test_scores[name]),
                                  np.asarray(predictor.scores(test_x)), name)


def test_method_scores_under_jit_and_bad_names():
  x, _ = _data(50, 5, 2)
  jitted = jax.jit(lambda z: conformal.method_scores(z, ("aps", "saps"), calibration=False))(x)
  np.testing.assert_array_equal(np.asarray(jitted["saps"]),
                                np.asarray(conformal.saps_scores(
                                    jax.nn.softmax(x, -1),
                                    jax.random.uniform(jax.random.key(1), (50,)), 0.2)))
  with pytest.raises(ValueError, match="unknown conformal method 'lac'; valid names"):
    conformal.method_scores(x, ("lac",), calibration=True)


def test_host_sort_is_the_lax_sort():
  """Large arrays are sorted in numpy on CPU: the same permutation as the stable lax.sort,
  ties (equal and zero probabilities) by class index."""
  scores_lib = importlib.import_module("calib_jax.conformal.scores")
  rng = np.random.default_rng(4)
  probs = rng.dirichlet(np.full(1000, 0.05), size=300).astype(np.float32)
  probs[:, 10:20] = probs[:, 30:40]   # ties
  probs[:, 50:60] = 0.0               # zeros
  assert probs.size >= scores_lib._HOST_SORT_MIN_ENTRIES
  host = jax.jit(scores_lib._sorted_descending)(probs)
  lax_ = jax.jit(scores_lib._lax_sorted_descending)(probs)
  for a, b in zip(host, lax_):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("num_classes", [2, 7, 1000, 1024, 1025])
def test_host_order_is_numpy_stable_argsort(num_classes):
  """The packed-key sort of the host path gives numpy's stable argsort of −p: ties by class
  index, −0.0 equal to 0.0, negative values after the positives (whatever the class bits)."""
  scores_lib = importlib.import_module("calib_jax.conformal.scores")
  rng = np.random.default_rng(num_classes)
  probs = rng.dirichlet(np.full(num_classes, 0.05), size=64).astype(np.float32)
  probs[:, : num_classes // 3] = probs[:, :1]       # ties
  probs[::3, 1: num_classes // 2 + 1] = 0.0         # zeros
  probs[::5, -1] = -0.0
  probs[7] = rng.standard_normal(num_classes).astype(np.float32)  # negatives too
  np.testing.assert_array_equal(scores_lib._host_descending_order(probs),
                                np.argsort(-probs, axis=-1, kind="stable"))


def test_rows_scored_with_their_slice_of_the_uniforms():
  """A block of rows scored with its slice of `method_uniforms` gets the whole array's rows."""
  x, _ = _data(120, 7, 5)
  whole = conformal.method_scores(x, ("aps", "raps", "saps"), calibration=False)
  u = conformal.method_uniforms(120, calibration=False)
  part = conformal.method_scores(x[40:90], ("aps", "raps", "saps"), calibration=False,
                                 uniforms=u[40:90])
  for name in whole:
    np.testing.assert_array_equal(np.asarray(part[name]), np.asarray(whole[name])[40:90], name)


@pytest.mark.exact_across_programs
@pytest.mark.parametrize("shape", [(300, 12), (300, 1000)])  # 300 x 1000: the host sort
def test_sorted_method_scores_are_the_class_order_scores_permuted(shape):
  """`sorted_method_scores` holds `method_scores`' values in each row's sorted order: put
  back through `order` they are equal bit for bit, and `rank_of` finds each label's score."""
  x, y = _data(*shape, 3)
  probs = jax.nn.softmax(x, -1)
  names = ("thr", "aps", "raps", "saps")
  uniforms = conformal.method_uniforms(shape[0], calibration=False)
  expected = conformal.method_scores(probs, names, calibration=False, uniforms=uniforms,
                                     from_logits=False)
  got, order = conformal.sorted_method_scores(probs, names, uniforms)
  order = np.asarray(order)
  np.testing.assert_array_equal(np.sort(order, -1), np.broadcast_to(np.arange(shape[1]), shape))
  rank = np.asarray(conformal.rank_of(order, y))
  np.testing.assert_array_equal(order[np.arange(shape[0]), rank], y)
  np.testing.assert_array_equal(np.asarray(got["thr"]), np.asarray(expected["thr"]))
  for name in names[1:]:
    back = np.empty(shape, np.float32)
    np.put_along_axis(back, order, np.asarray(got[name]), -1)
    np.testing.assert_array_equal(back, np.asarray(expected[name]), name)
    np.testing.assert_array_equal(np.asarray(got[name])[np.arange(shape[0]), rank],
                                  np.asarray(expected[name])[np.arange(shape[0]), y], name)
  with pytest.raises(ValueError, match="unknown conformal method 'lac'"):
    conformal.sorted_method_scores(probs, ("lac",), uniforms)
