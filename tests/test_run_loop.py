"""The training loop on the offline `digits` dataset: exact resume, NaN stop, bad configs, logs."""
import dataclasses
import importlib
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from calib_jax import data, models
from calib_jax.training import checkpoint
from calib_jax.run import loop, single
from calib_jax.training import programs
from calib_jax import experiment
from calib_jax import config as config_lib
from calib_jax.training import reporting
from calib_jax.config import variants

# The module (the package's `build` is its function).
build_module = importlib.import_module("calib_jax.experiment.build")


@pytest.fixture(autouse=True, scope="module")
def quick_rng_compilation():
  """Non-partitionable threefry: XLA:CPU compiles the partitionable variant's random-number
  kernels ~5x slower (seconds per model init). Only the random values differ, and these tests
  compare runs with each other, never against stored values."""
  previous = jax.config.jax_threefry_partitionable
  jax.config.update("jax_threefry_partitionable", False)
  yield
  jax.config.update("jax_threefry_partitionable", previous)


def tiny_config(**overrides):  # keys may be dotted: tiny_config(**{"data.batch_size": 16})
  """A few steps of a two-stage small CNN on sklearn digits (8x8), split over 8 fake devices."""
  config = config_lib.base_config()
  config.data.name = "digits"
  config.model = "small_cnn"
  config.model_kwargs.widths = (4, 8)
  config.data.batch_size = 32
  config.data.eval_batch_size = 64
  config.num_train_steps = 24
  config.optimizer.learning_rate = 0.1
  config.schedule.name = "cosine"
  config.schedule.warmup_epochs = 0.1
  config.checkpoint_every_steps = 8
  config.keep_checkpoints = 0
  config.log_every_steps = 8
  config.eval_every_steps = 0
  config.progress_bar = False
  config.tensorboard = False
  # eval.py's post-hoc toolkit: 50 bootstrap resamples, not 1000 (each smooth-ECE interval costs
  # ~2 ms per resample on CPU); tests/test_evaluation_toolkit.py checks the intervals themselves.
  config.eval.bootstrap_samples = 50
  return variants.override(config, overrides)


def _arrays(state):
  state = jax.device_get(state)
  return jax.tree.leaves((state.params, state.batch_stats, state.opt_state, state.step))


def _assert_same_state(a, b):
  for x, y in zip(_arrays(a), _arrays(b), strict=True):
    np.testing.assert_array_equal(x, y)


class _Interrupt(Exception):
  pass


def _make_dataset_failing_after(num_batches, monkeypatch, corrupt=False):
  """Wraps the real training stream: dies (or yields a NaN image) after `num_batches` batches."""
  real = data.make_dataset

  def wrapped(name, split, *, train, **kw):
    stream = real(name, split, train=train, **kw)
    if not train:
      return stream

    def gen():
      for i, batch in enumerate(stream):
        if i == num_batches:
          if not corrupt:
            raise _Interrupt(f"killed before batch {i}")
          batch = dict(batch, image=np.full_like(batch["image"], np.nan))
        yield batch
    return gen()

  monkeypatch.setattr(data, "make_dataset", wrapped)


def test_resume_after_kill_and_after_stop_gives_same_final_state(tmp_path, monkeypatch):
  reference = loop.train_and_evaluate(tiny_config(), str(tmp_path / "reference"))
  assert int(reference.step) == 24

  workdir = str(tmp_path / "interrupted")
  # 1) The process dies while fetching batch 10: only the periodic checkpoint of step 8 exists.
  with monkeypatch.context() as m:
    _make_dataset_failing_after(10, m)
    with pytest.raises(_Interrupt):
      loop.train_and_evaluate(tiny_config(), workdir)
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  assert ckpt.latest_step() == 8
  # 2) The same command with a per-run step budget stops after 6 more steps, with a checkpoint.
  stopped = loop.train_and_evaluate(tiny_config(stop_after_steps=6), workdir)
  assert int(stopped.step) == 14
  assert checkpoint.Checkpointer(workdir, read_only=True).latest_step() == 14
  # 3) The same command again finishes the run, identical to the uninterrupted one.
  resumed = loop.train_and_evaluate(tiny_config(), workdir)
  _assert_same_state(reference, resumed)

  records = reporting.read_metrics(workdir)
  train_steps = [r["step"] for r in records if r["split"] == "train"]
  assert train_steps == [8, 14, 16, 24]  # Before dying at step 10, then the resumed runs.
  saved = json.load(open(os.path.join(workdir, reporting.CONFIG_FILE)))
  assert saved["data"]["name"] == "digits" and saved["num_train_steps"] == 24


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
  workdir = str(tmp_path / "nan")
  _make_dataset_failing_after(10, monkeypatch, corrupt=True)
  with pytest.raises(loop.NonFiniteLossError, match=r"at step 11.*last good checkpoint is step 8"):
    loop.train_and_evaluate(tiny_config(), workdir)
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  assert ckpt.all_steps() == [8]
  restored, meta = ckpt.restore(None)
  assert meta["step"] == 8
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(restored["params"]))


@pytest.mark.parametrize("overrides, message", [
    ({"loss": "smoothing"}, r"unknown loss 'smoothing'; valid names: ce, ls"),
    ({"model": "resnet7"}, r"unknown model 'resnet7'; valid names: .*small_cnn"),
    ({"data.name": "cifar11"}, r"unknown dataset 'cifar11'; valid names: .*digits"),
    ({"optimizer.learning_rate": -0.1}, r"optimizer.learning_rate must be > 0, got -0.1"),
    ({"data.batch_size": 34}, r"data.batch_size=34 is not divisible by the number of devices"),
    ({"loss_kwargs": {"epsilon": 1.5}}, r"loss 'ce'"),
    ({"optimizer.name": "lion"}, r"unknown optimizer 'lion'; valid optimizers: sgd, adam, adamw"),
    ({"loss": "als"}, r"needs per-example objectness"),
])
def test_bad_config_fails_before_any_compilation(tmp_path, monkeypatch, overrides, message):
  def no_compile(*args, **kwargs):
    raise AssertionError("compiled before validating the config")

  monkeypatch.setattr(jax, "jit", no_compile)
  config = tiny_config()
  variants.override(config, overrides)
  with pytest.raises(config_lib.ConfigError, match=message):
    loop.train_and_evaluate(config, str(tmp_path / "bad"))
  assert not os.path.exists(tmp_path / "bad")


def test_validation_lists_every_problem_and_catches_typos():
  config = tiny_config(**{"optimizer.learning_rate": -1.0, "optimizer.momentum": 1.5,
                          "optimizer.sam_rho": -0.1})
  with pytest.raises(ValueError) as info:
    experiment.build(config)
  text = str(info.value)
  assert "learning_rate" in text and "momentum" in text and "sam_rho" in text
  config = tiny_config()
  with pytest.raises(AttributeError, match="learning_rat"):  # the schema is locked
    config.optimizer.learning_rat = 0.1


def test_a_configured_split_is_read_as_tfds_reads_it(monkeypatch):
  """`data.splits.train = 'train'` is the whole tfds split, not the dataset's registered
  training split that the role 'train' stands for when unset (Fashion-MNIST registers
  'train[:55000]'; here digits is given 'train[:1000]' of its 1297 training images)."""
  from calib_jax.data import registry
  digits = registry.spec("digits")
  monkeypatch.setitem(registry._DATASETS, "digits", dataclasses.replace(
      digits, meta=dataclasses.replace(digits.meta, train_split="train[:1000]")))
  alias = experiment.build(tiny_config()).data
  assert alias.split("train") == "train"  # the alias
  assert alias.train_stream(0, seed=0).num_examples == 1000
  whole = experiment.build(
      tiny_config(**{"data.splits.train": "train", "data.splits.val": "train[:10]"})).data
  assert whole.split("train") == "train[:100%]"
  assert whole.split("val") == "train[:10]"
  assert whole.num_train_examples() == 1297
  assert whole.train_stream(0, seed=0).num_examples == 1297


def test_epoch_length_matches_training_stream():
  config = tiny_config(num_train_steps=-1, num_epochs=2.5, **{"data.batch_size": 64})
  length = experiment.run_length(config, 1297)
  assert (length.steps_per_epoch, length.total_steps) == (1297 // 64, round(2.5 * (1297 // 64)))


@pytest.mark.parametrize("overrides", [
    {},
    {"data.splits.train": "train[:100]"},
    {"data.options.max_examples": 300, "crl_weight": 0.5},
])
def test_training_set_size_is_the_training_streams_count(overrides):
  """The size epochs, schedules and CRL's history are sized from is the `num_examples` the
  training stream itself reports (one count, in the data pipeline)."""
  config = tiny_config(**overrides)
  recipe = experiment.build(config).data
  size = recipe.num_train_examples()
  stream = recipe.train_stream(0, config.seed)
  assert size == stream.num_examples
  expected = {"train[:100]": 100}.get(config.data.splits.get("train"), 1297)
  assert size == min(expected, config.data.options.get("max_examples", expected))
  steps_per_epoch = experiment.run_length(config, size).steps_per_epoch
  assert steps_per_epoch == stream.batches_per_epoch  # one process: its batch is the global one


@pytest.mark.parametrize("num_steps, each_step", [(12, False), (10, False), (10, True)])
def test_several_steps_per_dispatch_train_exactly_like_one_step_per_dispatch(
    tmp_path, monkeypatch, num_steps, each_step):
  """k = 4 steps per call (a `lax.scan` over 4 stacked batches; with 10 steps the last call has
  2) against k = 1, same seed and data: the state after N steps is bit-identical. The scan's
  body is the same XLA computation as the one-step program, applied to the same batches in the
  same order, and XLA:CPU compiles it to the same arithmetic (no reassociation across steps).
  The scan is what TPU and GPU run; on CPU a CNN's k steps are k calls of the one-step program
  (`programs.calls_each_step`, `each_step=True`), and the test forces the scan for the others."""
  monkeypatch.setattr(programs, "calls_each_step", lambda mesh, params: each_step)
  one = loop.train_and_evaluate(tiny_config(num_train_steps=num_steps, steps_per_dispatch=1),
                                str(tmp_path / "k1"))
  four = loop.train_and_evaluate(tiny_config(num_train_steps=num_steps, steps_per_dispatch=4),
                                 str(tmp_path / "k4"))
  assert int(one.step) == int(four.step) == num_steps
  _assert_same_state(one, four)
  # Every step's metrics are still logged: the same records, step by step.
  logged = [[(r["step"], r["loss"]) for r in reporting.read_metrics(str(tmp_path / k))
             if r["split"] == "train"] for k in ("k1", "k4")]
  assert logged[0] == logged[1] and [s for s, _ in logged[0]] == [8, num_steps]


def test_cpu_calls_each_step_of_a_convolutional_model_only():
  """XLA:CPU runs convolutions in a loop body ~15x slower (jax-ml/jax#12868), so on CPU a CNN's
  k steps are k calls; an MLP keeps the scan (TPU/GPU always do: the dry run's devices)."""
  cnn = experiment.build(tiny_config())
  mlp = experiment.build(tiny_config(model="mlp", model_kwargs={"hidden": (16,)}))
  assert programs.calls_each_step(cnn.mesh, cnn.abstract_state().params)
  assert not programs.calls_each_step(mlp.mesh, mlp.abstract_state().params)
  assert single.SingleRun(cnn).per_step and not single.SingleRun(mlp).per_step


def test_an_evaluation_split_read_again_is_the_same_pass_of_one_pipeline(monkeypatch):
  """`DataRecipe.eval_stream` reads a split's one pipeline (`data.eval_pipeline`, built once per
  process) again from the start: every pass the same batches; another split or option, its own
  pipeline; another experiment of the config, the same one."""
  exp = experiment.build(tiny_config())
  recipe, mesh = exp.data, exp.mesh
  pipelines = []
  original = data.eval_pipeline
  monkeypatch.setattr(data, "eval_pipeline", lambda *args, **kwargs: pipelines.append(
      original(*args, **kwargs)) or pipelines[-1])
  passes = [[jax.device_get(b) for b in recipe.eval_stream("val", mesh)] for _ in range(2)]
  assert len(passes[0]) == 4  # 200 examples, batches of 64
  for first, second in zip(*passes, strict=True):
    for key in ("image", "label", "mask"):
      np.testing.assert_array_equal(first[key], second[key])
  assert int(sum(b["mask"].sum() for b in passes[0])) == 200
  next(recipe.eval_stream("test", mesh))
  list(recipe.eval_stream("val", mesh, max_examples=10))
  next(experiment.build(tiny_config()).data.eval_stream("val", mesh))
  val, again, test, fewer, other_experiment = pipelines
  assert again is val and other_experiment is val
  assert len({id(val), id(test), id(fewer)}) == 3


class _ListHidden(nn.Module):
  """A user's model with an unhashable field (a list): not a static argument of a program."""
  num_classes: int
  hidden: list = dataclasses.field(default_factory=lambda: [8])

  @nn.compact
  def __call__(self, x, train=False):
    del train
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


def test_equal_models_initialise_with_one_traced_program():
  """Experiments of one config (a sweep's members, a process's runs) share the init program;
  a registered model with an unhashable field initialises with a program of its own."""
  first, second = (experiment.build(tiny_config()) for _ in range(2))
  assert first.model is not second.model and first.model == second.model
  programs_before = build_module._shared_init._cache_size()  # pylint: disable=protected-access
  got = [e.initial_variables(jax.random.key(3)) for e in (first, second)]
  assert build_module._shared_init._cache_size() <= programs_before + 1  # one, or one already made
  # The program each call traced before: the same computation, so the same bits.
  want = jax.jit(lambda k, x: first.model.init({"params": k}, x, train=False))(
      jax.random.key(3), first.data.example_input())
  for variables in got:
    for x, y in zip(jax.tree.leaves(variables), jax.tree.leaves(want), strict=True):
      np.testing.assert_array_equal(x, y)
  models.register("test_list_hidden", _ListHidden)
  try:
    listed = experiment.build(tiny_config(model="test_list_hidden", model_kwargs={}))
    with pytest.raises(TypeError):
      hash(listed.model)
    variables = listed.initial_variables(jax.random.key(0))
    assert variables["params"]["Dense_0"]["kernel"].shape == (64, 8)
  finally:
    models.unregister("test_list_hidden")
