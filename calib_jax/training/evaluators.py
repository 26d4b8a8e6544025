"""Evaluators in big_vision's pattern: small objects built from the config, each with
`run(variables) -> metrics`.

`ValidationEvaluator` is what the training loop runs every `eval_every_steps`; the calibration
report of `eval.py` (`evaluate.CalibrationReport`) is built on the same `eval_batches` stream.
Neither imports the loop: both get what they need from `builders`.
"""
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from calib_jax import metrics
from calib_jax.training import builders, parallel, step as step_lib

VALIDATION_KEYS = ("accuracy", "nll", "ece", "aece", "brier", "aurc")


def to_host(x: jax.Array) -> np.ndarray:
  """The full value of a global array on this host (gathered across processes if needed)."""
  if jax.process_count() > 1:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def eval_batches(config: ml_collections.ConfigDict, split: str, mesh: jax.sharding.Mesh,
                 **extra_options: Any) -> Iterator[dict[str, jax.Array]]:
  """One pass over the config's `split` role ('val', 'test' or a tfds split string) as global
  batches (the last one padded, `mask` False there)."""
  from calib_jax import data
  options = {**config.data_options.to_dict(), **extra_options}
  if config.eval.max_examples > 0:
    options["max_examples"] = int(config.eval.max_examples)
  stream = data.make_dataset(
      config.dataset, builders.split(config, split),
      batch_size=parallel.local_batch_size(config.eval_batch_size),
      train=False, data_dir=config.data_dir, process_index=jax.process_index(),
      process_count=jax.process_count(), **options)
  for batch in stream:
    yield parallel.to_global(batch, mesh)


class ValidationEvaluator:
  """Accuracy, NLL, ECE, AECE, Brier and AURC (and mIoU for segmentation) on one split.

  Built once per run (its predict function compiles once); `run(variables)` streams the split
  through a `metrics.StreamingMetrics` accumulator on device.
  """

  def __init__(self, config: ml_collections.ConfigDict, model, mesh: jax.sharding.Mesh,
               meta: Any, split: str = "val"):
    self.config, self.mesh, self.meta, self.split = config, mesh, meta, split
    self.predict = step_lib.make_predict_fn(model, mesh)

  def run(self, variables: dict[str, Any]) -> dict[str, float]:
    """Metrics of `variables` on the split, as Python floats."""
    segmentation = self.meta.task == "segmentation"
    acc = metrics.StreamingMetrics.init(self.meta.num_classes, self.config.eval.num_bins,
                                        confusion=segmentation)
    for batch in eval_batches(self.config, self.split, self.mesh):
      acc = acc.update(logits=self.predict(variables, batch), labels=batch["label"],
                       mask=batch["mask"])
    result = acc.result(risks=(), coverages=())
    keys = VALIDATION_KEYS + (("miou",) if segmentation else ())
    return {k: float(result[k]) for k in keys}
