"""CIFAR-10, ResNet-101: MbLS Tables 1, 2 and 7 (rows "CIFAR-10 R-101") and ACLS Table 3
(column "CIFAR10 ResNet-101").

Recipe (MbLS App. B; ACLS Sec. 4.1): 45,000/5,000/10,000 train/val/test split; random crop with
4-pixel padding and horizontal flip; SGD, momentum 0.9, weight decay 5e-4, batch 128, 350
epochs, learning rate 0.1 divided by 10 at epochs 150 and 250. ResNet-101 with the CIFAR stem
(3x3 stride-1 convolution, no max pool) as in the papers' code. Margin m = 6 for MbLS and ACLS
(MbLS picks it on the validation set; ACLS follows). Other losses use the papers' settings:
LS eps=0.05, focal gamma=3, FLSD gamma=5/3, ECP beta=0.1, MbLS alpha=0.1, ACLS
lambda_1=0.1, lambda_2=0.01, CRL weight 1.

    python train.py --config=configs/cifar10_resnet101.py:mbls --workdir=workdirs/c10_r101_mbls

Variants (`:arg`): ce, ls, focal, flsd, ecp, mbls (default), mbls_m0 ("Ours (m=0)"), acls, crl,
mdca, cpc, mmce.
"""
import os

import ml_collections

from calib_jax.config import load_config_module

_BASE = load_config_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cifar10_resnet50.py"))
VARIANTS = _BASE.VARIANTS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The ResNet-50 recipe of `cifar10_resnet50.py` with ResNet-101; `arg` picks the loss."""
  config = _BASE.get_config(arg)
  config.model = "resnet101"
  return config
