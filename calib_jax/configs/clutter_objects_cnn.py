"""A small CNN on the generated `clutter_objects` scenes: the object-size losses' setting
(ALS Tables 2 and 3: objects of varied size in their scene) in miniature, offline.

Images are 32x32 clutter scenes showing a digit (10 classes) 5 to 28 pixels tall, with its box,
so the objectness-based losses run here (objectness is then the digit's share of the whole
image: training uses whole images, not random-resized crops, to learn fast on a CPU). The
loss-comparison study (`studies/compare/config.py`) uses this recipe for its `clutter_objects` rows.

    python train.py --config=configs/clutter_objects_cnn.py:als --workdir=workdirs/clutter_als

Variants (`:arg`): every loss column of `calib_jax.config.variants.LOSS_COLUMNS` with margin
10 (default `ce`), `als` (adaptive label smoothing from the crop's objectness) and
`als_context` (ALS with 15% context-only crops, uniform target).
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

# Dotted keys inside `data.train_options` add to the recipe's options (crop) instead of replacing.
_ALS = {"loss": "als", "loss_kwargs": {"beta": 1.0}, "data.train_options.objectness": True,
        "eval.context_eval": True}
VARIANTS = {**variants.loss_variants(variants.LOSS_COLUMNS, margin=10.0), "als": _ALS,
            "als_context": {**_ALS, "data.train_options.context_rate": 0.15}}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The recipe; `arg` picks the loss variant."""
  config = base_config()
  config.data.name = "clutter_objects"
  config.model = "small_cnn"
  config.model_kwargs.widths = (32, 64, 128)
  config.data.batch_size = 128
  config.data.eval_batch_size = 200
  config.num_epochs = 5
  # Adam on whole images learns this dataset several times faster than SGD on random-resized
  # crops (about 50% vs 19% train accuracy after 400 steps), which a CPU demo needs.
  config.data.train_options.crop = "none"
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.schedule.name = "cosine"
  config.schedule.warmup_epochs = 0.25
  config.log_every_steps = 20
  config.checkpoint_every_steps = 100
  config.keep_checkpoints = 2
  return variants.apply_variant(config, arg, VARIANTS, default="ce")
