"""Tiny-ImageNet, ResNet-50: MbLS Tables 1, 2 and 7 (rows "Tiny-ImageNet R-50") and ACLS
Table 3 (column "Tiny-ImageNet ResNet-50"), Tables 5 and 6 (ablations, ResNet-50).

Recipe (MbLS App. B; ACLS Sec. 4.1): 64x64 images, 200 classes; SGD, momentum 0.9, weight decay
5e-4, batch 64, 100 epochs, learning rate 0.1 divided by 10 at epochs 40 and 60; random crop
and horizontal flip. ResNet-50 with the CIFAR-style stem (3x3 stride-1 conv, no max pool),
as the papers' Tiny-ImageNet networks. Margin m = 10 for MbLS and ACLS. The papers hold out
50 images per class of the training set for validation and test on the official validation
set; here the dataset's own val/test splits are used (see `calib_jax.data.info`).
Gradient-norm clipping at 2, as the official trainer (MbLS and ACLS `calibrate/engine/trainer.py`,
`clip_grad_norm: True` in `configs/defaults.yaml`) does for every loss of its tables.

    python train.py --config=configs/tiny_imagenet_resnet50.py:acls --workdir=workdirs/tin_r50_acls

Variants (`:arg`): ce, ls, focal, flsd, ecp, mbls (default), mbls_m0, acls, crl, mdca, cpc, mmce.
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(
    ("ce", "ls", "focal", "flsd", "ecp", "mbls", "mbls_m0", "acls", "crl", "mdca", "cpc", "mmce"),
    margin=10.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the loss column."""
  config = base_config()
  config.data.name = "tiny_imagenet"
  config.model = "resnet50"
  config.model_kwargs.stem = "cifar"
  config.data.batch_size = 64
  config.data.eval_batch_size = 256
  config.num_epochs = 100
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.1
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 5e-4
  # The official trainers clip the global gradient norm at 2 (`clip_grad_norm: True`).
  config.optimizer.grad_clip_norm = 2.0
  config.schedule.name = "multistep"
  config.schedule.boundaries_epochs = (40, 60)
  config.schedule.decay_factor = 0.1
  config.log_every_steps = 100
  config.checkpoint_every_steps = 2000
  return variants.apply_variant(config, arg, VARIANTS, default="mbls")
