"""`config.data.on_device`: the processed training split resident on the devices, each batch
gathered inside the compiled call from the training stream's example positions.

The host's order (`data.resident.train_order`) and the resident rows
(`data.resident.processed_split`) reproduce the tf.data training stream exactly, so a run with
the split on the devices ends with the same parameters, bit for bit, as the same run fed by
tf.data: with k steps per call, across a resume, with CRL's per-example history.
"""
import jax
import numpy as np
import pytest

from calib_jax import config as config_lib
from calib_jax import data, experiment
from calib_jax.data import resident
from calib_jax.training import parallel, reporting
from calib_jax.run import loop, single
from test_run_loop import (_assert_same_state,  # noqa: F401
                             quick_rng_compilation, tiny_config)

ON = {"data.on_device": True}


@pytest.mark.parametrize("layout", [
    dict(seed=0, start_batch=0),
    dict(seed=3, start_batch=37),                                  # a resume in epoch 1
    dict(seed=1, start_batch=5, process_index=1, process_count=2),  # host 1's shard of 2
    dict(seed=2, start_batch=0, shuffle_buffer=100),               # a buffer below the split
])
def test_order_and_resident_rows_are_the_tf_data_training_stream(layout):
  stream = data.make_dataset("digits", "train", batch_size=32, train=True, return_index=True,
                             **layout)
  order = resident.train_order("digits", "train", batch_size=32, **layout)
  rows = resident.processed_split("digits", "train")
  assert order.batches_per_epoch == stream.batches_per_epoch
  assert set(rows) == {"image", "label", "mask"}
  for _ in range(2 * stream.batches_per_epoch + 3):  # past two reshuffles
    batch, positions = next(stream), next(order)
    np.testing.assert_array_equal(positions["index"], batch["index"])
    for key in rows:
      np.testing.assert_array_equal(rows[key][positions["index"]], batch[key])


def test_a_random_processing_cannot_be_read_once():
  assert resident.random_options("digits") == []
  assert resident.random_options("digits", crop="pad", flip=True) == ["crop='pad'", "flip=True"]
  with pytest.raises(ValueError, match="has crop='pad'"):
    resident.processed_split("digits", "train", crop="pad")


@pytest.mark.parametrize("num_steps, steps_per_dispatch", [(12, 1), (10, 4)])
def test_on_device_trains_bit_identically_to_the_tf_data_stream(tmp_path, num_steps,
                                                                steps_per_dispatch):
  """Same positions, same values, same program around them: equal parameters, optimiser state
  and logged losses. (10, 4): calls of 4, 4 and 2 steps."""
  runs = {}
  for name, extra in (("tf_data", {}), ("on_device", ON)):
    config = tiny_config(num_train_steps=num_steps, steps_per_dispatch=steps_per_dispatch,
                         **extra)
    runs[name] = loop.train_and_evaluate(config, str(tmp_path / name))
  _assert_same_state(runs["tf_data"], runs["on_device"])
  logged = [[(r["step"], r["loss"], r["accuracy"]) for r in
             reporting.read_metrics(str(tmp_path / k)) if r["split"] == "train"] for k in runs]
  assert logged[0] == logged[1] and len(logged[0]) == 2


def test_on_device_resumes_exactly_and_crl_keys_its_history_by_the_positions(tmp_path):
  """CRL (`index` from the positions) with a stop at step 6 and a resume, against the
  uninterrupted tf.data run: the parameters and the correctness history are bit-equal."""
  reference = loop.train_and_evaluate(tiny_config(crl_weight=0.5, num_train_steps=12),
                                      str(tmp_path / "reference"))
  workdir = str(tmp_path / "resumed")
  stopped = loop.train_and_evaluate(tiny_config(crl_weight=0.5, num_train_steps=12,
                                                stop_after_steps=6, **ON), workdir)
  assert int(stopped.step) == 6
  resumed = loop.train_and_evaluate(tiny_config(crl_weight=0.5, num_train_steps=12, **ON),
                                    workdir)
  _assert_same_state(reference, resumed)
  history = jax.device_get((reference.crl_correctness, resumed.crl_correctness))
  assert np.any(history[0] != 0)  # the history was written
  np.testing.assert_array_equal(*history)


def test_the_resident_split_is_a_replicated_argument_that_is_not_donated():
  exp = experiment.build(tiny_config(**ON))
  trainee = single.SingleRun(exp)
  multi_step = trainee.multi_step()
  split = multi_step.resident_split
  assert split["image"].shape == (exp.length.num_train_examples, 8, 8, 1)
  assert split["image"].sharding.is_fully_replicated
  indices = trainee.put({"index": np.stack([next(trainee.train_stream(0))["index"]])})
  assert trainee.per_step  # a CNN on CPU: a list of one-step inputs (programs.calls_each_step)
  state = trainee.initial_state()
  lowered = multi_step.program.lower(state, split, indices[0])
  shapes = [a.shape for a in jax.tree.leaves(lowered.args_info)]
  assert split["image"].shape in shapes  # an argument, not a constant of the program
  for _ in range(2):
    state, _ = multi_step(state, indices)
  assert not split["image"].is_deleted()  # read by every call, never donated


@pytest.mark.parametrize("options, named", [
    ({"data.train_options.crop": "pad"}, "crop='pad'"),
    ({"data.train_options.flip": True}, "flip=True"),
])
def test_on_device_with_a_random_processing_is_one_line_naming_the_option(options, named):
  with pytest.raises(config_lib.ConfigError) as error:
    experiment.build(tiny_config(**ON, **options))
  lines = str(error.value).splitlines()[1:]
  assert len(lines) == 1 and "data.on_device needs a training processing without " \
      "randomness" in lines[0] and named in lines[0]


def test_a_split_too_large_for_the_devices_is_one_line(monkeypatch, tmp_path):
  monkeypatch.setattr(parallel, "device_memory_bytes", lambda mesh: 100_000)
  with pytest.raises(config_lib.ConfigError, match=r"data.on_device: the processed training "
                     r"split of digits \(0.3 MiB\) does not fit in 50% of a device's memory"):
    loop.train_and_evaluate(tiny_config(**ON), str(tmp_path / "run"))
  # Nothing was left open: with the bound lifted, the same work directory trains.
  monkeypatch.undo()
  state = loop.train_and_evaluate(tiny_config(num_train_steps=2, **ON), str(tmp_path / "run"))
  assert int(state.step) == 2
