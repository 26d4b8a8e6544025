"""The config schema: every field `train.py` and `eval.py` read, with its default.

Experiment configs in `configs/` start from `base_config()` and override what their paper's
recipe says. Field groups:

* run: `seed`, `multihost`, `num_train_steps` / `num_epochs`, `steps_per_epoch`,
  `stop_after_steps`;
* data: `dataset`, `data_dir`, `splits` (tfds split per role), `data_options` (every split),
  `train_data_options` (train only,
  e.g. ALS's `objectness`/`context_rate`), `batch_size` (global), `eval_batch_size`;
* model: `model`, `model_kwargs`, `dtype`, `pretrained` (path of variables to start from),
  `pretrained_skip` (top-level parameter names not taken from it);
* loss: `loss`, `loss_kwargs`, `crl_weight` (CRL ranking term, 0 = off);
* optimiser: `optimizer`, `learning_rate`, `momentum`, `nesterov`, `weight_decay`, `adam_*`,
  `schedule`, `lr_boundaries_epochs`, `lr_decay_factor`, `poly_power`, `warmup_epochs`,
  `grad_clip_norm`, `sam_rho`, `lr_multipliers`;
* logging/checkpoints: `log_every_steps`, `eval_every_steps`, `checkpoint_every_steps`,
  `keep_checkpoints`, `tensorboard`;
* `eval`: settings of eval.py (bins, p-norm candidates, selective-classification operating
  points, context-only evaluation).
"""
import re
from typing import Any

import ml_collections
from ml_collections import config_dict

# Per-loss hyper-parameters used by the papers' tables (MbLS Sec. 5 "Baselines", ACLS Sec. 4.1
# "Hyperparameters"): LS eps=0.05, FL gamma=3, FLSD gamma 5/3, ECP beta=0.1, MbLS alpha=0.1 with
# a per-dataset margin; ACLS lambda_1=0.1, lambda_2=0.01 with the same margin; CRL weight 1.
LOSS_VARIANTS = ("ce", "ls", "focal", "flsd", "ecp", "mbls", "mbls_m0", "acls", "crl", "mdca",
                 "cpc", "mmce", "lr")


# Sub-dicts whose keys are free-form (passed through as keyword arguments); every other part of
# the schema is locked, so a misspelt field raises where it is set instead of being ignored.
FREE_FORM_FIELDS = ("splits", "data_options", "train_data_options", "model_kwargs",
                    "loss_kwargs", "lr_multipliers")


class ConfigError(ValueError):
  """A config cannot be run; the message lists every problem."""


def base_config() -> ml_collections.ConfigDict:
  """All fields with their defaults (a small CNN on the offline generated dataset).

  The returned config is locked (`ml_collections.ConfigDict.lock`): setting a field the schema
  does not have raises, with ml_collections' "did you mean" hint; the free-form sub-dicts of
  `FREE_FORM_FIELDS` stay open.
  """
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.multihost = False

  c.dataset = "clutter_objects"
  c.data_dir = config_dict.placeholder(str)
  c.data_options = ml_collections.ConfigDict()
  # Overrides of the dataset's splits: 'train' / 'val' / 'test' -> a tfds split string, e.g.
  # {'train': 'train[:50000]', 'val': 'train[50000:]'} for a hold-out of the training set.
  c.splits = ml_collections.ConfigDict()
  c.train_data_options = ml_collections.ConfigDict()
  c.batch_size = 128
  c.eval_batch_size = 256

  c.model = "small_cnn"
  c.model_kwargs = ml_collections.ConfigDict()
  c.dtype = "float32"
  c.pretrained = config_dict.placeholder(str)
  c.pretrained_skip = ("head",)

  c.loss = "ce"
  c.loss_kwargs = ml_collections.ConfigDict()
  c.crl_weight = 0.0

  # Length: num_train_steps if > 0, else num_epochs * steps_per_epoch; steps_per_epoch <= 0
  # means floor(train examples per process / per-process batch): whole batches only.
  c.num_epochs = 1.0
  c.num_train_steps = -1
  c.steps_per_epoch = -1
  # End this process after this many steps of *this run* with a checkpoint (-1 = never);
  # running the same command again continues. For job slots with a time limit.
  c.stop_after_steps = -1

  c.optimizer = "sgd"
  c.learning_rate = 0.1
  c.momentum = 0.9
  c.nesterov = False
  c.weight_decay = 5e-4
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-8
  c.schedule = "multistep"
  c.lr_boundaries_epochs = ()
  c.lr_decay_factor = 0.1
  c.poly_power = 0.9
  c.lr_time_decay = 0.0  # Keras-style lr / (1 + d·step) on top of the schedule (0 = off)
  c.warmup_epochs = 0.0
  c.grad_clip_norm = 0.0
  c.sam_rho = 0.0
  c.lr_multipliers = ml_collections.ConfigDict()

  c.log_every_steps = 50
  c.eval_every_steps = -1  # -1: once per epoch; 0: never during training.
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.tensorboard = True
  c.progress_bar = True

  c.eval = ml_collections.ConfigDict()
  c.eval.num_bins = 15
  c.eval.fit_split = "val"           # temperature and p-norm are fitted here
  # Also pick T from this grid by held-out ECE (the LR paper's protocol; () = off).
  c.eval.temperature_grid = ()
  c.eval.pnorm_candidates = tuple(range(1, 10))
  c.eval.pnorm_center = True
  c.eval.risk_levels = (0.01, 0.05, 0.1)        # coverage_at_risk operating points
  c.eval.coverage_levels = (0.5, 0.8, 0.9)      # risk_at_coverage operating points
  # Segmentation: random labelled pixels per image used to fit T and p on the fit split, and to
  # score selective classification on the test split (LS-vs-SC samples 5000 per image).
  c.eval.fit_pixels_per_image = 1000
  c.eval.score_pixels_per_image = 5000
  c.eval.max_plot_samples = 20_000      # samples (pixels) drawn in the reliability diagram
  c.eval.context_eval = False         # also evaluate context-only (objects removed) images
  c.eval.max_examples = -1            # -1: the whole split
  c.lock()
  for field in FREE_FORM_FIELDS:
    c[field].unlock()
  return c


def _suggestions(name: str, fields: list[str]) -> list[str]:
  """Fields a misspelt or abbreviated `name` may mean: close spellings, initials ('lr' ->
  'learning_rate'), prefixes."""
  import difflib
  initials = [f for f in fields if "_" in f and "".join(w[0] for w in f.split("_")) == name]
  close = difflib.get_close_matches(name, fields, n=3, cutoff=0.6)
  best = list(dict.fromkeys(initials + close))
  if best:
    return best[:3]
  return [f for f in fields if f.startswith(name) and len(name) >= 2][:3]


def unknown_field_message(config: ml_collections.ConfigDict, dotted: str) -> str | None:
  """One line naming the first part of `dotted` (e.g. 'eval.num_binz') that `config` lacks, with
  suggestions; None when every part exists."""
  node, path = config, []
  for part in dotted.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      return None
    if part not in node:
      name = ".".join(path + [part])
      fields = sorted(node.keys())
      hint = _suggestions(part, fields)
      if hint:
        return f"unknown config field {name!r}; did you mean {' or '.join(map(repr, hint))}?"
      where = ".".join(path) or "the config"
      return (f"unknown config field {name!r}; fields of {where}: "
              f"{', '.join(fields) or '(none: free-form, set in the config file)'}")
    node, path = node[part], path + [part]
  return None


def apply_loss_variant(config: ml_collections.ConfigDict, variant: str, *,
                       margin: float) -> ml_collections.ConfigDict:
  """Sets `loss`, `loss_kwargs` and `crl_weight` for one column of the papers' tables.

  Args:
    config: the config to modify (returned for chaining).
    variant: one of `LOSS_VARIANTS`; `mbls_m0` is MbLS with margin 0 ("Ours (m=0)").
    margin: the dataset's margin for MbLS and ACLS (6 for CIFAR-10 and 20 Newsgroups, else 10).
  """
  if variant not in LOSS_VARIANTS:
    raise ValueError(f"Unknown loss variant {variant!r}; valid: {', '.join(LOSS_VARIANTS)}")
  kwargs: dict[str, Any] = {
      "ce": {}, "crl": {}, "mdca": {}, "cpc": {}, "mmce": {},
      "ls": {"epsilon": 0.05},
      "focal": {"gamma": 3.0},
      "flsd": {"gamma": 3.0},
      "ecp": {"beta": 0.1},
      "mbls": {"margin": float(margin), "alpha": 0.1},
      "mbls_m0": {"margin": 0.0, "alpha": 0.1},
      "acls": {"margin": float(margin), "lambda_pos": 0.1, "lambda_neg": 0.01},
      "lr": {"alpha": 0.1},
  }[variant]
  config.loss = {"crl": "ce", "mbls_m0": "mbls"}.get(variant, variant)
  config.loss_kwargs = ml_collections.ConfigDict(kwargs)
  config.crl_weight = 1.0 if variant == "crl" else 0.0
  return config


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


def select_variant(arg: str | None, valid: tuple[str, ...], default: str) -> str:
  """The variant named by a config file's `:arg` (`default` when empty), checked against `valid`."""
  variant = arg or default
  if variant not in valid:
    raise ValueError(f"Unknown config variant {variant!r}; valid: {', '.join(valid)}")
  return variant


def apply_smoothing_level(config: ml_collections.ConfigDict,
                          arg: str | None) -> ml_collections.ConfigDict:
  """LS-vs-SC variants: `ce` (alpha = 0) or `ls<alpha>` such as `ls0.2` (label smoothing).

  The LS-vs-SC paper varies only the smoothing level alpha between runs (its Figs. 1 and 4).
  """
  variant = arg or "ce"
  if variant == "ce":
    config.loss = "ce"
    config.loss_kwargs = ml_collections.ConfigDict()
    return config
  try:
    if not variant.startswith("ls"):
      raise ValueError
    alpha = float(variant[2:])
  except ValueError:
    raise ValueError(f"Unknown config variant {variant!r}; valid: 'ce' or 'ls<alpha>', "
                     "e.g. 'ls0.1'") from None
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"label smoothing alpha must be in (0, 1), got {alpha} from {variant!r}")
  config.loss = "ls"
  config.loss_kwargs = ml_collections.ConfigDict({"epsilon": alpha})
  return config


_CONFIG_MODULES: dict[str, Any] = {}


def load_config_module(path: str):
  """The config file at `path` as a module, executed once per process (e.g. to derive one
  recipe from another, or to read its `VARIANTS`).

  Modules are named `calib_jax_configs.<file stem>` (tracebacks say which file), and cached by
  real path, so a base recipe that several files derive from is run once.
  """
  import importlib.util
  import os

  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
  key = os.path.realpath(path)
  if key not in _CONFIG_MODULES:
    stem = os.path.splitext(os.path.basename(key))[0]
    taken = sum(1 for k in _CONFIG_MODULES if os.path.basename(k) == os.path.basename(key))
    name = f"calib_jax_configs.{stem}" + (f"_{taken}" if taken else "")
    module_spec = importlib.util.spec_from_file_location(name, key)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    _CONFIG_MODULES[key] = module
  return _CONFIG_MODULES[key]


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads `path/to/config.py[:arg]` the way `--config=` does: `get_config(arg)` of the file.

  Args:
    spec: a config file path, optionally followed by `:arg` (the variant).

  Raises:
    ConfigError: the file sets a field the schema does not have (one line, with suggestions).
  """
  path, _, arg = spec.partition(":")
  module = load_config_module(path)
  try:
    return module.get_config(arg) if arg else module.get_config()
  except (AttributeError, KeyError) as e:
    match = re.search(r'Key "([^"]+)" does not exist', str(e))
    if match is None:
      raise
    name = match.group(1)
    fields = sorted(set(_field_names(base_config())))
    hint = _suggestions(name, fields)
    hint_text = f"; did you mean {' or '.join(map(repr, hint))}?" if hint else ""
    raise ConfigError(f"{path}: sets unknown config field {name!r}{hint_text}") from None


def _field_names(config: ml_collections.ConfigDict) -> list[str]:
  """Every field name of a config, at any depth (not the free-form sub-dicts' keys)."""
  names = []
  for key, value in config.items():
    names.append(key)
    if isinstance(value, ml_collections.ConfigDict) and key not in FREE_FORM_FIELDS:
      names.extend(_field_names(value))
  return names
