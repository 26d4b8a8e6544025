"""Every problem a config can have, found before anything is compiled or read.

`experiment.build` looks the config's names up in the registries first (the sweep's syntax with
`sweep.spec.check`, the loss and its schedule, the dataset, the model), then asks this module
once: `config_problems(config, num_data_shards, recipe=...)` returns every other problem, one
line each, and `build` raises one `ConfigError` listing them all. Its parts, each of one
sub-config (or the whole config):

* what needs no dataset: `run_problems` (length, logging, checkpoints, dtype), `data_problems`,
  `optimizer_problems`, `schedule_problems`, `eval_problems`, `pretrained_problems`;
* with the dataset's recipe (None when the dataset is unknown): `option_problems` (data options
  the dataset's pipeline rejects) and `task_problems` (combinations the dataset cannot serve:
  ALS without boxes, CRL on segmentation, context evaluation or OOD sets it has not,
  `eval.shift` without images).
"""
import os
from typing import Any

import ml_collections

from calib_jax import data as data_lib
from calib_jax import posthoc, shift
from calib_jax.data import resident
from calib_jax.experiment.data import DataRecipe, ROLES
from calib_jax.models import torch_import
from calib_jax.training.optim import OPTIMIZERS, SCHEDULES

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


def config_problems(config: ml_collections.ConfigDict, num_data_shards: int,
                    recipe: DataRecipe | None = None) -> list[str]:
  """Every problem of `config` besides the registries' own (unknown names) and the sweep's
  syntax (`sweep.spec.check`): the run's fields and each sub-config's (data over the mesh's
  `num_data_shards`, optimiser, schedule, evaluation, pre-trained weights), then, with the
  dataset's `recipe`, the data options and the task's."""
  problems = [
      *run_problems(config),
      *data_problems(config.data, num_data_shards),
      *optimizer_problems(config.optimizer),
      *schedule_problems(config.schedule),
      *eval_problems(config.eval),
  ]
  if recipe is not None:
    problems += option_problems(recipe) + task_problems(config, recipe.meta)
  return problems + pretrained_problems(config.pretrained, config.model)


def option_problems(recipe: DataRecipe) -> list[str]:
  """Options the dataset's pipeline rejects: every split's, then the training split's (a
  problem is reported once); with `on_device`, a training processing that draws at random
  (it could not be read once)."""
  data_config = recipe.config
  for field, options in (("options", data_config.options.to_dict()),
                         ("train_options", recipe.train_options())):
    try:
      data_lib.PipelineOptions.create(recipe.meta, options)
    except (ValueError, TypeError) as e:
      return [f"data.{field}: {e}"]
  if data_config.on_device:
    randomness = resident.random_options(data_config.name, **recipe.train_options())
    if randomness:
      return [f"data.on_device needs a training processing without randomness; "
              f"{data_config.name}'s has {', '.join(randomness)} (override in "
              "data.train_options, or set data.on_device=False)"]
  return []


def task_problems(config: ml_collections.ConfigDict, meta: Any) -> list[str]:
  """Combinations of loss, data options, CRL and evaluation that the dataset `meta` cannot
  serve."""
  problems = []
  if config.data.name in data_lib.corrupted.CORRUPTED_DATASETS:
    problems.append(f"dataset {config.data.name!r} holds corrupted copies of "
                    f"{data_lib.corrupted.clean_of(config.data.name)}'s test split only: train on "
                    f"that, and evaluate with eval.py --shift=dataset:{config.data.name}")
  objectness = bool(config.data.train_options.to_dict().get("objectness", False))
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
  return problems + ood_problems(config.eval.ood, meta) + shift_problems(config.eval, meta)


def shift_problems(eval_config: ml_collections.ConfigDict, meta: Any) -> list[str]:
  """What is wrong with `eval.shift` and `eval.shift_table` (see the schema) for dataset
  `meta`: a spec `shift.parse_spec` rejects, a dataset without images of 1 or 3 channels,
  rotated segmentation maps, an unknown table, stored corrupted sets that are not registered,
  corruptions this installation cannot run (frost without its textures)."""
  text = eval_config.shift
  if not text:
    return []
  try:
    spec = shift.parse_spec(text)
  except ValueError as e:
    return [f"eval.{e}"]
  if meta.task == "text":
    return [f"eval.shift={text!r} corrupts images; dataset {meta.name!r} is a text task"]
  shape = tuple(meta.input_shape)
  if len(shape) != 3 or shape[-1] not in (1, 3):
    return [f"eval.shift={text!r} corrupts images of 1 or 3 channels; dataset {meta.name!r} "
            f"has inputs of shape {shape}"]
  problems = []
  if spec.kind == "rotate" and meta.task == "segmentation":
    problems.append(f"eval.shift='rotate' turns the images but not their label maps; dataset "
                    f"{meta.name!r} is a segmentation task (use corruptions)")
  if spec.kind == "corruptions":
    problems += [f"eval.shift={text!r}: {p}" for p in shift.requirement_problems(spec.corruptions)]
  if spec.kind == "dataset":
    if spec.dataset not in data_lib.corrupted.CORRUPTED_DATASETS:
      problems.append(f"eval.shift={text!r}: {spec.dataset!r} is not a corrupted set; valid "
                      f"names: {', '.join(data_lib.corrupted.names())}")
    else:
      try:
        data_lib.corrupted.check_clean(spec.dataset, meta.name)
      except ValueError as e:
        problems.append(f"eval.shift={text!r}: {e}")
  table = eval_config.shift_table
  if table and table not in shift.table_names():
    problems.append(f"eval.shift_table={table!r}: unknown table; choose one of "
                    f"{', '.join(shift.table_names())} or '' (by the dataset)")
  return problems


def ood_problems(ood: str, meta: Any) -> list[str]:
  """What is wrong with `eval.ood` (see the schema) for a model of dataset `meta`."""
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
  if name not in data_lib.names():
    return [f"eval.ood={ood!r}: unknown dataset {name!r}; valid names: "
            f"{', '.join(data_lib.names())}"]
  if name in data_lib.corrupted.CORRUPTED_DATASETS:  # one tfds config per corruption, severity
    return [f"eval.ood={ood!r}: {name} holds one corrupted copy of a test split per corruption "
            f"and severity; evaluate it with eval.py --shift=dataset:{name}"]
  other = data_lib.info(name)
  if other.task != "classification" or other.input_shape[-1] != meta.input_shape[-1]:
    return [f"eval.ood={ood!r}: {name} is a {other.task} set of {other.input_shape[-1]}-channel "
            f"inputs; the model takes {meta.input_shape[-1]}-channel images"]
  return []


def data_problems(data_config: ml_collections.ConfigDict, num_devices: int) -> list[str]:
  """What is wrong with a `data` sub-config, short of its dataset (batch sizes the devices
  cannot split, split overrides that are not tfds split strings)."""
  problems = []
  for field in ("batch_size", "eval_batch_size"):
    value = data_config[field]
    if value <= 0:
      problems.append(f"data.{field} must be > 0, got {value}")
    elif value % num_devices:
      problems.append(f"data.{field}={value} is not divisible by the number of devices "
                      f"({num_devices}); the batch is split evenly across them")
  for role, tfds_split in data_config.splits.items():
    if role not in ROLES or not isinstance(tfds_split, str) or not tfds_split:
      problems.append(f"data.splits.{role}={tfds_split!r}: keys must be 'train', 'val' or "
                      "'test' and values tfds split strings such as 'train[:50000]'")
  return problems


def optimizer_problems(optimizer: Any) -> list[str]:
  """What is wrong with a config's `optimizer` sub-config (`calib_jax.config.base_config`)."""
  o = optimizer
  problems = []
  if o.name not in OPTIMIZERS:
    problems.append(f"unknown optimizer {o.name!r}; valid optimizers: {', '.join(OPTIMIZERS)}")
  for ok, message in (
      (o.learning_rate > 0, f"optimizer.learning_rate must be > 0, got {o.learning_rate}"),
      (0 <= o.momentum < 1, f"optimizer.momentum must be in [0, 1), got {o.momentum}"),
      (o.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {o.weight_decay}"),
      (0 <= o.b1 < 1 and 0 <= o.b2 < 1,
       f"optimizer.b1/b2 must be in [0, 1), got {o.b1}, {o.b2}"),
      (o.eps > 0, f"optimizer.eps must be > 0, got {o.eps}"),
      (o.grad_clip_norm >= 0, f"optimizer.grad_clip_norm must be >= 0 (0 = off), got "
       f"{o.grad_clip_norm}"),
      (o.sam_rho >= 0, f"optimizer.sam_rho must be >= 0 (0 = off), got {o.sam_rho}")):
    if not ok:
      problems.append(message)
  for key, value in o.lr_multipliers.items():
    if not value >= 0:
      problems.append(f"optimizer.lr_multipliers[{key!r}] must be >= 0, got {value}")
  return problems


def schedule_problems(schedule: Any) -> list[str]:
  """What is wrong with a config's `schedule` sub-config (`calib_jax.config.base_config`)."""
  problems = []
  if schedule.name not in SCHEDULES:
    problems.append(f"unknown schedule {schedule.name!r}; valid schedules: "
                    f"{', '.join(SCHEDULES)}")
  boundaries = list(schedule.boundaries_epochs)
  for ok, message in (
      (schedule.warmup_epochs >= 0, f"schedule.warmup_epochs must be >= 0, got "
       f"{schedule.warmup_epochs}"),
      (schedule.decay_factor > 0, f"schedule.decay_factor must be > 0, got "
       f"{schedule.decay_factor}"),
      (schedule.poly_power > 0, f"schedule.poly_power must be > 0, got {schedule.poly_power}"),
      (schedule.time_decay >= 0, f"schedule.time_decay must be >= 0 (0 = off), got "
       f"{schedule.time_decay}"),
      (all(b >= 0 for b in boundaries) and boundaries == sorted(boundaries),
       f"schedule.boundaries_epochs must be non-negative and ascending, got "
       f"{tuple(boundaries)}")):
    if not ok:
      problems.append(message)
  return problems


def eval_problems(eval_config: ml_collections.ConfigDict) -> list[str]:
  """What is wrong with a config's `eval` sub-config (the settings of the evaluators)."""
  e = eval_config
  checks = [
      (e.num_bins > 0, f"eval.num_bins must be > 0, got {e.num_bins}"),
      (len(e.pnorm_candidates) > 0 and all(p > 0 for p in e.pnorm_candidates),
       f"eval.pnorm_candidates must be positive numbers, got {e.pnorm_candidates}"),
      (all(0 < r <= 1 for r in e.risk_levels),
       f"eval.risk_levels must be in (0, 1], got {e.risk_levels}"),
      (all(0 < c <= 1 for c in e.coverage_levels),
       f"eval.coverage_levels must be in (0, 1], got {e.coverage_levels}"),
      (all(t > 0 for t in e.temperature_grid),
       f"eval.temperature_grid must hold temperatures > 0, got {e.temperature_grid}"),
      (e.max_examples == -1 or e.max_examples > 0,
       f"eval.max_examples must be -1 (all) or > 0, got {e.max_examples}"),
      (e.fit_split in ("val", "test"),
       f"eval.fit_split must be 'val' or 'test', got {e.fit_split!r}"),
  ]
  checks += [(e[field] > 0, f"eval.{field} must be > 0, got {e[field]}")
             for field in ("fit_pixels_per_image", "score_pixels_per_image", "max_plot_samples")]
  checks += [(isinstance(e[field], int) and e[field] >= 0,
               f"eval.{field} must be an int >= 0 (0 = off), got {e[field]!r}")
              for field in ("cam_images", "seg_map_images", "bootstrap_samples")]
  checks += [
      (all(0 < a < 1 for a in e.conformal_alphas),
       f"eval.conformal_alphas must be miscoverage levels in (0, 1), got {e.conformal_alphas}"),
      (isinstance(e.toolkit_max_samples, int) and e.toolkit_max_samples > 0,
       f"eval.toolkit_max_samples must be an int > 0, got {e.toolkit_max_samples!r}"),
      (isinstance(e.ood, str), f"eval.ood must be a string, got {e.ood!r}"),
  ]
  if e.toolkit or e.shift:  # the two users of eval.calibrators
    unknown = [c for c in e.calibrators if c not in posthoc.calibrator_names()]
    if unknown:
      checks.append((False, f"eval.calibrators: unknown calibrator {unknown[0]!r}; valid "
                            f"names: {', '.join(posthoc.calibrator_names())}"))
  return [message for ok, message in checks if not ok]


def pretrained_problems(pretrained: str | None, model_name: str) -> list[str]:
  """What is wrong with `config.pretrained` for model `model_name` (before anything is read)."""
  if not pretrained:
    return []
  if not os.path.exists(os.path.expanduser(pretrained)):
    return [f"pretrained={pretrained!r} does not exist"]
  if torch_import.is_torch_file(pretrained) and torch_import.torch_layout(model_name) is None:
    return [f"pretrained={pretrained!r} is a PyTorch file, but model {model_name!r} has no "
            f"PyTorch converter; models with one: {', '.join(torch_import.torch_models())}"]
  return []
