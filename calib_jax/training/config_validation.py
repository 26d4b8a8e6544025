"""Checks a config before anything is compiled or any data is read.

`validate(config)` raises one `ValueError` listing every problem found: names not in the
registries (with the valid names), out-of-range numbers, batch sizes the devices cannot split,
combinations that cannot work (ALS without objectness, CRL on segmentation). Fields the schema
does not have never get this far: the schema is locked (`config.base_config`), so a typo raises
where it is set. The checks of each sub-config live beside the code that builds from it
(`builders.data_problems`, `optim.optimizer_problems` / `schedule_problems`,
`evaluators.eval_problems`); this module gathers them with its own. Registry look-ups
(`losses.get`, `models.get`, `data.info`) only build Python objects, so a bad config fails in well under a second instead of after compilation.
"""
import os
from collections.abc import Callable, Iterable
from typing import Any

import jax
import ml_collections

from calib_jax.training import builders, evaluators, optim
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


def _run_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Problems of the top-level fields (length, logging, checkpoints, CRL)."""
  checks = [
      (config.num_train_steps > 0 or config.num_epochs > 0,
       "set num_train_steps > 0 or num_epochs > 0"),
      (config.crl_weight >= 0, f"crl_weight must be >= 0 (0 = off), got {config.crl_weight}"),
      (config.log_every_steps > 0, f"log_every_steps must be > 0, got {config.log_every_steps}"),
      (config.checkpoint_every_steps > 0,
       f"checkpoint_every_steps must be > 0, got {config.checkpoint_every_steps}"),
      (config.keep_checkpoints >= 0,
       f"keep_checkpoints must be >= 0 (0 = all), got {config.keep_checkpoints}"),
      (config.eval_every_steps >= -1, "eval_every_steps must be -1 (each epoch), 0 (never) or "
       f"> 0, got {config.eval_every_steps}"),
      (config.stop_after_steps == -1 or config.stop_after_steps > 0,
       f"stop_after_steps must be -1 (off) or > 0, got {config.stop_after_steps}"),
  ]
  return [message for ok, message in checks if not ok]


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises `ConfigError` (a `ValueError`) listing every problem of `config`; else returns.

  Args:
    config: a config following `calib_jax.training.config.base_config`.
    num_devices: devices the global batch is split over (default: `jax.device_count()`).
  """
  from calib_jax import data, losses, models  # Deferred: `data` imports TensorFlow.

  # Each sub-config is checked by the module that builds from it; all problems in one error.
  problems = [
      *_run_problems(config),
      *builders.data_problems(config.data,
                              jax.device_count() if num_devices is None else num_devices),
      *optim.optimizer_problems(config.optimizer),
      *optim.schedule_problems(config.schedule),
      *evaluators.eval_problems(config.eval),
  ]
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
  if _check_registry(problems, "dataset", config.data.name, data.names(),
                     lambda: data.info(config.data.name)):
    meta = data.info(config.data.name)
    _check_registry(problems, "model", config.model, models.names(),
                    lambda: builders.build_model(config, meta))
  if meta is not None:
    # Every split's options, then the training split's; a problem is reported once.
    for field, options in (("options", config.data.options.to_dict()),
                           ("train_options", builders.train_data_options(config))):
      try:
        data.PipelineOptions.create(meta, options)
      except (ValueError, TypeError) as e:
        problems.append(f"data.{field}: {e}")
        break
    if config.loss == "als" and not config.data.train_options.get("objectness", False):
      problems.append("loss 'als' needs per-example objectness: set "
                      "data.train_options.objectness=True (a dataset with boxes)")
    if config.data.train_options.get("objectness", False) and not meta.has_boxes:
      problems.append(f"data.train_options.objectness needs boxes; dataset {config.data.name!r} "
                      "has none")
    if config.crl_weight > 0 and meta.task != "classification":
      problems.append(f"CRL (crl_weight > 0) is for classification; dataset {config.data.name!r} "
                      f"is a {meta.task} task")
    if config.eval.context_eval and not meta.has_boxes:
      problems.append(f"eval.context_eval needs boxes to remove objects; dataset "
                      f"{config.data.name!r} has none")
  config_lib.raise_if_problems(problems)
