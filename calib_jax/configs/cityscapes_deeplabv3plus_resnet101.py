"""Cityscapes, DeepLabV3+ with a ResNet-101 backbone: LS-vs-SC Figs. 4, 6, 10, 14 (DeepLabV3+).

Recipe (LS-vs-SC App. B): 19 classes (255 = ignore); ImageNet-pretrained ResNet-101 backbone;
SGD, momentum 0.9, weight decay 1e-4, base learning rate 0.01 (a tenth of it for the backbone)
with the "poly" policy, power 0.9; batch 12, 40,000 steps; random crops (768x768 in the paper;
the dataset's training crop here, `calib_jax.data.info('cityscapes').input_shape`), flip and
colour jitter; evaluation at full resolution. Val and test are the official validation set.

    python train.py --config=configs/cityscapes_deeplabv3plus_resnet101.py:ls0.1 \
        --workdir=workdirs/cs_ls01 --config.pretrained=/path/to/resnet101-63fe2227.pth

`pretrained` (unset by default): torchvision's ImageNet ResNet-101 file (`resnet101-63fe2227.pth`,
or .safetensors, or our variables file) fills the DeepLab's backbone.

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
  config.data.name = "cityscapes"
  config.model = "deeplabv3plus_resnet101"
  config.pretrained_skip = ("aspp", "low_level_reduce", "decoder_conv1", "decoder_conv2", "head")
  config.data.batch_size = 12
  config.data.eval_batch_size = 4
  config.num_train_steps = 40_000
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.01
  config.optimizer.lr_multipliers = ml_collections.ConfigDict({"backbone": 0.1})
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 1e-4
  config.schedule.name = "poly"
  config.schedule.poly_power = 0.9
  config.log_every_steps = 50
  config.eval_every_steps = 4000
  config.checkpoint_every_steps = 2000
  return variants.apply_variant(config, arg, VARIANTS, default="ce")
