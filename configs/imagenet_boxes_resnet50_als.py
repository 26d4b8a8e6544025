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

from calib_jax.training.config import base_config, select_variant

VARIANTS = ("ce", "ls", "als", "als_b0.75", "als_b0.25", "als_context")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the table row."""
  variant = select_variant(arg, VARIANTS, "als")
  config = base_config()
  config.dataset = "imagenet2012_boxes"
  config.model = "resnet50"
  config.model_kwargs.stem = "imagenet"
  config.data_options.mask_variant = True
  config.batch_size = 256
  config.eval_batch_size = 512
  config.num_epochs = 300
  config.optimizer = "sgd"
  config.learning_rate = 0.1
  config.momentum = 0.9
  config.weight_decay = 1e-4
  config.schedule = "multistep"
  config.lr_boundaries_epochs = (75, 150, 225)
  config.lr_decay_factor = 0.1
  config.log_every_steps = 200
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 5000
  config.eval.context_eval = True
  if variant == "ce":
    config.loss = "ce"
  elif variant == "ls":
    config.loss = "ls"
    config.loss_kwargs = ml_collections.ConfigDict({"epsilon": 0.1})
  else:
    beta = float(variant[len("als_b"):]) if variant.startswith("als_b") else 1.0
    config.loss = "als"
    config.loss_kwargs = ml_collections.ConfigDict({"beta": beta})
    config.train_data_options.objectness = True
    if variant == "als_context":
      config.train_data_options.context_rate = 0.15
  return config
