"""PASCAL VOC 2012 segmentation, DeepLabV3 with a ResNet-50 backbone: MbLS Table 5 (rows
"ResNet-50") and ACLS Table 4.

Recipe (MbLS App. B; ACLS Sec. 4.1): 21 classes (255 = ignore); random 512x512 crops, horizontal
flip (the papers add brightness/contrast jitter); ImageNet-pretrained encoder, decoder from
scratch; SGD, momentum 0.9, weight decay 5e-4, batch 8, 100 epochs, learning rate 0.01 divided
by 10 at epochs 40 and 80. Metrics on the validation set (the test labels are not public), so
`val` and `test` are the same split here and temperature scaling is fitted on it. Margin
m = 10 (Tiny-ImageNet's; no tuning on VOC). The ResNet-34 rows: `voc2012_deeplabv3_resnet34.py`.
Gradient-norm clipping at 2, as the official trainer (MbLS `calibrate/engine/segement_trainer.py`,
`clip_grad_norm: True` in `configs/defaults.yaml`) does for every loss of its tables.

    python train.py --config=configs/voc2012_deeplabv3_resnet50.py:mbls --workdir=workdirs/voc_mbls \
        --config.pretrained=/path/to/resnet50-0676ba61.pth

`pretrained` (unset by default) is torchvision's ImageNet ResNet-50 file as downloaded
(`resnet50-0676ba61.pth` for IMAGENET1K_V1, `resnet50-11ad3fa6.pth` for V2; reading .pth needs
torch) or saved as .safetensors: its layers go into the DeepLab's 'backbone', its ImageNet
classifier is dropped, and ASPP, decoder and head (`pretrained_skip`) start fresh. Our own
variables file (`calib_jax.models.save_variables`) works too.

Variants (`:arg`): ce, ecp, ls, focal, flsd, mbls (default), acls, mdca, cpc, mmce.
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(
    ("ce", "ecp", "ls", "focal", "flsd", "mbls", "acls", "mdca", "cpc", "mmce"),
    margin=10.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the loss column."""
  config = base_config()
  config.data.name = "voc2012_seg"
  config.model = "deeplabv3_resnet50"
  config.pretrained_skip = ("aspp", "decoder_conv1", "head")
  config.data.batch_size = 8
  config.data.eval_batch_size = 8
  config.num_epochs = 100
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.01
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 5e-4
  # The official trainers clip the global gradient norm at 2 (`clip_grad_norm: True`).
  config.optimizer.grad_clip_norm = 2.0
  config.schedule.name = "multistep"
  config.schedule.boundaries_epochs = (40, 80)
  config.schedule.decay_factor = 0.1
  config.log_every_steps = 50
  config.checkpoint_every_steps = 2000
  return variants.apply_variant(config, arg, VARIANTS, default="mbls")
