"""Pictures of where a model looks and how sure it is, pixel by pixel (matplotlib, Agg, PNG).

* `cam_grid`: per image, three panels: the image | its Grad-CAM overlay | its Grad-CAM++
  overlay (`calib_jax.explain`), object boxes outlined, the top-3 probabilities under the image
  in green when the top-1 class is the label and red when not.
* `segmentation_maps`: rows of image | ground truth | prediction | confidence (max softmax).
* `class_reliability`: per-class (classwise) reliability of pixel probabilities, one small
  panel per class: for class k, the mean of p_k in each confidence bin against the frequency of
  label k there, with that class's ECE (Kull et al., NeurIPS 2019, classwise calibration).
"""
import math
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
from matplotlib import patches  # noqa: E402

from calib_jax import plotting  # noqa: E402
from calib_jax.metrics import calibration  # noqa: E402

CORRECT, WRONG = "tab:green", "tab:red"


def _class_name(names: Optional[Sequence[str]], k: int) -> str:
  return str(names[k]) if names is not None and k < len(names) else str(k)


def _draw_boxes(ax, boxes: Optional[np.ndarray], height: int, width: int) -> None:
  if boxes is None:
    return
  for ymin, xmin, ymax, xmax in np.asarray(boxes):
    if ymax > ymin and xmax > xmin:  # zero-area rows are padding
      ax.add_patch(patches.Rectangle((xmin * width - 0.5, ymin * height - 0.5),
                                     (xmax - xmin) * width, (ymax - ymin) * height,
                                     fill=False, edgecolor="white", linewidth=1.0,
                                     linestyle="--"))


def _displayable(images: np.ndarray) -> np.ndarray:
  """[N, H, W, 1] grey images as [N, H, W] (imshow takes no single-channel axis)."""
  images = np.asarray(images)
  return images[..., 0] if images.ndim == 4 and images.shape[-1] == 1 else images


def _bare(ax) -> None:
  ax.set_xticks([])
  ax.set_yticks([])


def cam_grid(images: np.ndarray, grad_cam: np.ndarray, grad_cam_pp: np.ndarray,
             probs: np.ndarray, labels: np.ndarray, path: str, *,
             boxes: Optional[np.ndarray] = None, class_names: Optional[Sequence[str]] = None,
             title: Optional[str] = None, per_row: int = 4) -> str:
  """Saves the CAM grid of `N` images as a PNG and returns `path`.

  Args:
    images: [N, H, W, 3] (or [N, H, W]) display images in [0, 1].
    grad_cam, grad_cam_pp: [N, H, W] maps in [0, 1].
    probs: [N, C] predicted probabilities; labels: [N] true classes.
    path: output PNG.
    boxes: optional [N, K, 4] normalised `[ymin, xmin, ymax, xmax]` boxes (zero rows: padding).
    class_names: optional names of the classes (default: their indices).
    title: figure title.
    per_row: images per row (each takes three panels).
  """
  n = len(images)
  if n == 0:
    raise ValueError("cam_grid needs at least one image")
  cols = min(n, per_row)
  rows = math.ceil(n / cols)
  fig, axes = plt.subplots(rows, 3 * cols, figsize=(3 * cols * 1.25, rows * 1.9),
                           squeeze=False)
  h, w = images.shape[1:3]
  images = _displayable(images)
  for ax in axes.ravel():
    ax.axis("off")
  for i in range(n):
    row, col = divmod(i, cols)
    top3 = np.argsort(-probs[i])[:3]
    color = CORRECT if top3[0] == labels[i] else WRONG
    panels = ((images[i], None, f"true {_class_name(class_names, int(labels[i]))}"),
              (images[i], grad_cam[i], "Grad-CAM"), (images[i], grad_cam_pp[i], "Grad-CAM++"))
    for j, (image, cam, name) in enumerate(panels):
      ax = axes[row, 3 * col + j]
      ax.axis("on")
      _bare(ax)
      ax.imshow(image, cmap=None if image.ndim == 3 else "gray", vmin=0, vmax=1,
                interpolation="nearest")
      if cam is not None:
        ax.imshow(cam, cmap="jet", alpha=0.5, vmin=0, vmax=1, interpolation="bilinear")
      _draw_boxes(ax, None if boxes is None else boxes[i], h, w)
      ax.set_title(name, fontsize=7, pad=2)
      for spine in ax.spines.values():
        spine.set_edgecolor(color if j == 0 else "lightgray")
        spine.set_linewidth(2 if j == 0 else 0.5)
    text = "\n".join(f"{_class_name(class_names, int(k))}: {probs[i, k]:.2f}" for k in top3)
    axes[row, 3 * col].set_xlabel(text, fontsize=7, color=color, labelpad=2)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout(pad=0.4, w_pad=0.2, h_pad=0.6)
  return plotting.save_png(fig, path)


def _label_colors(num_classes: int) -> np.ndarray:
  """RGB [num_classes + 1, 3]: class 0 (background) dark gray, the others from tab10/tab20;
  the last row is for ignored pixels (white)."""
  cmap = plt.get_cmap("tab10" if num_classes <= 11 else "tab20")
  colors = [(0.2, 0.2, 0.2)] + [cmap(k % cmap.N)[:3] for k in range(num_classes - 1)]
  return np.asarray(colors + [(1.0, 1.0, 1.0)], np.float32)


def _paint(labels: np.ndarray, num_classes: int, ignore_label: Optional[int]) -> np.ndarray:
  colors = _label_colors(num_classes)
  index = np.clip(labels, 0, num_classes - 1)
  if ignore_label is not None:
    index = np.where(labels == ignore_label, num_classes, index)
  return colors[index]


def segmentation_maps(images: np.ndarray, truth: np.ndarray, prediction: np.ndarray,
                      confidence: np.ndarray, path: str, *, num_classes: int,
                      ignore_label: Optional[int] = None, title: Optional[str] = None) -> str:
  """Saves rows of image | ground truth | prediction | confidence map and returns `path`.

  Args:
    images: [N, H, W, 3] display images in [0, 1].
    truth, prediction: [N, H, W] class maps (`ignore_label` pixels of `truth` drawn white).
    confidence: [N, H, W] max softmax probability per pixel.
    num_classes: number of classes (class 0 is drawn as background).
  """
  n = len(images)
  if n == 0:
    raise ValueError("segmentation_maps needs at least one image")
  images = _displayable(images)
  fig = plt.figure(figsize=(7.0, 1.75 * n + 0.5), layout="constrained")
  grid = fig.add_gridspec(n, 5, width_ratios=(1, 1, 1, 1, 0.07))
  shown = None
  for i in range(n):
    labelled = (truth[i] != ignore_label if ignore_label is not None
                else np.ones(truth[i].shape, bool))
    accuracy = np.mean((prediction[i] == truth[i])[labelled]) if labelled.any() else 0.0
    panels = ((images[i], "image"), (_paint(truth[i], num_classes, ignore_label), "ground truth"),
              (_paint(prediction[i], num_classes, None), f"prediction ({100 * accuracy:.0f}% px)"),
              (None, f"confidence (mean {confidence[i].mean():.2f})"))
    for j, (picture, name) in enumerate(panels):
      ax = fig.add_subplot(grid[i, j])
      _bare(ax)
      if picture is None:
        shown = ax.imshow(confidence[i], cmap="viridis", vmin=0, vmax=1,
                          interpolation="nearest")
      else:
        ax.imshow(picture, cmap="gray" if picture.ndim == 2 else None, vmin=0, vmax=1,
                  interpolation="nearest")
      ax.set_title(name, fontsize=7, pad=2)
  fig.colorbar(shown, cax=fig.add_subplot(grid[:, 4]), label="max softmax")
  if title:
    fig.suptitle(title, fontsize=9)
  return plotting.save_png(fig, path)


def class_reliability(counts: np.ndarray, confidence_sum: np.ndarray, hits_sum: np.ndarray,
                      path: str, *, class_names: Optional[Sequence[str]] = None,
                      title: Optional[str] = None, per_row: int = 6) -> str:
  """Saves per-class reliability panels from binned sums and returns `path`.

  Args:
    counts, confidence_sum, hits_sum: [C, bins]: per class k and bin of p_k, the number of
      pixels, the sum of p_k and the number whose label is k (see `classwise_bins`).
  """
  num_classes, num_bins = counts.shape
  cols = min(num_classes, per_row)
  rows = math.ceil(num_classes / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 1.9 * rows + 0.4), squeeze=False,
                           sharex=True, sharey=True, layout="constrained")
  eces = calibration.ece_from_bins(confidence_sum, hits_sum, np.sum(counts, -1))
  for ax in axes.ravel():
    ax.axis("off")
  for k in range(num_classes):
    ax = axes.ravel()[k]
    ax.axis("on")
    filled = counts[k] > 0
    conf = confidence_sum[k][filled] / counts[k][filled]
    freq = hits_sum[k][filled] / counts[k][filled]
    ax.plot([0, 1], [0, 1], "k--", linewidth=0.8)
    sizes = 4 + 30 * np.log1p(counts[k][filled]) / np.log1p(max(counts.max(), 1))
    ax.plot(conf, freq, "-", color="tab:blue", linewidth=1)
    ax.scatter(conf, freq, s=sizes, color="tab:blue", zorder=3)
    ax.set_title(f"{_class_name(class_names, k)}: ECE {100 * eces[k]:.1f}%", fontsize=7, pad=2)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.tick_params(labelsize=6)
  fig.supxlabel("mean p_k in bin", fontsize=8)
  fig.supylabel("frequency of class k", fontsize=8)
  if title:
    fig.suptitle(title, fontsize=9)
  return plotting.save_png(fig, path)

