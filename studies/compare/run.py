"""One cell of the loss-comparison study (`python -m studies.compare`; flags there): train and
evaluate a (dataset, loss, seed) run with the library's own `train_and_evaluate` and
`evaluate_run`, or re-read a run that already finished.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from studies.compare import config as study_config

Results = dict[str, Any]  # one run's metrics.json


def run_dir(workdir: str, dataset: str, loss: str, seed: int) -> str:
  return os.path.join(workdir, dataset, loss, f"seed{seed}")


def train_and_evaluate_cell(workdir: str, dataset: str, loss: str, seed: int) -> Results:
  """Trains and evaluates one (dataset, loss, seed) run, or re-reads a finished one.

  A run whose loss or gradient became non-finite is recorded (`diverged.json`, and
  `{"diverged": message}` returned) instead of stopping the study.
  """
  from calib_jax import config as config_lib
  from calib_jax.evaluation import run as evaluate
  from calib_jax.run import loop

  path = os.path.abspath(run_dir(workdir, dataset, loss, seed))
  metrics_file = os.path.join(evaluate.eval_dir(path, "test"), evaluate.RESULTS_FILE)
  timing_file = os.path.join(path, "timing.json")
  diverged_file = os.path.join(path, "diverged.json")
  if not os.path.exists(metrics_file) and not os.path.exists(diverged_file):
    config = config_lib.load_config_file(f"{study_config.__file__}:{dataset},{loss}")
    config.seed = seed
    start = time.monotonic()
    try:
      loop.train_and_evaluate(config, path)
    except loop.NonFiniteLossError as e:
      with open(diverged_file, "w") as f:
        json.dump({"diverged": str(e), "train_s": time.monotonic() - start}, f)
    else:
      trained = time.monotonic()
      evaluate.evaluate_run(config, path, split="test")
      with open(timing_file, "w") as f:
        json.dump({"train_s": trained - start, "eval_s": time.monotonic() - trained}, f)
  if os.path.exists(diverged_file):
    with open(diverged_file) as f:
      record = json.load(f)
    return {"diverged": record["diverged"], "timing": {"train_s": record["train_s"]}}
  with open(metrics_file) as f:
    results = json.load(f)
  if os.path.exists(timing_file):
    with open(timing_file) as f:
      results["timing"] = json.load(f)
  return results
