"""20 Newsgroups, Global-Pooling CNN: MbLS Tables 6 and 7 (row "20 News GPCN").

Recipe (MbLS App. B): 20 topics, 15,098/900/3,999 documents; GPool-CNN over GloVe word
embeddings; Adam (beta 0.9, 0.999), learning rate 1e-3 for 50 epochs then 1e-4 for the last 50
(100 epochs). The batch size is not given in the paper; 128 here. Margin m = 6. GloVe vectors
are a file the config names: `--config.model_kwargs.embedding=/path.npy` (a local table
[vocab_size, 100], row 0 = padding) starts from them; otherwise embeddings are learned.
No gradient clipping: MbLS's text trainer (`calibrate/engine/nlp_trainer.py`) does not clip.

    python train.py --config=configs/newsgroups20_gpool_cnn.py:mbls --workdir=workdirs/20ng_mbls

Variants (`:arg`): ce, ecp, ls, focal, flsd, mbls_m0, mbls (default).
"""
import ml_collections

from calib_jax.config import variants
from calib_jax.config import base_config

VARIANTS = variants.loss_variants(
    ("ce", "ecp", "ls", "focal", "flsd", "mbls_m0", "mbls"),
    margin=6.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The paper recipe; `arg` picks the loss column."""
  config = base_config()
  config.data.name = "newsgroups20"
  config.model = "gpool_cnn"
  config.data.batch_size = 128
  config.data.eval_batch_size = 256
  config.num_epochs = 100
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.999
  config.optimizer.weight_decay = 0.0
  config.schedule.name = "multistep"
  config.schedule.boundaries_epochs = (50,)
  config.schedule.decay_factor = 0.1
  config.log_every_steps = 50
  config.checkpoint_every_steps = 1000
  return variants.apply_variant(config, arg, VARIANTS, default="mbls")
