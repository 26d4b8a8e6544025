"""ImageNet with boxes, ResNet-101: adaptive label smoothing with objectness (Krothapalli &
Abbott) Table 3 (ResNet-101 rows).

Recipe (ALS Sec. 4 and App. A): the ImageNet training images that have boxes, one object kept
per image ("mask" version: other objects filled with the mean pixel); random-resized crops whose
objectness (fraction of the crop covered by the object's boxes) sets the smoothing per example;
SGD (momentum 0.9; weight decay 1e-4, not stated in the paper), batch 256, 300 epochs, learning
rate 0.1 multiplied by 0.1 at epochs 75, 150 and 225. "+Context" also samples about 15% of the
time from context-only images (all objects removed) with the uniform target. Evaluation: the
ImageNet validation set, and context-only images (`eval.context_eval`) for the ALS models.

    python train.py --config=configs/imagenet_boxes_resnet101_als.py:als --workdir=workdirs/in_r101_als

Variants (`:arg`): ce ("Hard Label"), als (default).
"""
import os

import ml_collections

from calib_jax.config import variants
from calib_jax.config import load_config_module

_BASE = load_config_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "imagenet_boxes_resnet50_als.py"))
VARIANTS = {name: _BASE.VARIANTS[name] for name in ("ce", "als")}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The recipe of `imagenet_boxes_resnet50_als.py` with ResNet-101; `arg` picks the loss."""
  config = _BASE.get_config(variants.variant_name(arg, VARIANTS, "als"))
  config.model = "resnet101"
  return config
