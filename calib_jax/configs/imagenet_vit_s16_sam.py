"""ImageNet, ViT-S/16 trained with SAM: LS-vs-SC Figs. 4, 11, 13 (ViT-S-16-SAM curves).

Recipe (LS-vs-SC App. B): AdamW (betas 0.9, 0.999), batch 2048, 300 epochs, 15 epochs of linear
warm-up then cosine annealing from 3e-3; non-adaptive SAM with rho = 0.2; dropout 0.1, no
attention dropout; random-resized crop to 224 and flip only; last checkpoint. Not stated in the
paper and taken from the ViT+SAM recipe it follows (Chen et al. 2022): weight decay 0.3 and
gradient clipping at global norm 1. SAM here perturbs with the global-batch gradient (not
per-device "m-sharpness").

    python train.py --config=configs/imagenet_vit_s16_sam.py:ls0.1 --workdir=workdirs/in_vits16_ls01

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
  config.model = "vit_s16"
  config.model_kwargs.dropout_rate = 0.1
  config.model_kwargs.attention_dropout_rate = 0.0
  config.dtype = "bfloat16"
  config.data.batch_size = 2048
  config.data.eval_batch_size = 1024
  config.num_epochs = 300
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 3e-3
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.999
  config.optimizer.weight_decay = 0.3
  config.schedule.name = "cosine"
  config.schedule.warmup_epochs = 15
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.sam_rho = 0.2
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2500
  return variants.apply_variant(config, arg, VARIANTS, default="ce")
