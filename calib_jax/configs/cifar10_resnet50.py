"""CIFAR-10, ResNet-50: MbLS Tables 1, 2 and 7 (rows "CIFAR-10 R-50") and ACLS Table 3
(column "CIFAR10 ResNet-50").

Recipe (MbLS App. B; ACLS Sec. 4.1): 45,000/5,000/10,000 train/val/test split; random crop with
4-pixel padding and horizontal flip; SGD, momentum 0.9, weight decay 5e-4, batch 128, 350
epochs, learning rate 0.1 divided by 10 at epochs 150 and 250. ResNet-50 with the CIFAR stem
(3x3 stride-1 convolution, no max pool) as in the papers' code. Margin m = 6 for MbLS and ACLS
(MbLS picks it on the validation set; ACLS follows). Other losses use the papers' settings:
LS eps=0.05, focal gamma=3, FLSD gamma=5/3, ECP beta=0.1, MbLS alpha=0.1, ACLS
lambda_1=0.1, lambda_2=0.01, CRL weight 1.
Gradient-norm clipping at 2, as the official trainer (MbLS `calibrate/engine/trainer.py`,
`clip_grad_norm: True` in `configs/defaults.yaml`) does for every loss of its tables.

    python train.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_r50_mbls

Variants (`:arg`): ce, ls, focal, flsd, ecp, mbls (default), mbls_m0 ("Ours (m=0)"), acls, crl,
mdca, cpc, mmce.
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(
    ("ce", "ls", "focal", "flsd", "ecp", "mbls", "mbls_m0", "acls", "crl", "mdca", "cpc", "mmce"),
    margin=6.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the loss column."""
  config = base_config()
  config.data.name = "cifar10"
  config.model = "resnet50"
  config.model_kwargs.stem = "cifar"
  config.data.batch_size = 128
  config.data.eval_batch_size = 512
  config.num_epochs = 350
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.1
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 5e-4
  # The official trainers clip the global gradient norm at 2 (`clip_grad_norm: True`).
  config.optimizer.grad_clip_norm = 2.0
  config.schedule.name = "multistep"
  config.schedule.boundaries_epochs = (150, 250)
  config.schedule.decay_factor = 0.1
  config.log_every_steps = 100
  config.eval_every_steps = -1
  config.checkpoint_every_steps = 2000
  return variants.apply_variant(config, arg, VARIANTS, default="mbls")
