"""ImageNet, ResNet-50 trained with SGD + cosine: LS-vs-SC (Xia et al., "Understanding why label
smoothing degrades selective classification ...", ICLR 2025) Figs. 1, 5, 8, 9 (ResNet-50 curves).

Recipe (LS-vs-SC App. B): SGD, momentum 0.9, weight decay 1e-4, batch 1024, 120 epochs, 5
epochs of linear warm-up then cosine annealing from 0.4; random-resized crop to 224 and flip
only; last checkpoint; a held-out part of the training set is the validation split used for
logit normalisation (the p-norm selection) and temperature scaling.

    python train.py --config=configs/imagenet_resnet50_ls_sc.py:ls0.2 --workdir=workdirs/in_r50_ls02

Variants (`:arg`): `ce` (alpha = 0, default) or `ls<alpha>` for alpha in 0.05, 0.1, 0.2, 0.3,
0.4, 0.5 (`ls0.2`); another level: `--config.loss_kwargs.epsilon=`.
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.smoothing_variants()


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` sets the smoothing level."""
  config = base_config()
  config.data.name = "imagenet2012"
  config.model = "resnet50"
  config.model_kwargs.stem = "imagenet"
  config.data.batch_size = 1024
  config.data.eval_batch_size = 1024
  config.num_epochs = 120
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.4
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 1e-4
  config.schedule.name = "cosine"
  config.schedule.warmup_epochs = 5
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2500
  return variants.apply_variant(config, arg, VARIANTS, default="ce")
