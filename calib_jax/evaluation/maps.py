"""The pictures of `eval.py`: class activation maps and pixel confidence maps (an evaluator).

`MapReport(experiment, split, predict)`; `run(variables)` returns the numbers to add
to `metrics.json` and `write(out_dir)` draws the figures (`calib_jax.plotting_maps`):

* classification on images, `eval.cam_images = N > 0`: `cams.png`, the Grad-CAM and Grad-CAM++
  maps (`calib_jax.explain`) of the predicted class for the first N images of the report split,
  and `cams_context.png`, the same on context-only images (every object box filled with the
  mean pixel) when the dataset has boxes and `eval.context_eval` is on; the maps and
  probabilities drawn go to `cams.npz`. On datasets with boxes, `localisation`: the pointing game
  and energy-in-box of the true class's maps over the whole report split, with the chance level
  `box_area`. Models without a convolutional feature map (MLP, ViT) skip all of this with one
  INFO log line.
* segmentation, `eval.seg_map_images = N > 0`: `seg_maps.png` (image | ground truth |
  prediction | confidence for the first N validation images) and `class_reliability.png`
  (classwise reliability of the validation pixels, one panel per class); `seg_maps` in the
  results holds the per-class ECEs.
"""
import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from calib_jax import explain, metrics
from calib_jax.evaluation import validation
from calib_jax.experiment import Experiment

CAMS_FILE, CONTEXT_CAMS_FILE, CAMS_ARRAYS = "cams.png", "cams_context.png", "cams.npz"
SEG_MAPS_FILE, CLASS_RELIABILITY_FILE = "seg_maps.png", "class_reliability.png"
MAX_BOXES = 4  # boxes per image read for the localisation scores


def display_images(images: np.ndarray, meta: Any) -> np.ndarray:
  """Model inputs `(x / 255 - mean) / std` back to [0, 1] for display (min-max per image when
  the dataset has no mean/std)."""
  if meta.mean is not None:
    return np.clip(images * np.asarray(meta.std) + np.asarray(meta.mean), 0.0, 1.0)
  low = images.min(axis=(1, 2, 3), keepdims=True)
  return (images - low) / np.maximum(images.max(axis=(1, 2, 3), keepdims=True) - low, 1e-12)


@functools.partial(jax.jit, static_argnames="num_bins")
def classwise_bins(logits: jax.Array, labels: jax.Array, mask: jax.Array,
                   num_bins: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per class k and equal-width bin of p_k (softmax of `logits` [..., C]) over the pixels of
  `mask`: pixel counts, sums of p_k and counts of label k; each [C, num_bins]. One batch of
  `metrics.ClasswiseCalibration(counts=True)` (the bins of classwise ECE, `(lo, hi]`)."""
  acc = metrics.ClasswiseCalibration.init(logits.shape[-1], num_bins, counts=True)
  acc = acc.update(logits=logits.astype(jnp.float32), labels=labels, mask=mask)
  return acc.counts, acc.confidence_sum, acc.hits


def _host(x: jax.Array) -> np.ndarray:
  return validation.to_host(x)


class MapReport:
  """CAM grids and localisation (classification) or confidence maps (segmentation)."""

  def __init__(self, experiment: Experiment, split: str,
               predict: Callable[[Any, Any], jax.Array]):
    self.experiment, self.split = experiment, split
    self.config, self.model, self.meta = experiment.config, experiment.model, experiment.meta
    self.predict = predict
    self._figures: dict[str, dict[str, Any]] = {}

  def _stream(self, role: str, **options: Any):
    return self.experiment.data.eval_stream(role, self.experiment.mesh,
                                            max_examples=self.config.eval.max_examples, **options)

  def run(self, variables: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the pictures (`localisation`, `seg_maps`), and the figures' data kept for
    `write`."""
    self._figures = {}
    e, task = self.config.eval, self.meta.task
    if task == "classification" and e.cam_images > 0 and len(self.meta.input_shape) == 3:
      return self._cams(variables)
    if task == "segmentation" and e.seg_map_images > 0:
      return self._segmentation(variables)
    return {}

  # ------------------------------------------------------------------------- classification

  def _cam_fn(self, variables, images):
    try:
      layer = explain.feature_layer(self.model, variables, images)
    except explain.NoFeatureMapError as error:
      logging.info("No class activation maps for %s: %s", self.config.model, error)
      return None, None
    return layer, jax.jit(functools.partial(explain.both_maps, self.model, layer=layer))

  def _figure_data(self, cam_fn, variables, batches, count):
    """The first `count` valid images of `batches` with their predicted-class maps."""
    parts: dict[str, list[np.ndarray]] = {}
    have = 0
    for batch in batches:
      if have >= count:
        break
      logits = self.predict(variables, batch)
      gc, gcpp, _ = cam_fn(variables, batch["image"], jnp.argmax(logits, -1))
      keep = _host(batch["mask"])
      values = {"images": display_images(_host(batch["image"]), self.meta),
                "grad_cam": _host(gc), "grad_cam_pp": _host(gcpp),
                "probs": _host(jax.nn.softmax(logits)), "labels": _host(batch["label"])}
      if "boxes" in batch:
        values["boxes"] = _host(batch["boxes"])
      for name, value in values.items():
        parts.setdefault(name, []).append(value[keep][:count - have])
      have += int(min(keep.sum(), count - have))
    return {k: np.concatenate(v) for k, v in parts.items()}

  def _cams(self, variables) -> dict[str, Any]:
    config, meta = self.config, self.meta
    count = int(config.eval.cam_images)
    box_options = {"return_boxes": MAX_BOXES} if meta.has_boxes else {}
    stream = self._stream(self.split, **box_options)
    first = next(stream)
    layer, cam_fn = self._cam_fn(variables, first["image"])
    if cam_fn is None:
      return {}
    self._figures["cams"] = self._figure_data(
        cam_fn, variables, _chain(first, self._stream(self.split, **box_options)), count)
    if meta.has_boxes and config.eval.context_eval:
      self._figures["cams_context"] = self._figure_data(cam_fn, variables, self._stream(
          self.split, remove_objects=True, **box_options), count)
    if not meta.has_boxes:
      return {}
    sums: dict[str, dict[str, float]] = {"grad_cam": {}, "grad_cam_pp": {}}
    for batch in _chain(first, stream):
      gc, gcpp, _ = cam_fn(variables, batch["image"], batch["label"])
      for name, maps in (("grad_cam", gc), ("grad_cam_pp", gcpp)):
        for key, value in explain.localisation_sums(maps, batch["boxes"], batch["mask"]).items():
          sums[name][key] = sums[name].get(key, 0.0) + float(_host(value))
    return {"localisation": _localisation(sums, layer, self.split)}

  # --------------------------------------------------------------------------- segmentation

  def _segmentation(self, variables) -> dict[str, Any]:
    config, meta = self.config, self.meta
    count, num_bins = int(config.eval.seg_map_images), int(config.eval.num_bins)
    acc = metrics.ClasswiseCalibration.init(meta.num_classes, num_bins, counts=True)
    parts: dict[str, list[np.ndarray]] = {}
    have = 0
    for batch in self._stream("val"):
      logits = self.predict(variables, batch)
      acc = acc.update(logits=logits, labels=batch["label"], mask=batch["mask"])
      if have < count:
        images = _host(batch["image"])
        keep = _host(batch["mask"]).reshape(len(images), -1).any(-1)  # padding: no pixel
        probs = _host(jax.nn.softmax(logits))
        values = {"images": display_images(images, meta), "truth": _host(batch["label"]),
                  "prediction": probs.argmax(-1), "confidence": probs.max(-1)}
        for name, value in values.items():
          parts.setdefault(name, []).append(value[keep][:count - have])
        have += int(min(keep.sum(), count - have))
    summary = acc.compute()
    self._figures["seg_maps"] = {k: np.concatenate(v) for k, v in parts.items()}
    self._figures["class_reliability"] = {
        "counts": np.asarray(acc.counts), "confidence_sum": np.asarray(acc.confidence_sum),
        "hits_sum": np.asarray(acc.hits)}
    return {"seg_maps": {"split": "val", "num_pixels": int(acc.count),
                         "classwise_ece": [float(x) for x in summary["per_class_ece"]],
                         "mean_classwise_ece": float(summary["classwise_ece"])}}

  # --------------------------------------------------------------------------------- figures

  def write(self, out_dir: str) -> dict[str, str]:
    """Draws the figures of the last `run` into `out_dir`; returns their paths."""
    if not self._figures:
      return {}
    from calib_jax import plotting_maps  # Deferred: matplotlib.
    os.makedirs(out_dir, exist_ok=True)
    files, name = {}, f"{self.config.model} / {self.config.loss}"
    for key, file, what in (("cams", CAMS_FILE, "test images"),
                            ("cams_context", CONTEXT_CAMS_FILE,
                             "context-only images (objects filled with the mean pixel)")):
      if key in self._figures:
        files[key] = plotting_maps.cam_grid(
            **self._figures[key], path=os.path.join(out_dir, file),
            title=f"{name}: maps of the predicted class, {what}")
    if "cams" in self._figures:
      files["cam_arrays"] = os.path.join(out_dir, CAMS_ARRAYS)
      np.savez_compressed(files["cam_arrays"], **{
          f"{key}_{k}": v for key in ("cams", "cams_context") if key in self._figures
          for k, v in self._figures[key].items()})
    if "seg_maps" in self._figures:
      files["seg_maps"] = plotting_maps.segmentation_maps(
          **self._figures["seg_maps"], path=os.path.join(out_dir, SEG_MAPS_FILE),
          num_classes=self.meta.num_classes, ignore_label=self.meta.ignore_label,
          title=f"{name}: validation images")
      files["class_reliability"] = plotting_maps.class_reliability(
          **self._figures["class_reliability"],
          path=os.path.join(out_dir, CLASS_RELIABILITY_FILE),
          title=f"{name}: classwise reliability of the validation pixels")
    return files


def _chain(first, rest):
  yield first
  yield from rest


def _localisation(sums: dict[str, dict[str, float]], layer: str, split: str) -> dict[str, Any]:
  def means(s):
    return {"pointing_game": s["pointing_game_sum"] / max(s["pointing_game_count"], 1),
            "energy_in_box": s["energy_in_box_sum"] / max(s["energy_in_box_count"], 1)}

  gc = sums["grad_cam"]
  return {**means(gc), "grad_cam_pp": means(sums["grad_cam_pp"]),
          "box_area": gc["box_area_sum"] / max(gc["pointing_game_count"], 1),
          "num_images": int(gc["pointing_game_count"]), "layer": layer, "split": split,
          "maps_of": "true class", "method": "grad_cam"}


def format_lines(results: dict[str, Any]) -> list[str]:
  """Console lines of the pictures' numbers in `results` (none when there are none)."""
  lines = []
  if "localisation" in results:
    loc, pp = results["localisation"], results["localisation"]["grad_cam_pp"]
    lines += ["", f"localisation of the true class's Grad-CAM ({loc['num_images']} images): "
                  f"pointing game {loc['pointing_game']:.3f}, energy in box "
                  f"{loc['energy_in_box']:.3f} (Grad-CAM++ {pp['pointing_game']:.3f} / "
                  f"{pp['energy_in_box']:.3f}; chance {loc['box_area']:.3f})"]
  if "seg_maps" in results:
    lines += ["", f"mean classwise ECE of the validation pixels: "
                  f"{results['seg_maps']['mean_classwise_ece']:.4f}"]
  return lines
