"""The predictions report's bootstrap intervals (`evaluation.predictions_intervals`): on a spare
CPU device or last on the default one, the same numbers."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from calib_jax.evaluation import predictions, predictions_intervals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def arrays():
  rng = np.random.default_rng(1)

  def logits(n, c=5):
    labels = rng.integers(0, c, n)
    z = rng.normal(size=(n, c))
    z[np.arange(n), labels] += 2.5
    return (3.0 * z).astype(np.float32), labels

  (val_x, val_y), (test_x, test_y) = logits(400), logits(400)
  return {"val_logits": val_x, "val_labels": val_y, "test_logits": test_x,
          "test_labels": test_y}


def test_the_intervals_on_a_spare_cpu_device_are_those_on_the_default_one(arrays, monkeypatch):
  """The suite's process has 8 CPU devices (conftest), so the report computes its intervals on
  the last while the rest runs on the first; without a spare device they are dispatched last
  on the default one, metric by metric. Both give the same numbers to the bit.

  One `fit_and_evaluate` each way; what its `_dispatched` returned (before `add_intervals`) is
  noted as it returns."""
  spare = predictions_intervals.spare_device()
  assert spare is not None and spare != jax.devices()[0]  # else this test checks nothing
  dispatched, noted = predictions._dispatched, []

  def noting(*args, **kwargs):
    pending, fitted, resampled = dispatched(*args, **kwargs)
    tests = {name: entry["test"] for name, entry in pending["calibrators"].items()}
    noted.append({name: ({metric: interval["lower"].devices()
                          for metric, interval in test["intervals"].items()}
                         if "intervals" in test else None) for name, test in tests.items()})
    return pending, fitted, resampled

  monkeypatch.setattr(predictions, "_dispatched", noting)
  on_spare, _ = predictions.fit_and_evaluate(**arrays, bootstrap_samples=50, seed=3)
  intervals = noted[-1]["isotonic"]
  assert intervals is not None, "the intervals were not dispatched with the rest"
  assert list(intervals) == list(predictions.INTERVAL_KEYS)
  assert intervals["smooth_ece"] == {spare}
  monkeypatch.setattr(predictions_intervals, "spare_device", lambda: None)
  last, _ = predictions.fit_and_evaluate(**arrays, bootstrap_samples=50, seed=3)
  assert noted[-1]["raw"] is None  # added by add_intervals
  assert on_spare == last  # Python floats widened exactly from float32: the same bits
  for name, entry in last["calibrators"].items():
    assert list(entry["test"]["intervals"]) == list(predictions.INTERVAL_KEYS), name
    interval = entry["test"]["intervals"]["smooth_ece"]  # a percentile interval, resampled
    assert interval["lower"] < interval["upper"] and interval["std"] > 0, name


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 5])
def test_the_interval_keys_are_jax_random_split_of_the_seed(seed):
  got = predictions_intervals.interval_keys(seed)
  want = jax.random.split(jax.random.key(seed), len(predictions.INTERVAL_KEYS))
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert np.array_equal(jax.random.key_data(g), jax.random.key_data(w))


_DEVICES = ("import sys; sys.path.insert(0, {root!r}); sys.argv = ['eval.py', '--predictions=x'];"
            "from calib_jax.cli import evaluate; evaluate._second_cpu_device(); import jax;"
            "print(len(jax.devices('cpu')))")


@pytest.mark.parametrize("user_flags, devices", [("", 2), (
    "--xla_force_host_platform_device_count=3", 3)])
def test_eval_predictions_asks_jax_for_a_second_cpu_device_unless_the_user_chose(
    user_flags, devices):
  env = {**os.environ, "XLA_FLAGS": user_flags, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", _DEVICES.format(root=ROOT)], capture_output=True,
                        text=True, timeout=300, env=env)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().splitlines()[-1] == str(devices)
