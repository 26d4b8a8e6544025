"""Checks of a config that concern more than one sub-config, or none: the run's length and
logging fields, the compute dtype, and combinations that cannot work (ALS without objectness,
CRL on segmentation, context evaluation without boxes).

The checks of each sub-config live beside the code that builds from it
(`data.data_problems`, `optim.optimizer_problems` / `schedule_problems`,
`evaluation.validation.eval_problems`, `weights.pretrained_problems`); `config_problems`
gathers them with these, and `build.build` adds what the registries reject, so every problem
arrives in one message before anything compiles.
"""
from typing import Any

import ml_collections

from calib_jax.evaluation import validation
from calib_jax.experiment import weights
from calib_jax.experiment.data import data_problems
from calib_jax.training import optim

DTYPES = ("float32", "bfloat16", "float16")


def run_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Problems of the top-level fields (length, logging, checkpoints, CRL, dtype)."""
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
      (isinstance(config.steps_per_dispatch, int) and config.steps_per_dispatch >= 0,
       "steps_per_dispatch must be an integer >= 0 (0 = auto, 1 = one step per call), got "
       f"{config.steps_per_dispatch!r}"),
      (config.dtype in DTYPES,
       f"unknown dtype {config.dtype!r}; valid dtypes: {', '.join(DTYPES)}"),
  ]
  return [message for ok, message in checks if not ok]


def config_problems(config: ml_collections.ConfigDict, num_data_shards: int) -> list[str]:
  """Every problem that can be found without the dataset, besides the sweep's
  (`sweep.spec.check`): the run's own fields and each sub-config's checks (data over the
  mesh's `num_data_shards`, optimiser, schedule, evaluation, pre-trained weights)."""
  return [
      *run_problems(config),
      *data_problems(config.data, num_data_shards),
      *optim.optimizer_problems(config.optimizer),
      *optim.schedule_problems(config.schedule),
      *validation.eval_problems(config.eval),
      *weights.pretrained_problems(config.pretrained, config.model),
  ]


def task_problems(config: ml_collections.ConfigDict, meta: Any) -> list[str]:
  """Combinations of loss, data options, CRL and evaluation that the dataset `meta` cannot
  serve."""
  problems = []
  objectness = config.data.train_options.get("objectness", False)
  if config.loss == "als" and not objectness:
    problems.append("loss 'als' needs per-example objectness: set "
                    "data.train_options.objectness=True (a dataset with boxes)")
  if objectness and not meta.has_boxes:
    problems.append(f"data.train_options.objectness needs boxes; dataset {config.data.name!r} "
                    "has none")
  if config.crl_weight > 0 and meta.task != "classification":
    problems.append(f"CRL (crl_weight > 0) is for classification; dataset {config.data.name!r} "
                    f"is a {meta.task} task")
  if config.eval.context_eval and not meta.has_boxes:
    problems.append(f"eval.context_eval needs boxes to remove objects; dataset "
                    f"{config.data.name!r} has none")
  return problems + ood_problems(config.eval.ood, meta)


def ood_problems(ood: str, meta: Any) -> list[str]:
  """What is wrong with `eval.ood` (see the schema) for a model of dataset `meta`."""
  from calib_jax.data import registry  # Deferred: imports TensorFlow.
  if not ood:
    return []
  if meta.task != "classification":
    return [f"eval.ood={ood!r}: OOD detection is for classification; dataset {meta.name!r} is "
            f"a {meta.task} task"]
  if ood == "context":
    return [] if meta.has_boxes else [
        f"eval.ood='context' needs boxes to remove objects; dataset {meta.name!r} has none"]
  name, _, split = ood.rpartition(":")
  if not name:
    return []  # A split of the model's own dataset: read as data.splits are.
  if not split:
    return [f"eval.ood={ood!r}: name the split as 'DATASET:SPLIT', e.g. '{name}:test'"]
  if name not in registry.names():
    return [f"eval.ood={ood!r}: unknown dataset {name!r}; valid names: "
            f"{', '.join(registry.names())}"]
  other = registry.info(name)
  if other.task != "classification" or other.input_shape[-1] != meta.input_shape[-1]:
    return [f"eval.ood={ood!r}: {name} is a {other.task} set of {other.input_shape[-1]}-channel "
            f"inputs; the model takes {meta.input_shape[-1]}-channel images"]
  return []
