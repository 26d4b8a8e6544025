"""Evaluation under shift (`eval.py --shift`, `evaluation.shift.ShiftReport`) on a tiny trained
digits run over 8 fake devices: the metrics.json format, the clean cell against the report, the
on-device corruption against `shift.corrupt`, the host one (jpeg), resuming after an
interruption, ensembles, segmentation, bad specs."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import data
from calib_jax import experiment as experiment_lib
from calib_jax import shift
from calib_jax.config import ConfigError
from calib_jax.evaluation import run as evaluation
from calib_jax.evaluation import shift as shift_eval
from calib_jax.evaluation import shift_progress
from calib_jax.run import loop
from calib_jax.training import parallel
from test_evaluation_run import TINY_CLUTTER, pngs_unrendered, tiny_fcn, unrendered  # noqa: F401
from test_run_loop import quick_rng_compilation, tiny_config  # noqa: F401

SPEC = "gaussian_noise,jpeg_compression:1,2"  # jpeg: on the host, 8 devices
CELLS = ["clean"] + [f"{n}/{s}" for n in ("gaussian_noise", "jpeg_compression")
                   for s in (1, 2)]


def shift_config(**overrides):
  config = tiny_config(**{"num_train_steps": 8, **overrides})
  config.eval.toolkit = False
  config.eval.cam_images = 0
  config.eval.calibrators = ("temperature", "isotonic")
  config.eval.shift = SPEC
  return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("shift") / "run")
  config = shift_config()
  loop.train_and_evaluate(config, workdir)
  return config, workdir


@pytest.fixture(scope="module")
def evaluated(trained):
  config, workdir = trained
  with pngs_unrendered():  # these tests check the numbers, not the report's pictures
    return evaluation.evaluate_run(config, workdir)


def test_metrics_json_has_the_shift_entry_in_its_format(trained, evaluated):
  _, workdir = trained
  with open(os.path.join(evaluation.eval_dir(workdir, "test"), "metrics.json")) as f:
    part = json.load(f)["shift"]
  assert part["kind"] == "corruptions" and part["table"] == "cifar10"  # 8 px digits
  assert set(part) == {"table", "kind", "clean", "corruptions", "summary"}
  methods = {"pre_temperature", "post_temperature", "temperature", "isotonic"}
  assert set(part["clean"]) == methods
  assert set(part["corruptions"]) == {"gaussian_noise", "jpeg_compression"}
  for name in ("gaussian_noise", "jpeg_compression"):
    assert set(part["corruptions"][name]) == {"1", "2"}
    for cell in part["corruptions"][name].values():
      assert set(cell) == methods
      assert all(set(m) == set(shift_eval.METRICS) for m in cell.values())
      assert all(np.isfinite(v) for m in cell.values() for v in m.values())
  # The summary is the mean over the corruptions, per method and severity.
  for method in methods:
    for s in ("1", "2"):
      for k in shift_eval.METRICS:
        assert part["summary"][method][s][k] == pytest.approx(np.mean(
            [part["corruptions"][n][s][method][k] for n in ("gaussian_noise",
                                                             "jpeg_compression")]))
  # Temperature scaling keeps every prediction.
  assert part["clean"]["post_temperature"]["accuracy"] == part["clean"]["pre_temperature"][
      "accuracy"]
  lines = "\n".join(shift_eval.format_lines(evaluated))
  assert "severity 2" in lines and "clean" in lines and "ECE PosT" in lines
  assert "under shift" in evaluation.format_table(evaluated)


def test_the_clean_cell_is_the_reports_split_and_its_temperature(evaluated):
  """Digits are stored uint8 and not resized: the raw path (uint8, normalised on the device)
  gives the report's own numbers, and the shift's T is the report's."""
  clean = evaluated["shift"]["clean"]
  for method, table in (("pre_temperature", "pre_temperature"),
                        ("post_temperature", "post_temperature")):
    for key in ("accuracy", "ece", "nll", "brier"):
      assert clean[method][key] == pytest.approx(evaluated[table][key], abs=2e-5), (method, key)


def test_the_shifted_step_corrupts_on_the_device_as_shift_corrupt(trained):
  """The compiled cell program equals `shift.corrupt` on the host-read uint8 images, then the
  normalisation and the model."""
  config, workdir = trained
  experiment = experiment_lib.build(config)
  variables, _ = evaluation.restore_variables(experiment, workdir)
  report = shift_eval.ShiftReport(experiment, fit_samples=dict)
  predict, key, param = report._cell_inputs("gaussian_noise", 2)
  batch = next(experiment.data.eval_stream("test", experiment.mesh, raw_images=True))
  assert batch["image"].dtype == jnp.uint8
  got = predict(variables, batch, key, param)
  images = shift.corrupt(np.asarray(batch["image"]), "gaussian_noise", 2, key=key, table="cifar10")
  assert not np.array_equal(images, np.asarray(batch["image"]))
  mean, std = experiment.data.input_statistics()
  x = (images.astype(np.float32) / 255 - np.asarray(mean)) / np.asarray(std)
  want = experiment.model.apply(variables, jnp.asarray(x), train=False)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)


@pytest.mark.usefixtures("unrendered")
def test_an_interrupted_evaluation_resumes_with_the_remaining_cells(trained, evaluated,
                                                                   monkeypatch, tmp_path):
  config, workdir = trained
  progress = shift_progress.path(evaluation.eval_dir(workdir, "test"))
  saved = json.load(open(progress))
  assert sorted(saved["cells"]) == sorted(CELLS)
  os.remove(progress)
  computed = []
  original = shift_eval.ShiftReport._cell

  def interrupted(self, variables, name, severity, *args):
    if len(computed) == 2:
      raise KeyboardInterrupt
    computed.append(shift_progress.cell_name(name, severity))
    return original(self, variables, name, severity, *args)

  monkeypatch.setattr(shift_eval.ShiftReport, "_cell", interrupted)
  with pytest.raises(KeyboardInterrupt):
    evaluation.evaluate_run(config, workdir)
  assert sorted(json.load(open(progress))["cells"]) == sorted(computed) == sorted(CELLS[:2])
  computed.clear()
  monkeypatch.setattr(shift_eval.ShiftReport, "_cell",
                      lambda self, *a: computed.append(shift_progress.cell_name(*a[1:3]))
                      or original(self, *a))
  resumed = evaluation.evaluate_run(config, workdir)
  assert computed == CELLS[2:]  # only the remaining cells
  assert resumed["shift"] == evaluated["shift"]  # what an uninterrupted run gave
  # The cells are keyed by the checkpoint step and the config (all of it but eval.shift).
  key = json.load(open(progress))["key"]
  assert key["step"] == 8 and sorted(shift_progress.load(progress, key)) == sorted(CELLS)
  assert shift_progress.load(progress, {**key, "step": 4}) == {}
  other = shift_config()
  other.eval.shift = "all"
  assert shift_progress.run_key(other, {})["config"] == shift_progress.run_key(config, {})[
      "config"]
  other.eval.num_bins = 10
  assert shift_progress.run_key(other, {})["config"] != shift_progress.run_key(config, {})[
      "config"]


@pytest.mark.usefixtures("unrendered")
def test_rotate_kind_and_ensemble_of_a_sweep(tmp_path):
  config = shift_config(**{"num_train_steps": 2})
  config.sweep = "seed=0,1"
  config.eval.shift = "rotate"
  config.eval.calibrators = ()
  config.eval.bootstrap_samples = 0
  # No conformal sets: nothing here reads them; an ensemble's are test_sweep.py's
  # (test_eval_reports_the_members_as_one_ensemble) and test_evaluation_predictions.py's.
  config.eval.conformal_alphas = ()
  workdir = str(tmp_path / "sweep")
  loop.train_and_evaluate(config, workdir)
  results = evaluation.evaluate_ensemble(config, workdir)
  part = results["shift"]
  assert part["kind"] == "rotate" and set(part) == {"table", "kind", "clean", "rotate"}
  assert list(part["rotate"]) == [str(a) for a in shift.ROTATION_ANGLES]
  assert set(part["rotate"]["90"]) == {"pre_temperature", "post_temperature", "mean_member"}
  # Angle 0 is the clean split; the ensemble's NLL is at most its mean member's (Jensen).
  for key in shift_eval.METRICS:
    assert part["rotate"]["0"]["pre_temperature"][key] == pytest.approx(
        part["clean"]["pre_temperature"][key], abs=1e-6)
  for cell in part["rotate"].values():
    assert cell["pre_temperature"]["nll"] <= cell["mean_member"]["nll"] + 1e-5
  assert "90 deg" in evaluation.format_ensemble(results)


def test_segmentation_corrupts_the_image_and_scores_every_pixel(tiny_fcn, monkeypatch):
  """A random-init segmenter on generated scenes: per-pixel metrics before and after T, from
  the streaming accumulators; the images are corrupted, the label maps read as they are."""
  config = tiny_config(**{"data.name": "clutter_objects_seg", "model": tiny_fcn,
                          "model_kwargs": {}, "data.options": TINY_CLUTTER,
                          "data.eval_batch_size": 16})
  config.eval.shift = "impulse_noise:5"
  experiment = experiment_lib.build(config)
  variables = parallel.replicate(experiment.initial_variables(jax.random.key(0)),
                                 experiment.mesh)
  rng = np.random.default_rng(0)
  num_classes = experiment.meta.num_classes
  fit = {"logits": rng.normal(size=(500, num_classes)).astype(np.float32),
         "labels": rng.integers(0, num_classes, 500)}
  report = shift_eval.ShiftReport(experiment, fit_samples=lambda: fit)
  seen = []
  original = shift_eval._corrupted

  def spy(name, severity, table):
    corrupt = original(name, severity, table)
    return lambda images, key, param: seen.append(images.shape) or corrupt(images, key, param)

  monkeypatch.setattr(shift_eval, "_corrupted", spy)
  part = report.run(variables)["shift"]
  assert seen and len(seen[0]) == 4 and seen[0][-1] == 3  # the [B, H, W, 3] images only
  assert set(part["corruptions"]["impulse_noise"]["5"]) == {"pre_temperature",
                                                            "post_temperature"}
  for cell in (part["clean"], part["corruptions"]["impulse_noise"]["5"]):
    for method in cell.values():
      assert set(method) == set(shift_eval.METRICS)
      assert 0 <= method["accuracy"] <= 1 and method["nll"] > 0
  assert part["clean"]["pre_temperature"] != part["corruptions"]["impulse_noise"]["5"][
      "pre_temperature"]


@pytest.mark.parametrize("spec, line", [
    ("gaussian_nose", r"eval.shift 'gaussian_nose': unknown corruption 'gaussian_nose'; choose "
                      r"'all', 'rotate', 'dataset:NAME' or names of: gaussian_noise, shot_noise"),
    ("fog:0,6", r"eval.shift 'fog:0,6': severities must be comma-separated integers in 1..5"),
    ("dataset:nope", r"eval.shift='dataset:nope': 'nope' is not a corrupted set; valid names: "
                     r"cifar10_corrupted, imagenet2012_corrupted"),
    ("dataset:cifar10_corrupted", r"eval.shift='dataset:cifar10_corrupted': cifar10_corrupted "
                                  r"corrupts cifar10's test images; the model's dataset is "),
])
def test_a_bad_spec_is_one_line_among_the_configs_problems(spec, line):
  config = shift_config()
  config.eval.shift = spec
  with pytest.raises(ConfigError, match=line):
    experiment_lib.build(config)


def test_frost_without_its_textures_is_a_config_problem_before_anything_runs(monkeypatch):
  from calib_jax.shift import weather  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(weather.importlib.util, "find_spec", lambda name: None)
  assert shift.requirement_problems(["fog", "contrast"]) == []
  config = shift_config()
  config.eval.shift = "fog,frost:1"
  with pytest.raises(ConfigError, match=r"eval.shift='fog,frost:1': frost needs the frost "
                                        r"textures of the reference package: pip install "
                                        r"imagecorruptions-imaug"):
    experiment_lib.build(config)


def test_shift_on_a_text_dataset_or_segmentation_rotation_is_refused():
  config = shift_config(**{"data.name": "newsgroups20", "model": "gpool_cnn"})
  config.eval.shift = "all"
  with pytest.raises(ConfigError, match=r"eval.shift='all' corrupts images; dataset "
                                        r"'newsgroups20' is a text task"):
    experiment_lib.build(config)
  config = shift_config(**{"data.name": "clutter_objects_seg", "model": "small_cnn"})
  config.eval.shift = "rotate"
  config.eval.shift_table = "mnist"
  with pytest.raises(ConfigError) as error:
    experiment_lib.build(config)
  assert "turns the images but not their label maps" in str(error.value)
  assert "eval.shift_table='mnist': unknown table; choose one of imagenet, cifar10" in str(
      error.value)


def test_default_table_follows_the_image_size():
  assert shift_eval.default_table("cifar10", (32, 32)) == "cifar10"
  assert shift_eval.default_table("imagenet2012", (224, 224)) == "imagenet"
  assert shift_eval.default_table("tiny_imagenet", (64, 64)) == "tiny_imagenet"


def test_raw_images_are_the_normalised_images_before_normalisation():
  """The data option `raw_images`: uint8 images that `input_statistics` turns into exactly the
  pipeline's normalised ones (digits are stored uint8 and not resized); text refuses it."""
  normalised = next(data.make_dataset("digits", "test", batch_size=16, train=False))
  raw = next(data.make_dataset("digits", "test", batch_size=16, train=False, raw_images=True))
  assert raw["image"].dtype == np.uint8 and raw["image"].shape == normalised["image"].shape
  mean, std = data.PipelineOptions.create(data.info("digits"), {}).input_statistics(
      data.info("digits"))
  np.testing.assert_allclose((raw["image"] / 255.0 - np.asarray(mean)) / np.asarray(std),
                             normalised["image"], atol=1e-5)
  np.testing.assert_array_equal(raw["label"], normalised["label"])
  with pytest.raises(ValueError, match="newsgroups20 is a text dataset; raw_images is for "
                                       "images"):
    data.PipelineOptions.create(data.info("newsgroups20"), {"raw_images": True})


def test_stored_corrupted_sets_go_through_the_same_cells(tmp_path):
  """`--shift=dataset:cifar10_corrupted` on tfds mock data that serves the clean test images as
  every corrupted config: each stored cell then equals the clean cell, and the configs read are
  tfds' names of the corruption and severity."""
  import test_data_corrupted as stored  # pylint: disable=import-outside-toplevel
  images, labels = stored._images(12, 32, seed=3)  # pylint: disable=protected-access
  config = shift_config(**{"data.name": "cifar10", "model": "mlp",
                           "model_kwargs": {"hidden": (16,)}})
  config.eval.shift = "dataset:cifar10_corrupted"
  config.eval.calibrators = ("temperature",)
  read = []
  with stored._mock(images, labels, read):  # pylint: disable=protected-access
    experiment = experiment_lib.build(config)
    variables = parallel.replicate(experiment.initial_variables(jax.random.key(0)),
                                   experiment.mesh)
    fit = {"logits": np.random.default_rng(0).normal(size=(40, 10)).astype(np.float32),
           "labels": np.arange(40) % 10}
    report = shift_eval.ShiftReport(experiment, fit_samples=lambda: fit,
                                    progress_dir=str(tmp_path), run_key={"step": 0})
    # Two of the set's 19 corruptions, at two severities, keep the test short.
    report.spec = dataclasses.replace(report.spec, corruptions=("glass_blur", "fog"),
                                      severities=(1, 5))
    part = report.run(variables)["shift"]
  assert part["table"] == "dataset:cifar10_corrupted"
  assert set(part["corruptions"]) == {"glass_blur", "fog"}
  for name in ("glass_blur", "fog"):
    for severity in ("1", "5"):
      for method, values in part["corruptions"][name][severity].items():
        assert values == pytest.approx(part["clean"][method], rel=1e-5), (name, severity, method)
  configs = {c for name, c, _ in read if name == "cifar10_corrupted"}
  assert configs == {"frosted_glass_blur_1", "frosted_glass_blur_5", "fog_1", "fog_5"}
