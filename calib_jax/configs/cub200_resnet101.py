"""CUB-200-2011, ResNet-101 fine-tuned from ImageNet: MbLS Tables 3 and 7 (row "CUB-200-2011 R-101").

Recipe (MbLS App. B): 200 bird species; random crop of the resized image and horizontal flip;
ImageNet-pretrained ResNet-101, all layers trained; SGD, momentum 0.9, weight decay 5e-4,
batch 16, 200 epochs, learning rate 0.1 multiplied by 0.1 every 80 epochs. Margin m = 10 (the
value found on Tiny-ImageNet; MbLS uses no CUB validation set). The crop size is the dataset's
default (`calib_jax.data.info('cub200').input_shape`).
Gradient-norm clipping at 2, as the official trainer (MbLS `calibrate/engine/trainer.py`,
`clip_grad_norm: True` in `configs/defaults.yaml`) does for every loss of its tables.

Pre-trained weights are a file the config names (`pretrained` is unset by default): torchvision's
ImageNet ResNet-101, as downloaded (`resnet101-63fe2227.pth` for IMAGENET1K_V1,
`resnet101-cd907fc2.pth` for V2; reading .pth needs torch) or saved as .safetensors, or our own
variables file (`calib_jax.models.save_variables`). The classifier `head` is re-initialised.

    python train.py --config=configs/cub200_resnet101.py:mbls --workdir=workdirs/cub_mbls \
        --config.pretrained=/path/to/resnet101-63fe2227.pth

Variants (`:arg`): ce, ecp, ls, focal, flsd, mbls_m0, mbls (default).
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(
    ("ce", "ecp", "ls", "focal", "flsd", "mbls_m0", "mbls"),
    margin=10.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the loss column."""
  config = base_config()
  config.data.name = "cub200"
  config.model = "resnet101"
  config.model_kwargs.stem = "imagenet"
  config.pretrained_skip = ("head",)
  config.data.batch_size = 16
  config.data.eval_batch_size = 64
  config.num_epochs = 200
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.1
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 5e-4
  # The official trainers clip the global gradient norm at 2 (`clip_grad_norm: True`).
  config.optimizer.grad_clip_norm = 2.0
  config.schedule.name = "multistep"
  config.schedule.boundaries_epochs = (80, 160)
  config.schedule.decay_factor = 0.1
  config.log_every_steps = 50
  config.checkpoint_every_steps = 2000
  return variants.apply_variant(config, arg, VARIANTS, default="mbls")
