"""Training the study's models and keeping their logits.

Each model is a row of the label-relaxation Table 1 study (`studies/lr_table1/config.py`, the
values its report chose for ECE) trained on the study's *tuning* split: the first 50,000
training images, so that the last 10,000 stay a true hold-out for fitting calibrators and
conformal thresholds; the test split is the 10,000 test images. After training, the model's
logits on both splits are saved to `<workdir>/<loss>/seed<k>/logits.npz` (`val_logits`,
`val_labels`, `test_logits`, `test_labels`: the arrays `eval.py --predictions` reads).
"""
import os
from typing import Any

import numpy as np

from studies.lr_table1 import config as lr_config

# (row name, lr_table1 variant): the ECE-tuned values of the Table 1 report.
MODELS = (
    ("CE", "final,ce"),
    ("LS", "final,ls,0.025"),
    ("LR", "final,lr,0.3"),
    ("MbLS", "final,mbls,6"),
    ("ACLS", "final,acls"),
)
LOGITS_FILE = "logits.npz"


def run_dir(workdir: str, name: str, seed: int) -> str:
  return os.path.join(workdir, name.lower(), f"seed{seed}")


def model_config(variant: str, seed: int):
  """The lr_table1 variant on the tuning split (val held out), with `seed`."""
  from calib_jax import config as config_lib
  config = config_lib.load_config_file(f"{lr_config.__file__}:{variant}")
  config.data.splits = dict(lr_config.SPLITS["tune"])
  config.seed = seed
  return config


def split_logits(experiment, variables: dict[str, Any], role: str) -> tuple[np.ndarray,
                                                                           np.ndarray]:
  """The model's float32 logits and the labels of every example of split `role`."""
  import jax
  from calib_jax.training import step as step_lib

  apply = jax.jit(lambda v, x: experiment.model.apply(v, x, train=False).astype("float32"))
  logits, labels = [], []
  for batch in experiment.data.eval_stream(role, experiment.mesh):
    mask = np.asarray(jax.device_get(batch["mask"]))
    logits.append(np.asarray(jax.device_get(apply(variables, step_lib.model_input(batch))))[mask])
    labels.append(np.asarray(jax.device_get(batch["label"]))[mask])
  return np.concatenate(logits), np.concatenate(labels)


def train_and_dump(workdir: str, name: str, variant: str, seed: int) -> str:
  """Trains (or resumes) one model and writes its logits file (kept if it exists)."""
  from calib_jax import experiment as experiment_lib
  from calib_jax.evaluation import run as evaluation
  from calib_jax.run import loop
  path = os.path.abspath(run_dir(workdir, name, seed))
  target = os.path.join(path, LOGITS_FILE)
  if os.path.exists(target):
    return target
  config = model_config(variant, seed)
  loop.train_and_evaluate(config, path)
  experiment = experiment_lib.build(config)
  variables, _ = evaluation.restore_variables(experiment, path)
  arrays = {}
  for role in ("val", "test"):
    arrays[f"{role}_logits"], arrays[f"{role}_labels"] = split_logits(experiment, variables, role)
  np.savez(target + ".tmp.npz", **arrays)
  os.replace(target + ".tmp.npz", target)
  return target
