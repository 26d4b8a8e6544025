"""The eval program on generated data: segmentation, context-only evaluation, pixel sampling.

(The classification path is checked against numpy re-computations in test_cli_train.py.)"""
import contextlib
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import data, metrics, models, plotting
from calib_jax.run import loop
from calib_jax.evaluation import report, run as evaluation
from test_run_loop import quick_rng_compilation, tiny_config  # noqa: F401


class TinyFCN(nn.Module):
  """A two-layer fully convolutional segmenter: logits [B, H, W, C] (the zoo's DeepLabs are
  too slow to compile in a unit test)."""
  num_classes: int

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.relu(nn.Conv(8, (3, 3))(x))
    return nn.Conv(self.num_classes, (1, 1), name="head")(x)


TINY_CLUTTER = {"tfds_name": "clutter_objects/tiny"}  # 256/64/64 generated images


def clutter_config(**overrides):
  """`tiny_config` on the tiny generated clutter set, 2 steps of batch 16."""
  return tiny_config(**{"data.name": "clutter_objects", "num_train_steps": 2,
                        "data.batch_size": 16, "data.eval_batch_size": 16,
                        "data.options": TINY_CLUTTER, **overrides})


def report_only(config):
  """`config` whose eval leaves out the post-hoc toolkit and the CAM grid, for the tests that
  look at the rest of the report (test_evaluation_toolkit.py and test_evaluation_maps.py check those; the
  segmentation eval below runs its whole report)."""
  config.eval.toolkit = False
  config.eval.cam_images = 0
  return config


def _closed_unrendered(fig, path):
  """`plotting.save_png` without the rendering: closes a pyplot figure, writes nothing."""
  if fig.canvas.manager is not None:
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    plt.close(fig)
  return path


@contextlib.contextmanager
def pngs_unrendered(rendered=()):
  """The reports' figures built but not rendered to PNG files (but those named `rendered`), for
  the tests that check an evaluation's numbers, not its pictures (rendering was ~1/5 of such a
  test's CPU). test_plotting.py renders each kind of figure; test_evaluation_maps.py and the
  first test of test_evaluation_toolkit.py read the PNGs `evaluate_run` writes."""
  save = plotting.save_png

  def save_some(fig, path):
    return (save if os.path.basename(path) in rendered else _closed_unrendered)(fig, path)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(plotting, "save_png", save_some)
    yield


@pytest.fixture
def unrendered():
  """`pngs_unrendered` around one test."""
  with pngs_unrendered():
    yield


@pytest.fixture
def tiny_fcn():
  """TinyFCN in the model registry (the public hook users register their own models with)."""
  models.register("test_tiny_fcn", TinyFCN)
  yield "test_tiny_fcn"
  models.unregister("test_tiny_fcn")


@pytest.mark.usefixtures("unrendered")
def test_segmentation_eval(tmp_path, tiny_fcn):
  seg = clutter_config(**{"data.name": "clutter_objects_seg", "model": tiny_fcn,
                          "model_kwargs": {}})
  seg.eval.score_pixels_per_image = 50
  seg.eval.fit_pixels_per_image = 20
  seg.eval.pnorm_candidates = (2,)  # One AURC per candidate p on the sampled pixels.
  # One image's confidence maps, not 4: the drawing itself is test_evaluation_maps.py's.
  seg.eval.seg_map_images = 1
  # No intervals: nothing here reads them, and the sampled pixels reach the toolkit as [N, C]
  # logits, whose intervals test_evaluation_toolkit.py (a run's report) and
  # test_evaluation_predictions.py check; their programs were ~1/4 of this test's CPU.
  seg.eval.bootstrap_samples = 0
  # One calibrator, not the default three: the toolkit on the sampled pixels runs the same
  # loop for each; vector scaling and isotonic regression (~1/3 of this test's CPU with their
  # plots) are fitted on a run's logits in test_evaluation_toolkit.py and
  # test_evaluation_predictions.py.
  seg.eval.calibrators = ("temperature",)
  loop.train_and_evaluate(seg, str(tmp_path / "seg"))
  results = evaluation.evaluate_run(seg, str(tmp_path / "seg"))
  assert 0.0 <= results["pre_temperature"]["miou"] <= 1.0
  # 64 test images: every labelled pixel in the streaming metrics, 50 sampled ones per image
  # (fewer only where an image has fewer labelled pixels) for the score-based metrics.
  assert results["pre_temperature"]["num_samples"] > 64 * 50
  assert 0 < results["selective_num_samples"] <= 64 * 50
  assert results["fit"]["num_samples"] <= 64 * 20


@pytest.mark.usefixtures("unrendered")
def test_context_only_eval_of_an_als_model(tmp_path):
  als = clutter_config(loss="als", **{"data.train_options": {"objectness": True,
                                                               "context_rate": 0.2}})
  als.eval.context_eval = True
  als.eval.pnorm_candidates = (2,)
  report_only(als)
  loop.train_and_evaluate(als, str(tmp_path / "als"))
  results = evaluation.evaluate_run(als, str(tmp_path / "als"))
  context = results["context"]
  assert context["num_samples"] == 64
  assert context["uniform_confidence"] == pytest.approx(0.1)
  assert 0.1 <= context["average_confidence"] <= 1.0
  assert 0.0 <= context["mean_entropy"] <= np.log(10) + 1e-5


def test_pixel_sampling_picks_only_labelled_pixels():
  mask = np.zeros((2, 4, 4), bool)
  mask[0, :2] = True       # 8 labelled pixels
  mask[1, 3, 3] = True     # 1 labelled pixel
  labels = np.arange(32, dtype=np.int32).reshape(2, 4, 4)
  logits = np.repeat(labels[..., None].astype(np.float32), 3, axis=-1)
  out_logits, out_labels, out_mask = report._sample_pixels(
      jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask), jax.random.key(0), 5)
  out_labels, out_mask = np.asarray(out_labels).reshape(2, 5), np.asarray(out_mask).reshape(2, 5)
  assert out_mask[0].sum() == 5 and out_mask[1].sum() == 1
  picked0 = out_labels[0][out_mask[0]]
  assert len(set(picked0)) == 5 and set(picked0) <= set(labels[0][mask[0]])
  assert out_labels[1][out_mask[1]].tolist() == [31]
  np.testing.assert_array_equal(np.asarray(out_logits)[:, 0], np.asarray(out_labels).ravel())


def test_pixel_sampling_is_metrics_subsample_pixels():
  """One draw: the report's sampled pixels are exactly those of the public function."""
  rng = np.random.default_rng(0)
  mask = rng.random((3, 8, 6)) < 0.5
  mask[1] = False
  mask[1, 0, :3] = True
  labels = np.arange(3 * 48, dtype=np.int32).reshape(3, 8, 6)
  logits = np.zeros((3, 8, 6, 2), np.float32)
  key = jax.random.key(4)
  _, out_labels, out_mask = report._sample_pixels(
      jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask), key, 10)
  picked = np.asarray(out_labels)[np.asarray(out_mask)]
  chosen = np.asarray(metrics.subsample_pixels(key, mask, 10))
  assert sorted(picked.tolist()) == sorted(labels[chosen].tolist())


def test_eval_without_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    evaluation.evaluate_run(tiny_config(), str(tmp_path / "empty"))


@pytest.fixture(scope="module")
def trained_clutter(tmp_path_factory):
  """One tiny clutter run trained with sgd (report_only), its workdir, its evaluation and the
  predictions file that evaluation saved, read at once (a later evaluation of the same workdir
  writes the file again)."""
  config = report_only(clutter_config(**{"optimizer.name": "sgd"}))
  config.eval.pnorm_candidates = (2,)
  workdir = str(tmp_path_factory.mktemp("clutter") / "run")
  loop.train_and_evaluate(config, workdir)
  with pngs_unrendered():  # the tests read the numbers and the saved predictions file
    results = evaluation.evaluate_run(config, workdir)
  with np.load(results["files"]["predictions"]) as saved:
    return workdir, results, dict(saved)


def test_eval_saves_the_plotted_predictions(trained_clutter):
  _, results, saved = trained_clutter
  assert saved["probs_pre"].shape == saved["probs_post"].shape == (64, 10)
  np.testing.assert_allclose(saved["probs_pre"].sum(-1), 1.0, rtol=1e-5)
  accuracy = np.mean(saved["probs_pre"].argmax(-1) == saved["labels"])
  assert accuracy == pytest.approx(results["pre_temperature"]["accuracy"], abs=1e-6)
  # Temperature scaling keeps each sample's predicted class.
  np.testing.assert_array_equal(saved["probs_pre"].argmax(-1), saved["probs_post"].argmax(-1))


@pytest.mark.usefixtures("unrendered")
def test_eval_reads_variables_only_whatever_the_optimiser_is_now(trained_clutter):
  """eval restores params/batch_stats alone: a config whose optimiser (hence optimiser-state
  structure) changed after training still evaluates the trained weights, to the same numbers."""
  workdir, before, _ = trained_clutter
  # Adam moments and a CRL history: another state shape.
  changed = report_only(clutter_config(crl_weight=1.0, **{"optimizer.name": "adam"}))
  changed.eval.pnorm_candidates = (2,)
  after = evaluation.evaluate_run(changed, workdir)
  assert after["step"] == before["step"] == 2
  assert after["pre_temperature"] == before["pre_temperature"]
