"""The pictures of eval.py: CAM grids and localisation scores, segmentation confidence maps."""
import json
import logging
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

from calib_jax import data, metrics, models, plotting_maps
from calib_jax import config as config_lib
from calib_jax import experiment
from calib_jax.evaluation import report, run as evaluation
from calib_jax.evaluation import maps
from calib_jax.training import step as step_lib
from test_evaluation_run import (TINY_CLUTTER, clutter_config, pngs_unrendered,  # noqa: F401
                                 tiny_fcn)
from test_run_loop import quick_rng_compilation  # noqa: F401

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CAM_PNGS = (maps.CAMS_FILE, maps.CONTEXT_CAMS_FILE)


def _png(path):
  """The decoded PNG [H, W, channels] (checks the file is one)."""
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  return plt.imread(path)


def _evaluate_fresh_weights(config, tmp_path):
  """`evaluate_run` of freshly initialised weights given as a weight file (no training)."""
  built = experiment.build(config, devices=jax.devices()[:1])
  meta, model = built.meta, built.model
  variables = model.init(jax.random.key(0), jnp.zeros((1,) + tuple(meta.input_shape)))
  weights = models.save_variables(str(tmp_path / "weights.msgpack"), variables)
  return evaluation.evaluate_run(config, str(tmp_path / "run"), weights=weights)


def test_classification_eval_draws_cams_and_scores_localisation(tmp_path):
  config = clutter_config(**{"eval.cam_images": 6, "eval.context_eval": True,
                             "eval.max_examples": 16, "eval.pnorm_candidates": (2,),
                             "eval.toolkit": False})  # test_evaluation_toolkit.py's
  # The CAM grids rendered, not the calibration report's diagrams: this test reads the grids
  # alone (test_plotting.py renders each kind of those diagrams).
  with pngs_unrendered(rendered=CAM_PNGS):
    results = _evaluate_fresh_weights(config, tmp_path)
  loc = results["localisation"]
  assert loc["num_images"] == 16 and loc["layer"] == "features"
  for scores in (loc, loc["grad_cam_pp"]):
    assert 0.0 <= scores["pointing_game"] <= 1.0 and 0.0 < scores["energy_in_box"] < 1.0
  assert 0.0 < loc["box_area"] < 1.0
  with open(os.path.join(evaluation.eval_dir(str(tmp_path / "run"), "test"), "metrics.json")) as f:
    assert json.load(f)["localisation"] == loc
  files = results["files"]
  grid, context = _png(files["cams"]), _png(files["cams_context"])
  # 6 images, 4 per row: two rows of 12 panels, wider than tall.
  assert grid.shape == context.shape and grid.shape[1] > 2 * grid.shape[0]
  arrays = np.load(files["cam_arrays"])
  for prefix in ("cams", "cams_context"):
    assert arrays[f"{prefix}_images"].shape == (6, 32, 32, 3)
    assert arrays[f"{prefix}_probs"].shape == (6, 10)
    for method in ("grad_cam", "grad_cam_pp"):
      maps = arrays[f"{prefix}_{method}"]
      assert maps.shape == (6, 32, 32)
      np.testing.assert_allclose(maps.max(axis=(1, 2)), 1.0, rtol=1e-5)  # not constant
      np.testing.assert_allclose(maps.min(axis=(1, 2)), 0.0, atol=1e-6)
  # The context images are the same images with their objects filled in.
  assert not np.allclose(arrays["cams_images"], arrays["cams_context_images"])
  np.testing.assert_array_equal(arrays["cams_labels"], arrays["cams_context_labels"])
  assert "localisation of the true class's Grad-CAM (16 images)" in evaluation.format_table(results)


def test_segmentation_map_report_draws_confidence_maps(tmp_path, tiny_fcn):
  """The segmentation pictures straight from the evaluator (`evaluate_run` adds its results and
  files the same way as the classification ones above)."""
  seg = clutter_config(**{"data.name": "clutter_objects_seg", "model": tiny_fcn,
                          "model_kwargs": {}, "eval.seg_map_images": 3, "eval.max_examples": 16})
  built = experiment.build(seg)
  variables = built.model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  report = maps.MapReport(built, "test", step_lib.make_predict_fn(built.model, built.mesh))
  results = report.run(variables)
  files = report.write(str(tmp_path))
  assert sorted(files) == ["class_reliability", "seg_maps"]
  drawn = _png(files["seg_maps"])
  assert drawn.shape[:2] == (575, 700)  # three rows (1.75 in each, 0.5 in for the title)
  _png(files["class_reliability"])
  summary = results["seg_maps"]
  assert len(summary["classwise_ece"]) == 11
  assert all(0.0 <= e <= 1.0 for e in summary["classwise_ece"])
  labelled = sum(int(b["mask"].sum()) for b in data.make_dataset(
      "clutter_objects_seg", "val", batch_size=16, train=False, max_examples=16, **TINY_CLUTTER))
  assert summary["num_pixels"] == labelled
  assert "mean classwise ECE of the validation pixels" in "\n".join(
      maps.format_lines(results))


def test_models_without_feature_maps_skip_cams_with_one_info_line(caplog):
  config = clutter_config(model="mlp", model_kwargs={"hidden": (8,)})
  built = experiment.build(config)
  variables = built.model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  report = maps.MapReport(built, "test", predict=None)
  with caplog.at_level(logging.INFO):
    assert report.run(variables) == {}
  lines = [r for r in caplog.records if "No class activation maps" in r.getMessage()]
  assert len(lines) == 1 and lines[0].levelno == logging.INFO
  assert report.write("/nonexistent/never/written") == {}


@pytest.mark.parametrize("field", ["cam_images", "seg_map_images"])
def test_negative_picture_counts_are_one_line_errors(field):
  config = clutter_config(**{f"eval.{field}": -1})
  with pytest.raises(config_lib.ConfigError, match=f"eval.{field} must be an int >= 0"):
    experiment.build(config)


def test_classwise_bins_known_answer():
  # Two pixels, two classes, two bins: p = (0.73, 0.27) with label 0, (0.27, 0.73) with label 1.
  logits = jnp.array([[[1.0, 0.0], [0.0, 1.0]]])
  labels = jnp.array([[0, 1]])
  counts, conf, hits = maps.classwise_bins(logits, labels, jnp.ones((1, 2), bool), 2)
  np.testing.assert_array_equal(counts, [[1, 1], [1, 1]])
  p = float(jax.nn.sigmoid(1.0))
  np.testing.assert_allclose(conf, [[1 - p, p], [1 - p, p]], rtol=1e-6)
  np.testing.assert_array_equal(hits, [[0, 1], [0, 1]])
  # Per class: |0 - (1 - p)| + |1 - p| over 2 pixels.
  np.testing.assert_allclose(metrics.ece_from_bins(*map(np.asarray, (conf, hits)),
                                                   np.sum(counts, -1)), [1 - p, 1 - p], rtol=1e-6)
  masked = maps.classwise_bins(logits, labels, jnp.array([[True, False]]), 2)
  np.testing.assert_array_equal(masked[0], [[0, 1], [1, 0]])


def test_cam_grid_has_three_panels_per_image_and_colours_the_verdict(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  n = 5
  probs = np.full((n, 10), 0.05)
  probs[np.arange(n), [3, 3, 3, 1, 2]] = 0.55
  labels = np.array([3, 3, 3, 3, 3])
  saved = {}
  monkeypatch.setattr(plotting_maps.plotting, "save_png",
                      lambda fig, path: saved.setdefault("fig", fig) and path)
  plotting_maps.cam_grid(rng.uniform(size=(n, 8, 8, 3)), rng.uniform(size=(n, 8, 8)),
                         rng.uniform(size=(n, 8, 8)), probs, labels, str(tmp_path / "g.png"),
                         boxes=np.tile([[0.1, 0.1, 0.5, 0.5]], (n, 1, 1)))
  axes = [ax for ax in saved["fig"].axes if ax.images]
  assert len(axes) == 3 * n
  verdicts = [ax.xaxis.label.get_color() for ax in axes if ax.get_xlabel()]
  assert verdicts == [plotting_maps.CORRECT] * 3 + [plotting_maps.WRONG] * 2
  assert all(len(ax.patches) == 1 for ax in axes)  # the box, on every panel
  plt.close(saved["fig"])


def test_grey_images_are_drawn(tmp_path):
  """Single-channel inputs (digits, MNIST) come as [N, H, W, 1]."""
  rng = np.random.default_rng(0)
  images = rng.uniform(size=(2, 8, 8, 1))
  maps = rng.uniform(size=(2, 8, 8))
  probs = np.full((2, 10), 0.1)
  _png(plotting_maps.cam_grid(images, maps, maps, probs, np.array([0, 1]),
                              str(tmp_path / "grey.png")))
  labels = np.zeros((2, 8, 8), int)
  _png(plotting_maps.segmentation_maps(images, labels, labels, maps, str(tmp_path / "seg.png"),
                                       num_classes=3))
