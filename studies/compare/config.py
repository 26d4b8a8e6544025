"""The loss-comparison study behind docs/results.md (`python -m studies.compare`): one config per
(dataset, loss) cell, sized to train on two CPU cores in about a minute each. It reproduces no
paper Table: it tests the papers' claims on data available offline.

* `fashion_mnist`: the label-relaxation paper's Fashion-MNIST model and optimiser (MLP with two
  hidden layers of 1024 units, SGD + Nesterov 0.9, batch 64, learning rate 0.05, constant) on
  the first 10,000 training images for 10 epochs (1,560 steps), so that cross-entropy reaches
  the over-fitting regime where the papers' calibration differences show. Validation (T and p
  fitted there): the last 5,000 training images; test: the 10,000 test images.
* `clutter_objects`: `configs/clutter_objects_cnn.py` with a narrower CNN (16/32/64 filters),
  batch 32 and 1,200 Adam steps (3.8 epochs): digits on clutter with boxes, the only offline
  data on which the object-size losses (`als`, `als_context`) apply. Context-only images are evaluated for every
  loss so that ALS's claim can be compared.

Every loss uses the papers' table hyper-parameters (`calib_jax.config.variants.loss_variants`:
LS eps=0.05, focal/FLSD gamma=3, ECP beta=0.1, MbLS margin 10 and alpha 0.1, ACLS margin 10,
lambda 0.1/0.01, LR alpha=0.1; ALS beta=1), none tuned here.

    python train.py --config=studies/compare/config.py:fashion_mnist,mbls --workdir=workdirs/fm_mbls
    python eval.py --config=studies/compare/config.py:fashion_mnist,mbls --workdir=workdirs/fm_mbls

Argument (`:arg`): `<dataset>,<loss>`, see `LOSSES`; `--config.seed=N` picks the seed.
"""
import os

import ml_collections

from calib_jax.config import variants
from calib_jax.config import load_config_module, unattended_run

# The recipes these runs derive from: the repository's configs/ (this file is
# studies/<study>/config.py).
_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs")
LOSSES = {
    "fashion_mnist": ("ce", "ls", "focal", "flsd", "ecp", "mbls", "acls", "lr"),
    "clutter_objects": ("ce", "ls", "focal", "flsd", "ecp", "mbls", "acls", "lr", "als",
                        "als_context"),
}
_CLUTTER = load_config_module(os.path.join(_CONFIGS, "clutter_objects_cnn.py"))
# Each dataset's recipe comes from its own file; a variant adds its loss column's overrides.
VARIANTS = {f"{dataset},{loss}": (_CLUTTER.VARIANTS[loss] if dataset == "clutter_objects"
                                  else variants.loss_overrides(loss, margin=10.0))
            for dataset, losses in LOSSES.items() for loss in losses}


def _quiet(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """One final checkpoint: the study evaluates at the end."""
  return unattended_run(config, log_every_steps=200, checkpoint_every_steps=100_000)


def _fashion_mnist() -> ml_collections.ConfigDict:
  config = load_config_module(os.path.join(_CONFIGS, "fashion_mnist_mlp.py")).get_config("ce")
  config.data.train_options.max_examples = 10_000
  config.num_epochs = 10
  # The study's constant rate (the Table 1 schedule with its drop after epoch 30 is for 50 epochs).
  config.schedule.name = "constant"
  config.schedule.time_decay = 0.0
  return config


def _clutter_objects() -> ml_collections.ConfigDict:
  config = _CLUTTER.get_config("ce")
  config.model_kwargs.widths = (16, 32, 64)
  config.data.batch_size = 32
  config.num_epochs = -1
  config.num_train_steps = 1200
  config.optimizer.learning_rate = 2e-3
  config.eval.context_eval = True
  return config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The study's config for `arg` = `<dataset>,<loss>` (default `fashion_mnist,ce`)."""
  name = variants.variant_name(arg, VARIANTS, "fashion_mnist,ce")
  recipe = _fashion_mnist if name.startswith("fashion_mnist,") else _clutter_objects
  return variants.apply_variant(_quiet(recipe()), name, VARIANTS, default=name)
