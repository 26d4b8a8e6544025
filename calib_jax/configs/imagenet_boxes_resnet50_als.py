"""ImageNet with boxes, ResNet-50: adaptive label smoothing with objectness (Krothapalli &
Abbott) Table 2 (ResNet-50 rows).

Recipe (ALS Sec. 4 and App. A): the ImageNet training images that have boxes, one object kept
per image ("mask" version: other objects filled with the mean pixel); random-resized crops whose
objectness (fraction of the crop covered by the object's boxes) sets the smoothing per example;
SGD (momentum 0.9; weight decay 1e-4, not stated in the paper), batch 256, 300 epochs, learning
rate 0.1 multiplied by 0.1 at epochs 75, 150 and 225. "+Context" also samples about 15% of the
time from context-only images (all objects removed) with the uniform target. Evaluation: the
ImageNet validation set, and context-only images (`eval.context_eval`) for the ALS models.

    python train.py --config=configs/imagenet_boxes_resnet50_als.py:als --workdir=workdirs/in_r50_als

Variants (`:arg`): ce ("Hard Label", beta=0), ls, als (default, beta=1), als_b0.75, als_b0.25, als_context ("A.L.S.+Context").
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config


def _als(beta: float, **train_options) -> dict:
  return {"loss": "als", "loss_kwargs": {"beta": beta}, "data.train_options.objectness": True,
          **{f"data.train_options.{k}": v for k, v in train_options.items()}}


VARIANTS = {"ce": {"loss": "ce", "loss_kwargs": {}},
            "ls": {"loss": "ls", "loss_kwargs": {"epsilon": 0.1}},
            "als": _als(1.0), "als_b0.75": _als(0.75), "als_b0.25": _als(0.25),
            "als_context": _als(1.0, context_rate=0.15)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the table row."""
  config = base_config()
  config.data.name = "imagenet2012_boxes"
  config.model = "resnet50"
  config.model_kwargs.stem = "imagenet"
  config.data.options.mask_variant = True
  config.data.batch_size = 256
  config.data.eval_batch_size = 512
  config.num_epochs = 300
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.1
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 1e-4
  config.schedule.name = "multistep"
  config.schedule.boundaries_epochs = (75, 150, 225)
  config.schedule.decay_factor = 0.1
  config.log_every_steps = 200
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 5000
  config.eval.context_eval = True
  return variants.apply_variant(config, arg, VARIANTS, default="als")
