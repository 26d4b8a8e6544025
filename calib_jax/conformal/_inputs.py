"""Shape checks shared by `fit`, the predictors and the set metrics."""
from typing import Optional

import numpy as np


def check_class_shape(x, labels, name: str, num_classes: Optional[int] = None) -> tuple:
  """Checks `x [..., C]` (and `labels [...]`, C == `num_classes` when given); returns `(N, C)`
  with N the number of samples over the leading dims."""
  shape = tuple(np.shape(x))
  if len(shape) < 2:
    raise ValueError(f"{name} must have shape [..., C] with at least 2 dims, got {shape}.")
  if num_classes is not None and shape[-1] != num_classes:
    raise ValueError(f"{name} has {shape[-1]} classes but the predictor was fitted on "
                     f"{num_classes}.")
  if labels is not None and tuple(np.shape(labels)) != shape[:-1]:
    raise ValueError(f"labels shape {tuple(np.shape(labels))} must equal the leading shape of "
                     f"{name} {shape[:-1]}.")
  n = int(np.prod(shape[:-1]))
  if n == 0 or shape[-1] == 0:
    raise ValueError(f"empty input: {name} has shape {shape}; need >= 1 sample and class.")
  return n, shape[-1]
