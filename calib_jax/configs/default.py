"""The embedded default and `make demo`'s recipe: a network that memorises its training set and
is more confident than it is accurate, in seconds, offline.

Not a paper row. The papers study networks that fit their training data completely (a ResNet
on CIFAR reaches ~100 % training accuracy) and are then over-confident on new data, which the
calibration losses correct. Here that regime is reproduced on a CPU: a 2x512 ReLU MLP trained
with Adam (3e-3, constant, no weight decay) for 500 steps of batch 32 on only the first 60
training images of scikit-learn's handwritten digits (8x8, shipped with scikit-learn). It fits
them exactly, reaches ~87 % on digits it has not seen and is ~95 % confident on them. The
temperature and p-norm are fitted on the 200 validation digits; the test split is every digit
the model never saw: the other 1,237 training images and the 300 test images (1,537). No
validation during training: eval.py's report (the demo's evaluation) reads the validation
digits once, at the end.

    python train.py --workdir=workdirs/default                  # cross-entropy
    python train.py --config=configs/default.py:mbls --workdir=workdirs/default_mbls
    python eval.py --config=configs/default.py:mbls --workdir=workdirs/default_mbls

Variants (`:arg`): every loss column of `calib_jax.config.variants.LOSS_COLUMNS` with the
papers' settings and margin 10 for MbLS/ACLS (default `ce`). The numbers `make demo` gives for
`ce`, `mbls` and `acls` on three seeds are in the README ("make demo").
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(variants.LOSS_COLUMNS, margin=10.0)
TRAIN_EXAMPLES = 60


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The demo recipe; `arg` picks the loss."""
  config = base_config()
  config.data.name = "digits"
  config.data.splits.train = f"train[:{TRAIN_EXAMPLES}]"
  config.data.splits.test = f"train[{TRAIN_EXAMPLES}:]+test"
  config.data.batch_size = 32
  config.data.eval_batch_size = 256
  config.model = "mlp"
  config.model_kwargs.hidden = (512, 512)
  config.num_epochs = -1
  config.num_train_steps = 500
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.schedule.name = "constant"
  config.log_every_steps = 100
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 1
  config.eval_every_steps = 0
  return variants.apply_variant(config, arg, VARIANTS, default="ce")
