"""eval.py's post-hoc toolkit on a trained run (`evaluation.toolkit.PosthocReport`): the same
numbers as `evaluate_predictions` on the run's own logits, the report's PreT/PosT tables agree,
OOD sets (a split, another dataset's split, context-only images: the last of a model's fresh
weights), the one-line config errors."""
import json
import os

import numpy as np
import pytest

from calib_jax import data
from calib_jax.config import ConfigError
from calib_jax.evaluation import predictions, run as evaluation
from calib_jax.run import loop
from test_evaluation_maps import _evaluate_fresh_weights
from test_evaluation_run import clutter_config, unrendered  # noqa: F401
from test_run_loop import quick_rng_compilation, tiny_config  # noqa: F401


def _quick(config, **eval_fields):
  config.eval.pnorm_candidates = (2,)
  config.eval.bootstrap_samples = 50
  config.eval.cam_images = 0
  for key, value in eval_fields.items():
    config.eval[key] = value
  return config


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
  config = _quick(tiny_config(), calibrators=("temperature", "isotonic"))
  workdir = str(tmp_path_factory.mktemp("toolkit") / "run")
  loop.train_and_evaluate(config, workdir)
  return config, workdir


@pytest.fixture(scope="module")
def digits_report(digits_run):
  """eval.py's report of `digits_run` (read, not changed, by the tests that share it)."""
  config, workdir = digits_run
  return evaluation.evaluate_run(config, workdir)


def test_the_toolkit_is_evaluate_predictions_of_the_runs_logits(digits_run, digits_report):
  _, workdir = digits_run
  results = digits_report
  posthoc = results["posthoc"]
  assert set(posthoc["calibrators"]) == {"raw", "temperature", "isotonic"}
  assert posthoc["num_test"] == results["pre_temperature"]["num_samples"]
  assert posthoc["num_val"] == results["fit"]["num_samples"]
  raw, scaled = posthoc["calibrators"]["raw"]["test"], posthoc["calibrators"]["temperature"]["test"]
  pre, post = results["pre_temperature"], results["post_temperature"]
  # The same logits, binned the same way: the streaming report and the toolkit agree.
  for key in ("accuracy", "ece", "nll", "brier"):
    assert raw[key] == pytest.approx(pre[key], abs=2e-5), key
  # The PreT table's AURC is the streaming histogram's estimate (within its error bound); the
  # report's selective table has the exact MSP AURC of the same samples.
  assert raw["aurc"] == pytest.approx(results["selective"]["msp"]["aurc"], abs=1e-6)
  assert raw["aurc"] == pytest.approx(pre["aurc"], abs=1e-3)
  # Both fit the temperature by NLL on the same validation logits.
  assert scaled["ece"] == pytest.approx(post["ece"], abs=2e-3)
  assert scaled["nll"] == pytest.approx(post["nll"], abs=2e-3)
  interval = raw["intervals"]["ece"]
  assert interval["lower"] <= raw["ece"] + 1e-6 and raw["ece"] - 1e-6 <= interval["upper"]
  conformal_keys = set(posthoc["calibrators"]["raw"]["conformal"])
  assert {f"{name}@{alpha}" for name in ("thr", "aps", "raps", "saps")
          for alpha in ("0.1", "0.05")} <= conformal_keys
  for alpha in ("0.1", "0.05"):  # the Mondrian sets, or why a class had too few samples
    mondrian = {f"{name}-class@{alpha}" for name in ("thr", "aps", "raps", "saps")}
    assert mondrian <= conformal_keys or (not mondrian & conformal_keys and f"conformal-class@"
                                          f"{alpha}" in posthoc["skipped"])
  assert set(posthoc["failure"]) == {"msp", "max_logit", "neg_entropy", "energy", "pnorm"}
  assert "ood" not in posthoc
  # The written file and plots, and the console table's toolkit part.
  with open(os.path.join(evaluation.eval_dir(workdir, "test"), "metrics.json")) as f:
    assert json.load(f)["posthoc"]["calibrators"]["isotonic"]["test"]["ece"] == pytest.approx(
        posthoc["calibrators"]["isotonic"]["test"]["ece"])
  for name in ("posthoc_reliability", "smooth_reliability"):
    assert os.path.getsize(results["files"][name]) > 1000
  table = evaluation.format_table(results)
  assert "post-hoc toolkit: fitted on val, reported on test" in table
  assert "isotonic" in table and "conformal sets" in table


def test_the_toolkit_recomputed_from_the_saved_logits(digits_run, digits_report):
  """Everything the toolkit reports is `evaluate_predictions` of the run's val/test logits:
  recomputed here from logits predicted independently of the report."""
  import jax
  from calib_jax import experiment as experiment_lib
  from calib_jax.training import step as step_lib
  config, workdir = digits_run
  results = digits_report
  experiment = experiment_lib.build(config)
  variables, _ = evaluation.restore_variables(experiment, workdir)
  predict = step_lib.make_predict_fn(experiment.model, experiment.mesh)
  arrays = {}
  for role, name in (("val", "val"), ("test", "test")):
    logits, labels = [], []
    for batch in experiment.data.eval_stream(role, experiment.mesh):
      keep = np.asarray(batch["mask"])
      logits.append(np.asarray(jax.device_get(predict(variables, batch)))[keep])
      labels.append(np.asarray(batch["label"])[keep])
    arrays[f"{name}_logits"], arrays[f"{name}_labels"] = np.concatenate(logits), np.concatenate(
        labels)
  again = predictions.evaluate_predictions(**arrays, calibrators=("temperature", "isotonic"),
                                           bootstrap_samples=50, seed=config.seed)
  for name, entry in again["calibrators"].items():
    for key, value in entry["test"].items():
      if key != "intervals":
        assert results["posthoc"]["calibrators"][name]["test"][key] == pytest.approx(
            value, abs=1e-5), (name, key)
  assert results["posthoc"]["failure"]["msp"]["auroc"] == pytest.approx(
      again["failure"]["msp"]["auroc"], abs=1e-6)


@pytest.mark.usefixtures("unrendered")  # (the numbers only; the first test reads the PNGs)
def test_ood_the_test_split_itself_is_indistinguishable(digits_run):
  """OOD = another copy of the test split ('DATASET:SPLIT' of the same dataset): every score ties
  pairwise, so every AUROC is exactly 0.5."""
  config, workdir = digits_run
  config = _quick(tiny_config(), calibrators=(), ood="digits:test")
  results = evaluation.evaluate_run(config, workdir)
  posthoc = results["posthoc"]
  assert posthoc["num_ood"] == posthoc["num_test"]
  for name, table in posthoc["ood"].items():
    assert table["auroc"] == pytest.approx(0.5, abs=1e-6), name
  assert "OOD set 'digits:test'" in evaluation.format_table(results)


@pytest.mark.usefixtures("unrendered")
def test_ood_a_split_of_the_same_dataset(digits_run):
  config, workdir = digits_run
  config = _quick(tiny_config(), calibrators=(), ood="val")
  posthoc = evaluation.evaluate_run(config, workdir)["posthoc"]
  assert posthoc["num_ood"] == posthoc["num_val"]
  assert all(0.0 <= t["auroc"] <= 1.0 for t in posthoc["ood"].values())


@pytest.mark.usefixtures("unrendered")
def test_ood_context_only_images(tmp_path):
  # No intervals: this is the only report of clutter's shapes, so the intervals' programs (the
  # smooth-ECE one the costliest to compile) would be compiled for it alone; the OOD part does
  # not read them, and test_the_toolkit_is_evaluate_predictions_of_the_runs_logits checks them.
  config = _quick(clutter_config(), calibrators=("temperature",), ood="context",
                  bootstrap_samples=0)
  # Freshly initialised weights, not a trained run: the OOD part reads the context images'
  # logits whatever the weights are, and the report's programs are then test_evaluation_maps.py's
  # (its first test evaluates the same model's fresh weights); training compiled its own.
  posthoc = _evaluate_fresh_weights(config, tmp_path)["posthoc"]
  assert posthoc["num_ood"] == posthoc["num_test"] == 64
  assert all(0.0 <= t["auroc"] <= 1.0 for t in posthoc["ood"].values())


@pytest.mark.parametrize("field, value, message", [
    ("ood", "context", "eval.ood='context' needs boxes"),
    ("ood", "nosuch:test", "unknown dataset 'nosuch'; valid names:"),
    ("ood", "cifar10:test", "cifar10 is a classification set of 3-channel inputs; the model "
                            "takes 1-channel"),
    ("ood", "digits:", "name the split as 'DATASET:SPLIT'"),
    ("calibrators", ("temperature", "platt_typo"), "unknown calibrator 'platt_typo'; valid"),
    ("conformal_alphas", (0.1, 1.5), "eval.conformal_alphas must be miscoverage levels"),
    ("bootstrap_samples", -1, "eval.bootstrap_samples must be an int >= 0"),
])
def test_toolkit_settings_are_checked_in_one_line(tmp_path, field, value, message):
  config = tiny_config()
  config.eval[field] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    evaluation.evaluate_run(config, str(tmp_path))


def test_normalize_as_uses_the_other_datasets_statistics():
  own = next(iter(data.make_dataset("clutter_objects", "test", batch_size=4, train=False,
                                    tfds_name="clutter_objects/tiny")))["image"]
  other = next(iter(data.make_dataset("clutter_objects", "test", batch_size=4, train=False,
                                      tfds_name="clutter_objects/tiny",
                                      normalize_as="cifar10")))["image"]
  mine, theirs = data.info("clutter_objects"), data.info("cifar10")
  pixels = np.asarray(own) * np.asarray(mine.std) + np.asarray(mine.mean)
  np.testing.assert_allclose(other, (pixels - np.asarray(theirs.mean)) / np.asarray(theirs.std),
                             atol=1e-5)
  with pytest.raises(ValueError, match="normalize_as='digits' has no image statistics for 3"):
    data.make_dataset("clutter_objects", "test", batch_size=4, train=False,
                      tfds_name="clutter_objects/tiny", normalize_as="digits")
