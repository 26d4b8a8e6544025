"""Progress bar, JSON-lines + TensorBoard metrics, and checkpoint retention (no model needed)."""
import glob
import io
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tqdm.std

from calib_jax.training import checkpoint, parallel, reporting, state as state_lib


class _Terminal(io.StringIO):
  def isatty(self) -> bool:
    return True


@pytest.fixture
def clock(monkeypatch):
  """A manual clock for tqdm (it reads `time()` of its module when a bar opens)."""
  now = [1000.0]
  monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
  return now


def test_progress_line_reports_rate_and_eta(clock):
  stream = _Terminal()
  bar = reporting.ProgressBar(total_steps=100, start_step=10, stream=stream)
  bar.update(10)  # First step of this process: the rate is measured from here.
  assert "10/100" in stream.getvalue() and "? steps/s" in stream.getvalue()
  clock[0] += 4.0
  bar.update(30, "loss 1.0")  # 20 steps in 4 s -> 5 steps/s, 70 left -> 14 s.
  last = stream.getvalue().split("\r")[-1]
  assert "30/100" in last and "5.00 steps/s" in last and "ETA 00:14" in last
  assert last.rstrip().endswith("loss 1.0")
  bar.close()
  assert stream.getvalue().endswith("\n")


def test_progress_throttles_on_files_and_prints_on_process_zero_only(clock, monkeypatch):
  stream = io.StringIO()  # Not a terminal: at most one line per 30 s, each its own line.
  bar = reporting.ProgressBar(total_steps=100, stream=stream)
  for step in range(1, 61):
    bar.update(step, f"loss {step}")
    clock[0] += 1.0
  bar.update(61, force=True)
  bar.close()
  lines = stream.getvalue().splitlines()
  assert [line.split()[0] for line in lines] == ["1/100", "31/100", "61/100"]
  assert "\r" not in stream.getvalue() and "1.00 steps/s" in lines[1]
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  quiet = io.StringIO()
  other = reporting.ProgressBar(total_steps=10, stream=quiet)
  other.update(1, force=True)
  other.close()
  assert quiet.getvalue() == ""


def test_result_lines_go_to_stdout_once_and_a_file_bar_is_not_redrawn(clock, capsys):
  stream = io.StringIO()  # A log file or pipe: every redraw would be a line of its own.
  bar = reporting.ProgressBar(total_steps=10, stream=stream)
  bar.update(1)
  bar.update(10, "loss 0.5", force=True)
  drawn = stream.getvalue()
  bar.write("step 10 val accuracy=0.5000")
  assert capsys.readouterr().out == "step 10 val accuracy=0.5000\n"
  assert stream.getvalue() == drawn
  bar.close()


def test_metric_writer_appends_jsonl_and_tensorboard_scalars(tmp_path):
  import tensorflow as tf
  writer = reporting.MetricWriter(str(tmp_path))
  writer.write(5, "train", {"loss": np.float32(1.5), "accuracy": 0.25})
  writer.write(10, "val", {"ece": 0.125})
  writer.close()
  assert reporting.read_metrics(str(tmp_path)) == [
      {"step": 5, "split": "train", "loss": 1.5, "accuracy": 0.25},
      {"step": 10, "split": "val", "ece": 0.125}]
  events = glob.glob(os.path.join(tmp_path, reporting.TENSORBOARD_SUBDIR, "events.out.tfevents.*"))
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
    assert ckpt.maybe_save(step, state, {"epoch": step / 4}) == (step % 2 == 0)
  ckpt.save(7, state, {"epoch": 7 / 4})
  ckpt.wait()
  assert ckpt.all_steps() == [6, 7]
  restored, meta = ckpt.restore(checkpoint.abstract_like(state), step=6)
  ckpt.close()
  assert meta == {"epoch": 6 / 4} and int(restored.step) == 6
  np.testing.assert_array_equal(restored.params["w"], np.arange(6.0).reshape(2, 3) + 6)
  assert restored.params["w"].sharding == parallel.replicated(mesh)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.key(3)), restored.rng)
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    checkpoint.Checkpointer(str(tmp_path / "none")).restore(None)
