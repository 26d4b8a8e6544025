"""Tiny-ImageNet, ResNet-101: MbLS Tables 1, 2 and 7 (rows "Tiny-ImageNet R-101") and ACLS
Table 3 (column "Tiny-ImageNet ResNet-101").

Recipe (MbLS App. B; ACLS Sec. 4.1): 64x64 images, 200 classes; SGD, momentum 0.9, weight decay
5e-4, batch 64, 100 epochs, learning rate 0.1 divided by 10 at epochs 40 and 60; random crop
and horizontal flip. ResNet-101 with the CIFAR-style stem (3x3 stride-1 conv, no max pool),
as the papers' Tiny-ImageNet networks. Margin m = 10 for MbLS and ACLS. The papers hold out
50 images per class of the training set for validation and test on the official validation
set; here the dataset's own val/test splits are used (see `calib_jax.data.info`).

    python train.py --config=configs/tiny_imagenet_resnet101.py:acls --workdir=workdirs/tin_r101_acls

Variants (`:arg`): ce, ls, focal, flsd, ecp, mbls (default), mbls_m0, acls, crl, mdca, cpc, mmce.
"""
import os

import ml_collections

from calib_jax.config import load_config_module

_BASE = load_config_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_imagenet_resnet50.py"))
VARIANTS = _BASE.VARIANTS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The ResNet-50 recipe of `tiny_imagenet_resnet50.py` with ResNet-101; `arg` picks the loss."""
  config = _BASE.get_config(arg)
  config.model = "resnet101"
  return config
