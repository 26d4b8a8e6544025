"""The runs of the localisation study (`python -m studies.localisation`; flags there): each
(loss, seed) cell of the loss-comparison recipe on clutter_objects, and a tiny segmenter for the
confidence-map figures.
"""
from __future__ import annotations

import json
import os
import time

from studies.compare import config as compare_config
from studies.compare.run import Results

LOSSES = ("ce", "als", "als_context")


def run_cell(workdir: str, loss: str, seed: int) -> Results:
  """Trains (unless checkpointed) and evaluates (unless scored) one run; its metrics.json."""
  from calib_jax import config as config_lib
  from calib_jax.evaluation import run as evaluate
  from calib_jax.training import checkpoint
  from calib_jax.run import loop
  path = os.path.abspath(os.path.join(workdir, loss, f"seed{seed}"))
  metrics_file = os.path.join(evaluate.eval_dir(path, "test"), evaluate.RESULTS_FILE)
  if os.path.exists(metrics_file):
    with open(metrics_file) as f:
      results = json.load(f)
    if "localisation" in results:
      return results
  config = config_lib.load_config_file(f"{compare_config.__file__}:clutter_objects,{loss}")
  config.seed = seed
  if checkpoint.Checkpointer(path, read_only=True).latest_step() is None:
    start = time.monotonic()
    loop.train_and_evaluate(config, path)
    print(f"trained {loss} seed {seed} in {time.monotonic() - start:.0f} s", flush=True)
  return evaluate.evaluate_run(config, path, split="test")


def train_segmenter(workdir: str, steps: int) -> Results:
  """A tiny dilated FCN on clutter_objects_seg, trained and evaluated (for its pictures)."""
  import flax.linen as nn
  from calib_jax import models
  from calib_jax import config as config_lib
  from calib_jax.evaluation import run as evaluate
  from calib_jax.training import checkpoint
  from calib_jax.run import loop

  class BenchFCN(nn.Module):
    """conv 16 - conv 32 (dilation 2) - conv 32 (dilation 4), BN-ReLU each, 1x1 'head'."""
    num_classes: int

    @nn.compact
    def __call__(self, x, train=False):
      for i, (width, dilation) in enumerate(((16, 1), (32, 2), (32, 4))):
        x = nn.Conv(width, (3, 3), kernel_dilation=dilation, use_bias=False, name=f"conv{i}")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, name=f"bn{i}")(x))
      return nn.Conv(self.num_classes, (1, 1), name="head")(x)

  models.register("bench_fcn", BenchFCN, overwrite=True)
  config = config_lib.base_config()
  config.data.name = "clutter_objects_seg"
  config.model = "bench_fcn"
  config.data.batch_size = 32
  config.data.eval_batch_size = 100
  config.num_train_steps = steps
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.schedule.name = "cosine"
  config.schedule.warmup_epochs = 0.1
  config.eval_every_steps = 0
  config.checkpoint_every_steps = steps
  config.progress_bar = False
  config.tensorboard = False
  config.eval.pnorm_candidates = (2,)
  path = os.path.abspath(os.path.join(workdir, "seg_fcn"))
  if checkpoint.Checkpointer(path, read_only=True).latest_step() is None:
    loop.train_and_evaluate(config, path)
  return evaluate.evaluate_run(config, path, split="test")
