"""Progress bar, JSON-lines + TensorBoard metrics, and checkpoint retention (no model needed)."""
import glob
import io
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from calib_jax.training import checkpoint, logging as log_lib, parallel, state as state_lib


def test_progress_line_reports_rate_and_eta():
  bar = log_lib.ProgressBar(total_steps=100, start_step=10, stream=io.StringIO())
  bar.update(10)  # First step of this process: the rate is measured from here.
  first = bar._first_time
  line = bar.line(30, "loss 1.0", now=first + 4.0)  # 20 steps in 4 s -> 5 steps/s, 70 left.
  assert "30/100" in line and "5.00 steps/s" in line and "ETA 0:00:14" in line
  assert line.endswith("loss 1.0")
  assert "-- steps/s" in bar.line(10, now=first)
  assert log_lib.format_duration(3725) == "1:02:05"


def test_metric_writer_appends_jsonl_and_tensorboard_scalars(tmp_path):
  import tensorflow as tf
  writer = log_lib.MetricWriter(str(tmp_path))
  writer.write(5, "train", {"loss": np.float32(1.5), "accuracy": 0.25})
  writer.write(10, "val", {"ece": 0.125})
  writer.close()
  assert log_lib.read_metrics(str(tmp_path)) == [
      {"step": 5, "split": "train", "loss": 1.5, "accuracy": 0.25},
      {"step": 10, "split": "val", "ece": 0.125}]
  events = glob.glob(os.path.join(tmp_path, log_lib.TENSORBOARD_SUBDIR, "events.out.tfevents.*"))
  assert len(events) == 1
  scalars = {}
  for event in tf.compat.v1.train.summary_iterator(events[0]):
    for value in event.summary.value:
      assert value.metadata.plugin_data.plugin_name == "scalars"
      scalars[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
  assert scalars == {("train/loss", 5): 1.5, ("train/accuracy", 5): 0.25, ("val/ece", 10): 0.125}


def test_checkpointer_keeps_newest_and_restores_into_sharding(tmp_path):
  mesh = parallel.make_mesh(jax.devices()[:2])
  tx = optax.sgd(0.1, momentum=0.9)
  state = parallel.replicate(state_lib.create(
      {"params": {"w": jnp.arange(6.0).reshape(2, 3)}}, tx, jax.random.key(3)), mesh)
  ckpt = checkpoint.Checkpointer(str(tmp_path), save_every_steps=2, max_to_keep=2)
  for step in range(1, 8):
    state = state.replace(step=state.step + 1, params={"w": state.params["w"] + 1})
    assert ckpt.maybe_save(step, state, {"data_position": step}) == (step % 2 == 0)
  ckpt.save(7, state, {"data_position": 7})
  ckpt.wait()
  assert ckpt.all_steps() == [6, 7]
  restored, meta = ckpt.restore(checkpoint.abstract_like(state), step=6)
  ckpt.close()
  assert meta == {"data_position": 6} and int(restored.step) == 6
  np.testing.assert_array_equal(restored.params["w"], np.arange(6.0).reshape(2, 3) + 6)
  assert restored.params["w"].sharding == parallel.replicated(mesh)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.key(3)), restored.rng)
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    checkpoint.Checkpointer(str(tmp_path / "none")).restore(None)
