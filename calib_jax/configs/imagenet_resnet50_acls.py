"""ImageNet, ResNet-50 with AdamW: ACLS Table 3 (column "ImageNet ResNet-50").

Recipe (ACLS Sec. 4.1): AdamW, batch 256, learning rate 5e-4, weight decay 5e-2, betas
(0.9, 0.999), cosine annealing, 200 epochs; standard random-resized-crop + flip at 224x224.
Margin m = 10. A held-out 1% of the training set is the validation split (temperature, p-norm).
Gradient-norm clipping at 2, as the official trainer (ACLS `calibrate/engine/trainer.py`,
`clip_grad_norm: True` in `configs/defaults.yaml`) does for every loss of its tables.

    python train.py --config=configs/imagenet_resnet50_acls.py:acls --workdir=workdirs/in_r50_acls

Variants (`:arg`): ce, ls, focal, flsd, mbls, mmce, crl, cpc, mdca, acls (default).
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(
    ("ce", "ls", "focal", "flsd", "mbls", "mmce", "crl", "cpc", "mdca", "acls"),
    margin=10.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the loss column."""
  config = base_config()
  config.data.name = "imagenet2012"
  config.model = "resnet50"
  config.model_kwargs.stem = "imagenet"
  config.data.batch_size = 256
  config.data.eval_batch_size = 512
  config.num_epochs = 200
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 5e-4
  config.optimizer.weight_decay = 5e-2
  # The official trainers clip the global gradient norm at 2 (`clip_grad_norm: True`).
  config.optimizer.grad_clip_norm = 2.0
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.999
  config.schedule.name = "cosine"
  config.log_every_steps = 200
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 5000
  return variants.apply_variant(config, arg, VARIANTS, default="acls")
