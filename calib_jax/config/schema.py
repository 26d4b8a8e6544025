"""The config schema: every field `train.py` and `eval.py` read, with its default.

Experiment configs in `configs/` start from `base_config()`, override what their paper's
recipe says and offer named variants (`calib_jax.config.variants`). Fields:

* run: `seed`, `multihost`, `num_train_steps` / `num_epochs`, `steps_per_epoch`,
  `stop_after_steps`, `steps_per_dispatch`, `sweep`, `sweep_shared_order`,
  `sweep_member_shards`;
* `data`: `name`, `dir`, `splits` (tfds split per role), `options` (every split),
  `train_options` (train only, e.g. ALS's `objectness`/`context_rate`), `batch_size` (global),
  `eval_batch_size`, `on_device` (the training split resident on the devices);
* model: `model`, `model_kwargs`, `dtype`, `pretrained` (path of variables to start from),
  `pretrained_skip` (top-level parameter names not taken from it);
* loss: `loss`, `loss_kwargs`, `loss_schedule` (`name`, `hparam`, `end`: a hyper-parameter
  changed over the epochs, `calib_jax.losses.schedule`), `crl_weight` (CRL ranking term, 0 = off);
* `optimizer`: `name`, `learning_rate`, `momentum`, `nesterov`, `weight_decay`, `b1`/`b2`/`eps`,
  `grad_clip_norm`, `sam_rho`, `lr_multipliers`;
* `schedule`: `name`, `warmup_epochs`, `boundaries_epochs`, `decay_factor`, `poly_power`,
  `time_decay`;
* logging/checkpoints: `log_every_steps`, `eval_every_steps`, `checkpoint_every_steps`,
  `keep_checkpoints`, `tensorboard`, `progress_bar`;
* `eval`: settings of eval.py (bins, p-norm candidates, selective-classification operating
  points, context-only evaluation, class activation maps and confidence maps).
"""
import difflib
from typing import Any

import ml_collections
from ml_collections import config_dict

# Sub-dicts whose keys are free-form (passed through as keyword arguments); every other part of
# the schema is locked, so a misspelt field raises where it is set instead of being ignored.
FREE_FORM_FIELDS = ("data.splits", "data.options", "data.train_options", "model_kwargs",
                    "loss_kwargs", "optimizer.lr_multipliers")


class ConfigError(ValueError):
  """A config cannot be run; the message lists every problem."""


def raise_if_problems(problems: list[str]) -> None:
  """`ConfigError` listing `problems` (one per line), if there are any."""
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(problems))


def _data_fields() -> ml_collections.ConfigDict:
  """The `data` sub-config: which dataset, its splits and options, the batch sizes."""
  d = ml_collections.ConfigDict()
  d.name = "clutter_objects"          # a name of the `calib_jax.data` registry
  d.dir = config_dict.placeholder(str)  # tfds data_dir (default ~/tensorflow_datasets)
  # Overrides of the dataset's splits: 'train' / 'val' / 'test' -> a tfds split string, e.g.
  # {'train': 'train[:50000]', 'val': 'train[50000:]'} for a hold-out of the training set;
  # 'train' is the whole tfds split (an unset role gets the dataset's registered split).
  d.splits = ml_collections.ConfigDict()
  d.options = ml_collections.ConfigDict()        # `make_dataset` options, every split
  d.train_options = ml_collections.ConfigDict()  # train split only (e.g. ALS objectness)
  d.batch_size = 128                             # global, over all devices and hosts
  d.eval_batch_size = 256
  # Keep the processed training split on the devices and gather each batch there from indices
  # (the host then sends k x batch indices per call instead of decoding and transferring
  # images): for splits that fit in device memory and a training processing without
  # randomness (no random crop or flip). The batches, hence the run, are those of the tf.data
  # stream. See docs/training.md, "The training set on the devices".
  d.on_device = False
  return d


def _optimizer_fields() -> ml_collections.ConfigDict:
  """The `optimizer` sub-config."""
  o = ml_collections.ConfigDict()
  # `optim.make_optimizer`'s arguments (the learning rate is the schedule's peak).
  o.name = "sgd"
  o.learning_rate = 0.1
  o.momentum = 0.9
  o.nesterov = False
  o.weight_decay = 5e-4
  o.b1 = 0.9     # adam / adamw moments
  o.b2 = 0.999
  o.eps = 1e-8
  o.grad_clip_norm = 0.0  # global gradient norm (0 = off)
  o.sam_rho = 0.0         # SAM radius (0 = off)
  o.lr_multipliers = ml_collections.ConfigDict()  # top-level param name -> factor
  return o


def _schedule_fields() -> ml_collections.ConfigDict:
  """The `schedule` sub-config."""
  s = ml_collections.ConfigDict()
  # `optim.make_schedule`'s arguments; epoch-valued fields are converted with steps_per_epoch.
  s.name = "multistep"
  s.warmup_epochs = 0.0
  s.boundaries_epochs = ()
  s.decay_factor = 0.1
  s.poly_power = 0.9
  s.time_decay = 0.0  # Keras-style lr / (1 + d·step) on top of the schedule (0 = off)
  return s


def _eval_fields() -> ml_collections.ConfigDict:
  """The `eval` sub-config: the settings of eval.py's evaluators."""
  e = ml_collections.ConfigDict()
  e.num_bins = 15
  e.fit_split = "val"           # temperature and p-norm are fitted here
  # Also pick T from this grid by held-out ECE (the LR paper's protocol; () = off).
  e.temperature_grid = ()
  e.pnorm_candidates = tuple(range(1, 10))
  e.pnorm_center = True
  e.risk_levels = (0.01, 0.05, 0.1)        # coverage_at_risk operating points
  e.coverage_levels = (0.5, 0.8, 0.9)      # risk_at_coverage operating points
  # Segmentation: random labelled pixels per image used to fit T and p on the fit split, and to
  # score selective classification on the test split (LS-vs-SC samples 5000 per image).
  e.fit_pixels_per_image = 1000
  e.score_pixels_per_image = 5000
  e.max_plot_samples = 20_000      # samples (pixels) drawn in the reliability diagram
  e.context_eval = False         # also evaluate context-only (objects removed) images
  e.max_examples = -1            # -1: the whole split
  # Pictures (calib_jax.evaluation.maps; 0 = off): Grad-CAM / Grad-CAM++ grid of the first
  # test images (and localisation scores on datasets with boxes); segmentation confidence maps
  # of the first validation images.
  e.cam_images = 8
  e.seg_map_images = 4
  # The post-hoc toolkit (calib_jax.evaluation.toolkit; classification): each calibrator fitted
  # on the fit split, its test metrics with 95 % bootstrap intervals, conformal sets at each
  # alpha, and failure (and OOD) detection. () = no calibrators (the raw logits' rows remain).
  e.toolkit = True
  e.calibrators = ("temperature", "vector", "isotonic")
  e.conformal_alphas = (0.1, 0.05)
  e.bootstrap_samples = 1000       # 0 = no intervals
  e.toolkit_max_samples = 200_000  # larger splits are subsampled (seeded) for the toolkit
  # Out-of-distribution set of the toolkit's OOD detection: '' (none), 'context' (the split's
  # context-only images: objects filled with the mean pixel; datasets with boxes), a split of
  # this dataset ('val', or a tfds split string), or 'DATASET:SPLIT' of another registered
  # dataset with the same input channels (read at this model's input size and normalised as
  # this dataset is).
  e.ood = ""
  # Evaluation under distribution shift (calib_jax.evaluation.shift; eval.py --shift): '' (off),
  # 'all' (the 15 benchmark corruptions at severities 1-5), 'NAME[,NAME][:SEVERITIES]'
  # (e.g. 'gaussian_noise,fog:1,3,5'), 'rotate' (0-180 degrees in 15-degree steps) or
  # 'dataset:NAME' (stored corrupted images, e.g. cifar10_corrupted). The test split's images are
  # corrupted on the device; temperature and calibrators are fitted on the clean fit split.
  e.shift = ""
  # Parameter table of the corruptions: 'imagenet', 'cifar10', 'tiny_imagenet', or '' (by the
  # dataset: 'cifar10' for images of at most 32 px, 'tiny_imagenet' for tiny_imagenet, else
  # 'imagenet', the library's default).
  e.shift_table = ""
  return e


def base_config() -> ml_collections.ConfigDict:
  """All fields with their defaults (a small CNN on the offline generated dataset).

  The returned config is locked (`ml_collections.ConfigDict.lock`): setting a field the schema
  does not have raises, with ml_collections' "did you mean" hint; the free-form sub-dicts of
  `FREE_FORM_FIELDS` stay open. Every field's values are checked in one place,
  `calib_jax.experiment.problems`, all at once by `calib_jax.experiment.build`.
  """
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.multihost = False

  c.data = _data_fields()
  c.model = "small_cnn"
  c.model_kwargs = ml_collections.ConfigDict()
  c.dtype = "float32"
  c.pretrained = config_dict.placeholder(str)
  c.pretrained_skip = ("head",)

  c.loss = "ce"
  c.loss_kwargs = ml_collections.ConfigDict()
  # A real hyper-parameter of the loss changed over training (`calib_jax.losses.schedule`):
  # name "linear_epochs" takes `hparam` linearly from its loss_kwargs value (or its default;
  # a sweep member's value when swept) in the first epoch to `end` in the last, constant within
  # an epoch, e.g. MaxSup's alpha 0.1 -> 0.2 (hparam="alpha", end=0.2). "none": constants.
  c.loss_schedule = ml_collections.ConfigDict()
  c.loss_schedule.name = "none"
  c.loss_schedule.hparam = ""
  c.loss_schedule.end = 0.0
  c.crl_weight = 0.0

  # Length: num_train_steps if > 0, else num_epochs * steps_per_epoch; steps_per_epoch <= 0
  # means floor(train examples per process / per-process batch): whole batches only.
  c.num_epochs = 1.0
  c.num_train_steps = -1
  c.steps_per_epoch = -1
  # End this process after this many steps of *this run* with a checkpoint (-1 = never);
  # running the same command again continues. For job slots with a time limit.
  c.stop_after_steps = -1
  # Optimiser steps per compiled call (`lax.scan` over a stack of batches): the host's
  # per-call work (Python, dispatch, input transfer) is paid once per k steps. 0 = auto: the
  # largest k <= 16 dividing the logging, evaluation and checkpoint intervals, so that every
  # call is full-length (one compile); 1 = one step per call. See `run/dispatch.py`.
  c.steps_per_dispatch = 0
  # A population trained as one program (`calib_jax.sweep`): "field=v1,v2;field2=w1,w2" over
  # seed, loss_kwargs.<real hyper-parameter>, optimizer.learning_rate and
  # optimizer.weight_decay; the product of the lists is the members ("" = a single run).
  c.sweep = ""
  # False: each member reads the batches of its own seed's single run (one stream per seed);
  # True: every member reads the config seed's stream (one stream; seeds then only change the
  # initialisation and dropout).
  c.sweep_shared_order = False
  # The mesh's `member` axis for a sweep. 1: every device computes every member on its shard of the batch (data parallel); m > 1: a
  # 2-D mesh of m member shards x (devices / m) data shards, each device holding P/m members.
  c.sweep_member_shards = 1
  # How the program runs a device's members: "vmap" (all at once, batched products: fills an
  # accelerator), "map" (one after another, `lax.map`, each member's k steps in a row: each
  # member's own products, the activation memory of one member instead of P, and its state
  # kept in the caches over its k steps) or "unroll" (each member's step written into the
  # program one after another, no loop: its own convolutions); "auto": on CPU "map" for a
  # model without convolutions and "unroll" for one with them, elsewhere "vmap"
  # (docs/training.md, BENCHMARKS.md).
  c.sweep_members_as = "auto"

  c.optimizer = _optimizer_fields()
  c.schedule = _schedule_fields()

  c.log_every_steps = 50
  c.eval_every_steps = -1  # -1: once per epoch; 0: never during training.
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.tensorboard = True
  c.progress_bar = True

  c.eval = _eval_fields()
  c.lock()
  for field in FREE_FORM_FIELDS:
    _get(c, field).unlock()
  return c


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  for part in dotted.split("."):
    config = config[part]
  return config


def _suggestions(name: str, fields: list[str]) -> list[str]:
  """Dotted `fields` a misspelt, abbreviated or moved `name` may mean: close spellings of the
  last part, initials ('lr' -> 'optimizer.learning_rate'), prefixes."""
  by_leaf: dict[str, list[str]] = {}
  for field in fields:
    by_leaf.setdefault(field.rsplit(".", 1)[-1], []).append(field)
  initials = [f for leaf, fs in by_leaf.items() if "_" in leaf
              and "".join(w[0] for w in leaf.split("_")) == name for f in fs]
  close = [f for leaf in difflib.get_close_matches(name, list(by_leaf), n=3, cutoff=0.6)
           for f in by_leaf[leaf]]
  best = list(dict.fromkeys(initials + close))
  if best:
    return best[:3]
  return [f for leaf, fs in by_leaf.items() if leaf.startswith(name) and len(name) >= 2
          for f in fs][:3]


# Fields of the flat schema before the `data` / `optimizer` / `schedule` sub-configs, and where
# they live now: an old command line or config file gets the new name in its one-line error.
MOVED_FIELDS = {
    "dataset": "data.name", "data_dir": "data.dir", "data_options": "data.options",
    "train_data_options": "data.train_options", "splits": "data.splits",
    "batch_size": "data.batch_size", "eval_batch_size": "data.eval_batch_size",
    "learning_rate": "optimizer.learning_rate", "momentum": "optimizer.momentum",
    "nesterov": "optimizer.nesterov", "weight_decay": "optimizer.weight_decay",
    "adam_b1": "optimizer.b1", "adam_b2": "optimizer.b2", "adam_eps": "optimizer.eps",
    "grad_clip_norm": "optimizer.grad_clip_norm", "sam_rho": "optimizer.sam_rho",
    "lr_multipliers": "optimizer.lr_multipliers", "warmup_epochs": "schedule.warmup_epochs",
    "lr_boundaries_epochs": "schedule.boundaries_epochs",
    "lr_decay_factor": "schedule.decay_factor", "poly_power": "schedule.poly_power",
    "lr_time_decay": "schedule.time_decay",
}


def hint_fields(name: str, candidates: list[str]) -> list[str]:
  """Fields that a wrong field `name` may mean: its new place if it moved, else close spellings
  among `candidates`."""
  return [MOVED_FIELDS[name]] if name in MOVED_FIELDS else _suggestions(
      name.rsplit(".", 1)[-1], candidates)


def unknown_field_message(config: ml_collections.ConfigDict, dotted: str) -> str | None:
  """One line naming the first part of `dotted` (e.g. 'eval.num_binz') that `config` lacks, with
  suggestions; None when every part exists."""
  node, path = config, []
  for part in dotted.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      return None
    if part not in node:
      name = ".".join(path + [part])
      prefix = ".".join(path) + "." if path else ""
      hint = hint_fields(name, [f for f in field_names(config) if f.startswith(prefix)])
      if hint:
        return f"unknown config field {name!r}; did you mean {' or '.join(map(repr, hint))}?"
      where = ".".join(path) or "the config"
      fields = sorted(node.keys())
      return (f"unknown config field {name!r}; fields of {where}: "
              f"{', '.join(fields) or '(none: free-form, set in the config file)'}")
    node, path = node[part], path + [part]
  return None


def group_fields(config: ml_collections.ConfigDict, dotted: str) -> list[str]:
  """The fields of `dotted` when it names a locked sub-config (`optimizer`, `data`, ...), where
  a single value cannot go; else []."""
  try:
    node = _get(config, dotted)
  except (AttributeError, KeyError):
    return []
  if not isinstance(node, ml_collections.ConfigDict) or dotted in FREE_FORM_FIELDS:
    return []
  return list(node.keys())


def unattended_run(config: ml_collections.ConfigDict, *, log_every_steps: int,
                   checkpoint_every_steps: int) -> ml_collections.ConfigDict:
  """Settings of a study's unattended run (returned for chaining): no mid-run validation,
  TensorBoard or progress bar, one checkpoint kept (to resume an interrupted run)."""
  config.eval_every_steps = 0
  config.tensorboard = False
  config.progress_bar = False
  config.log_every_steps = log_every_steps
  config.checkpoint_every_steps = checkpoint_every_steps
  config.keep_checkpoints = 1
  return config


def field_names(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every field of a config as a dotted path, at any depth (not the free-form sub-dicts' keys)."""
  names = []
  for key, value in config.items():
    names.append(prefix + key)
    if isinstance(value, ml_collections.ConfigDict) and prefix + key not in FREE_FORM_FIELDS:
      names.extend(field_names(value, prefix + key + "."))
  return names
