"""Pre-computed corrupted test sets: tfds' `cifar10_corrupted` (CIFAR-10-C) and
`imagenet2012_corrupted` (ImageNet-C), Hendrycks & Dietterich, "Benchmarking Neural Network
Robustness to Common Corruptions and Perturbations" (ICLR 2019).

Each is registered (`registry`) as a dataset of its own, holding one tfds config per corruption
and severity (`cifar10_corrupted/gaussian_noise_3`) of its clean dataset's test split only. This
module names them and turns a clean evaluation stream's `make_dataset` options into those of one
(corruption, severity) of a corrupted set, so that an evaluator can read the stored corrupted
images where it would otherwise corrupt the clean ones on the device (`calib_jax.shift`):

    stream = corrupted_eval_stream("cifar10_corrupted", "fog", 3, clean_dataset="cifar10",
                                   batch_size=500, **clean_options)

gives batches of the clean test stream's form: 'image' float32 `[B, H, W, C]` at the clean
input size, normalised with the clean dataset's mean and std (and `normalize` option), 'label'
int32 `[B]`, 'mask' bool `[B]` (False on the last batch's padding), every host the same number
of batches. CIFAR-10-C's images are processed exactly as CIFAR-10's test images are; ImageNet-C's
are stored as tfds' 224/256 centre crops resized to 224 (bicubic), the field of view of the clean
recipe's resize-256, centre-224 crop, so they are only resized when `image_size` asks for
another size. The whole test split is read (tfds orders each set by its own keys, so a slice
such as 'test[:1000]' would not hold the clean slice's images).

The corruption names are those of `calib_jax.shift` (the reference `imagecorruptions`'); tfds
calls two of CIFAR-10-C's otherwise (`TFDS_NAMES`).
"""
from __future__ import annotations

from typing import Any, Mapping

from calib_jax.data import pipeline, registry

__all__ = ["CORRUPTED_DATASETS", "CORRUPTIONS", "SEVERITIES", "TFDS_NAMES", "check_clean",
           "clean_of", "corrupted_eval_stream", "corruption_names", "eval_options", "names",
           "tfds_name"]

# Each corrupted set -> the clean dataset whose test split it corrupts.
CORRUPTED_DATASETS: dict[str, str] = {
    "cifar10_corrupted": "cifar10",
    "imagenet2012_corrupted": "imagenet2012",
}
# Registered datasets with the same test images and labels as a clean dataset above (an
# `imagenet2012_boxes` model is evaluated on ImageNet-C as an `imagenet2012` one is).
_SAME_TEST_SPLIT = {"imagenet2012_boxes": "imagenet2012"}

# The 15 benchmark corruptions, then the 4 validation ones, in the reference's order (both tfds
# sets have all 19).
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
    "speckle_noise", "gaussian_blur", "spatter", "saturate")
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
# tfds' config names where they differ from ours (tfds' cifar10_corrupted.py).
TFDS_NAMES: dict[str, dict[str, str]] = {
    "cifar10_corrupted": {"glass_blur": "frosted_glass_blur", "elastic_transform": "elastic"},
    "imagenet2012_corrupted": {},
}
# Options of the clean stream that do not apply to a corrupted set: its own tfds name, and the
# object-box options (the corrupted sets store no boxes).
_NOT_CARRIED = ("tfds_name", "objectness", "context_rate", "mask_variant", "remove_objects",
                "return_boxes")


def names() -> list[str]:
  """The corrupted sets, sorted."""
  return sorted(CORRUPTED_DATASETS)


def _check_dataset(dataset: str) -> None:
  if dataset not in CORRUPTED_DATASETS:
    raise ValueError(f"unknown corrupted dataset {dataset!r}; valid names: "
                     f"{', '.join(names())}.")


def corruption_names(dataset: str) -> list[str]:
  """The corruptions `dataset` stores: the 15 benchmark ones, then the 4 validation ones."""
  _check_dataset(dataset)
  return list(CORRUPTIONS)


def clean_of(dataset: str) -> str:
  """The registered dataset whose test split `dataset` corrupts."""
  _check_dataset(dataset)
  return CORRUPTED_DATASETS[dataset]


def check_clean(dataset: str, clean: str) -> None:
  """Raises a one-line ValueError unless a model of dataset `clean` can be evaluated on the
  corrupted set `dataset` (its test images are the ones `dataset` corrupts)."""
  expected = clean_of(dataset)
  if _SAME_TEST_SPLIT.get(clean, clean) != expected:
    usable = [n for n in names() if CORRUPTED_DATASETS[n] == _SAME_TEST_SPLIT.get(clean, clean)]
    raise ValueError(f"{dataset} corrupts {expected}'s test images; the model's dataset is "
                     f"{clean!r}" + (f" (its corrupted set: {', '.join(usable)})." if usable else
                                     ", which has no corrupted set."))


def tfds_name(dataset: str, corruption: str, severity: int) -> str:
  """The tfds config holding `corruption` at `severity`: 'cifar10_corrupted/fog_3'."""
  if corruption not in corruption_names(dataset):
    raise ValueError(f"{dataset}: unknown corruption {corruption!r}; valid names: "
                     f"{', '.join(CORRUPTIONS)}.")
  if isinstance(severity, bool) or severity not in SEVERITIES:
    raise ValueError(f"{dataset}: severity must be one of {SEVERITIES}, got {severity!r}.")
  stored = TFDS_NAMES[dataset].get(corruption, corruption)
  return f"{registry.info(dataset).tfds_name}/{stored}_{int(severity)}"


def eval_options(dataset: str, corruption: str, severity: int, clean: str,
                 options: Mapping[str, Any]) -> dict[str, Any]:
  """The `make_dataset` options of `dataset`'s (corruption, severity) config that give the
  batches of a clean evaluation stream of `clean` made with `options`.

  Kept: everything that shapes the batches (`image_size`, `normalize`, `max_examples`,
  `download`, `manual_dir`, ...); `normalize_as` defaults to `clean`, so the pixels are
  normalised with the clean dataset's statistics. Left out: the clean `tfds_name` and the
  object-box options (`_NOT_CARRIED`).

  Raises:
    ValueError: unknown dataset or corruption, a severity outside 1..5, or a `clean` dataset
      whose test images `dataset` does not corrupt (one line each).
  """
  check_clean(dataset, clean)
  carried = {k: v for k, v in options.items() if k not in _NOT_CARRIED}
  return {**carried, "normalize_as": carried.get("normalize_as") or clean,
          "tfds_name": tfds_name(dataset, corruption, severity)}


def corrupted_eval_stream(dataset: str, corruption: str, severity: int, *, clean_dataset: str,
                          batch_size: int, data_dir: str | None = None,
                          process_index: int | None = None, process_count: int | None = None,
                          **options: Any) -> pipeline.Batches:
  """One evaluation pass over `corruption` at `severity` of the corrupted set `dataset`, in the
  form of `clean_dataset`'s test stream made with the same `options` (host-local batches).

  Args:
    dataset: a name of `names()` ('cifar10_corrupted', 'imagenet2012_corrupted').
    corruption: a name of `corruption_names(dataset)`; severity: 1..5.
    clean_dataset: the model's dataset (checked by `check_clean`).
    batch_size, data_dir, process_index, process_count: as for `make_dataset`.
    **options: the clean test stream's `make_dataset` options (`eval_options` adapts them).

  Returns:
    `make_dataset(dataset, 'test', train=False, ...)`: a `Batches` of the test split.

  Raises:
    ValueError: bad names or severity, or a clean dataset `dataset` does not corrupt.
    FileNotFoundError: the config is not prepared and cannot be (offline, download off, no
      ImageNet archive): one line saying how to get it, as for every catalogue dataset.
  """
  return pipeline.make_dataset(
      dataset, "test", batch_size=batch_size, train=False, data_dir=data_dir,
      process_index=process_index, process_count=process_count,
      **eval_options(dataset, corruption, severity, clean_dataset, options))
