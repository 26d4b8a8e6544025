"""Checks a config before anything is compiled or any data is read.

`validate(config)` raises one `ValueError` listing every problem found: names not in the
registries (with the valid names), out-of-range numbers, batch sizes the devices cannot split,
combinations that cannot work (ALS without objectness, CRL on segmentation). Fields the schema
does not have never get this far: the schema is locked (`config.base_config`), so a typo raises
where it is set. Registry look-ups (`losses.get`, `models.get`, `data.info`) only build Python
objects, so a bad config fails in well under a second instead of after compilation.
"""
import os
from collections.abc import Callable, Iterable
from typing import Any

import jax
import ml_collections

from calib_jax.training import builders, optim
from calib_jax.training import config as config_lib

DTYPES = ("float32", "bfloat16", "float16")
ConfigError = config_lib.ConfigError  # Re-exported: callers catch it from here.


def _check_registry(problems: list[str], kind: str, name: str, valid: Iterable[str],
                    build: Callable[[], Any]) -> bool:
  valid = list(valid)
  if name not in valid:
    problems.append(f"unknown {kind} {name!r}; valid {kind} names: {', '.join(valid)}")
    return False
  try:
    build()
  except (ValueError, TypeError) as e:
    problems.append(f"{kind} {name!r}: {e}")
    return False
  return True


def _check_numbers(config: ml_collections.ConfigDict, problems: list[str],
                   num_devices: int) -> None:
  def need(ok: bool, message: str) -> None:
    if not ok:
      problems.append(message)

  need(config.learning_rate > 0, f"learning_rate must be > 0, got {config.learning_rate}")
  need(config.batch_size > 0, f"batch_size must be > 0, got {config.batch_size}")
  need(config.eval_batch_size > 0, f"eval_batch_size must be > 0, got {config.eval_batch_size}")
  for field in ("batch_size", "eval_batch_size"):
    value = config[field]
    if value > 0 and value % num_devices:
      problems.append(f"{field}={value} is not divisible by the number of devices "
                      f"({num_devices}); the batch is split evenly across them")
  need(config.num_train_steps > 0 or config.num_epochs > 0,
       "set num_train_steps > 0 or num_epochs > 0")
  need(0 <= config.momentum < 1, f"momentum must be in [0, 1), got {config.momentum}")
  need(config.weight_decay >= 0, f"weight_decay must be >= 0, got {config.weight_decay}")
  need(0 <= config.adam_b1 < 1 and 0 <= config.adam_b2 < 1,
       f"adam_b1/adam_b2 must be in [0, 1), got {config.adam_b1}, {config.adam_b2}")
  need(config.adam_eps > 0, f"adam_eps must be > 0, got {config.adam_eps}")
  need(config.grad_clip_norm >= 0, f"grad_clip_norm must be >= 0 (0 = off), got "
       f"{config.grad_clip_norm}")
  need(config.sam_rho >= 0, f"sam_rho must be >= 0 (0 = off), got {config.sam_rho}")
  need(config.warmup_epochs >= 0, f"warmup_epochs must be >= 0, got {config.warmup_epochs}")
  need(config.lr_decay_factor > 0, f"lr_decay_factor must be > 0, got {config.lr_decay_factor}")
  need(config.poly_power > 0, f"poly_power must be > 0, got {config.poly_power}")
  need(config.lr_time_decay >= 0, f"lr_time_decay must be >= 0 (0 = off), got "
       f"{config.lr_time_decay}")
  for role, split in config.splits.items():
    need(role in ("train", "val", "test") and isinstance(split, str) and split,
         f"splits.{role}={split!r}: keys must be 'train', 'val' or 'test' and values tfds split "
         "strings such as 'train[:50000]'")
  need(all(t > 0 for t in config.eval.temperature_grid),
       f"eval.temperature_grid must hold temperatures > 0, got {config.eval.temperature_grid}")
  boundaries = list(config.lr_boundaries_epochs)
  need(all(b >= 0 for b in boundaries) and boundaries == sorted(boundaries),
       f"lr_boundaries_epochs must be non-negative and ascending, got {tuple(boundaries)}")
  need(config.crl_weight >= 0, f"crl_weight must be >= 0 (0 = off), got {config.crl_weight}")
  for key, value in config.lr_multipliers.items():
    need(value >= 0, f"lr_multipliers[{key!r}] must be >= 0, got {value}")
  need(config.log_every_steps > 0, f"log_every_steps must be > 0, got {config.log_every_steps}")
  need(config.checkpoint_every_steps > 0,
       f"checkpoint_every_steps must be > 0, got {config.checkpoint_every_steps}")
  need(config.keep_checkpoints >= 0, f"keep_checkpoints must be >= 0 (0 = all), got "
       f"{config.keep_checkpoints}")
  need(config.eval_every_steps >= -1, "eval_every_steps must be -1 (each epoch), 0 (never) or "
       f"> 0, got {config.eval_every_steps}")
  need(config.stop_after_steps == -1 or config.stop_after_steps > 0,
       f"stop_after_steps must be -1 (off) or > 0, got {config.stop_after_steps}")
  need(config.eval.num_bins > 0, f"eval.num_bins must be > 0, got {config.eval.num_bins}")
  need(len(config.eval.pnorm_candidates) > 0 and all(p > 0 for p in config.eval.pnorm_candidates),
       f"eval.pnorm_candidates must be positive numbers, got {config.eval.pnorm_candidates}")
  need(all(0 < r <= 1 for r in config.eval.risk_levels),
       f"eval.risk_levels must be in (0, 1], got {config.eval.risk_levels}")
  need(all(0 < c <= 1 for c in config.eval.coverage_levels),
       f"eval.coverage_levels must be in (0, 1], got {config.eval.coverage_levels}")
  for field in ("fit_pixels_per_image", "score_pixels_per_image", "max_plot_samples"):
    need(config.eval[field] > 0, f"eval.{field} must be > 0, got {config.eval[field]}")
  need(config.eval.max_examples == -1 or config.eval.max_examples > 0,
       f"eval.max_examples must be -1 (all) or > 0, got {config.eval.max_examples}")
  need(config.eval.fit_split in ("val", "test"),
       f"eval.fit_split must be 'val' or 'test', got {config.eval.fit_split!r}")


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises `ConfigError` (a `ValueError`) listing every problem of `config`; else returns.

  Args:
    config: a config following `calib_jax.training.config.base_config`.
    num_devices: devices the global batch is split over (default: `jax.device_count()`).
  """
  from calib_jax import data, losses, models  # Deferred: `data` imports TensorFlow.

  problems: list[str] = []
  _check_numbers(config, problems, jax.device_count() if num_devices is None else num_devices)
  if config.optimizer not in optim.OPTIMIZERS:
    problems.append(f"unknown optimizer {config.optimizer!r}; valid optimizers: "
                    f"{', '.join(optim.OPTIMIZERS)}")
  if config.schedule not in optim.SCHEDULES:
    problems.append(f"unknown schedule {config.schedule!r}; valid schedules: "
                    f"{', '.join(optim.SCHEDULES)}")
  if config.dtype not in DTYPES:
    problems.append(f"unknown dtype {config.dtype!r}; valid dtypes: {', '.join(DTYPES)}")
  if config.pretrained and not os.path.exists(os.path.expanduser(config.pretrained)):
    problems.append(f"pretrained={config.pretrained!r} does not exist")
  if (config.pretrained and models.torch_import.is_torch_file(config.pretrained)
      and models.torch_import.torch_layout(config.model) is None):
    problems.append(f"pretrained={config.pretrained!r} is a PyTorch file, but model "
                    f"{config.model!r} has no PyTorch converter; models with one: "
                    f"{', '.join(models.torch_import.torch_models())}")

  _check_registry(problems, "loss", config.loss, losses.names(),
                  lambda: builders.build_loss(config))
  meta = None
  if _check_registry(problems, "dataset", config.dataset, data.names(),
                     lambda: data.info(config.dataset)):
    meta = data.info(config.dataset)
    _check_registry(problems, "model", config.model, models.names(),
                    lambda: builders.build_model(config, meta))
  if meta is not None:
    if config.loss == "als" and not config.train_data_options.get("objectness", False):
      problems.append("loss 'als' needs per-example objectness: set "
                      "train_data_options.objectness=True (a dataset with boxes)")
    if config.train_data_options.get("objectness", False) and not meta.has_boxes:
      problems.append(f"train_data_options.objectness needs boxes; dataset {config.dataset!r} "
                      "has none")
    if config.crl_weight > 0 and meta.task != "classification":
      problems.append(f"CRL (crl_weight > 0) is for classification; dataset {config.dataset!r} "
                      f"is a {meta.task} task")
    if config.eval.context_eval and not meta.has_boxes:
      problems.append(f"eval.context_eval needs boxes to remove objects; dataset "
                      f"{config.dataset!r} has none")
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(problems))
