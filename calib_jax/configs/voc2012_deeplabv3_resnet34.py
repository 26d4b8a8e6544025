"""PASCAL VOC 2012 segmentation, DeepLabV3 with a ResNet-34 backbone: MbLS Table 5 (rows
"ResNet-34": CE, ECP, LS, FL, Ours).

The recipe of `voc2012_deeplabv3_resnet50.py` (same data, schedule and margin m = 10) with the
dilated ResNet-34 backbone (basic blocks, 512 feature channels); the encoder is initialised from a
local ImageNet ResNet-34 file: torchvision's `resnet34-b627a593.pth` (IMAGENET1K_V1) as
downloaded (reading .pth needs torch), or saved as .safetensors, or our own variables file.

    python train.py --config=configs/voc2012_deeplabv3_resnet34.py:mbls --workdir=workdirs/voc_r34_mbls \
        --config.pretrained=/path/to/resnet34-b627a593.pth

Variants (`:arg`): ce, ecp, ls, focal, mbls (default).
"""
import os

import ml_collections

from calib_jax.config import variants
from calib_jax.config import load_config_module

_BASE = load_config_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "voc2012_deeplabv3_resnet50.py"))
VARIANTS = {name: _BASE.VARIANTS[name] for name in ("ce", "ecp", "ls", "focal", "mbls")}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The ResNet-50 recipe with the ResNet-34 backbone; `arg` picks the loss row."""
  config = _BASE.get_config(variants.variant_name(arg, VARIANTS, "mbls"))
  config.model = "deeplabv3_resnet34"
  return config
