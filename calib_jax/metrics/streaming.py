"""`StreamingMetrics`: several accumulators updated together over batches and devices.

```python
acc = metrics.StreamingMetrics.init(num_classes=C)    # every metric (mIoU with confusion=True)
# or only what an evaluation reports:
acc = metrics.StreamingMetrics.of(scalars=metrics.ScalarSums.init(),
                                  calibration=metrics.BinnedCalibration.init(num_bins=15))
for batch in eval_set:
  acc = acc.update(logits=logits, labels=labels, mask=mask)   # or probs=...
acc = acc.psum("batch")       # inside shard_map / pmap, to combine devices
summary = acc.result()        # on the host: dict of float32 scalars (and per-bin arrays)
```

The parts are the accumulators of `accumulators.py` and `histogram.py`, by name; `update`
prepares the batch (softmax, argmax, confidence) once and adds it to every part in one
compiled program; `merge`, `psum` and `result` act part by part, and `result()` is the union
of the parts' `compute()` dicts. ECE, MCE, classwise ECE, NLL, Brier, accuracy, confidence and
mIoU are exact (bin sums); AECE and the selective metrics come from the confidence histogram,
with error bounds (`ConfidenceHistogram`).
"""
from typing import Optional, Sequence

from calib_jax import arrays
from calib_jax.metrics.accumulators import (Accumulator, Batch, BinnedCalibration,
                                            ClasswiseCalibration, ConfusionMatrix, ScalarSums,
                                            pytree_dataclass, static_field)
from calib_jax.metrics.histogram import ConfidenceHistogram


@pytree_dataclass
class StreamingMetrics(Accumulator):
  """Named accumulators (`parts`) updated, merged and summed over devices together."""
  num_classes: Optional[int] = static_field()
  parts: dict  # name -> accumulator

  @classmethod
  def init(cls, num_classes: int, num_bins: int = 15, *, score_bits: int = 12,
           confusion: bool = True, classwise: bool = True) -> "StreamingMetrics":
    """Every metric: `ScalarSums`, `BinnedCalibration`, `ConfidenceHistogram` and, unless
    turned off, `ClasswiseCalibration` and `ConfusionMatrix`.

    Args:
      num_classes: C, the width of the logits.
      num_bins: equal-width bins for ECE/MCE/classwise ECE and the number of AECE groups.
      score_bits: resolution of the fine confidence histogram (24·2^bits + 2 bins).
      confusion: also accumulate a `[C, C]` confusion matrix for mIoU.
      classwise: also accumulate the `[C, B]` classwise bins for classwise ECE.
    """
    arrays.check_num_classes(num_classes)
    parts = {"scalars": ScalarSums.init(), "calibration": BinnedCalibration.init(num_bins)}
    if classwise:
      parts["classwise"] = ClasswiseCalibration.init(num_classes, num_bins)
    parts["histogram"] = ConfidenceHistogram.init(num_bins, score_bits=score_bits)
    if confusion:
      parts["confusion"] = ConfusionMatrix.init(num_classes)
    return cls.of(num_classes, **parts)

  @classmethod
  def of(cls, num_classes: Optional[int] = None, /, **parts: Accumulator) -> "StreamingMetrics":
    """A combination of the given accumulators (keyword = name of the part).

    `num_classes` (checked against the inputs' width) defaults to that of the parts that have
    one; parts must agree on it.
    """
    if not parts:
      raise ValueError("StreamingMetrics.of needs at least one accumulator.")
    for name, part in parts.items():
      if not isinstance(part, Accumulator):
        raise TypeError(f"part {name!r} is not an accumulator: {type(part).__name__}.")
    widths = {p.num_classes for p in parts.values() if p.num_classes is not None}
    if num_classes is not None:
      widths.add(num_classes)
    if len(widths) > 1:
      raise ValueError(f"the parts disagree on num_classes: {sorted(widths)}.")
    return cls(num_classes=widths.pop() if widths else None, parts=dict(parts))

  def __getitem__(self, name: str) -> Accumulator:
    return self.parts[name]

  def add(self, batch: Batch) -> "StreamingMetrics":
    return self.replace(parts={name: part.add(batch) for name, part in self.parts.items()})

  def config(self) -> dict:
    return {"num_classes": self.num_classes,
            **{name: (type(part).__name__, part.config()) for name, part in self.parts.items()}}

  def result(self, *, risks: Sequence[float] = (0.01, 0.05, 0.10),
             coverages: Sequence[float] = (0.5, 0.8, 0.9, 0.95)) -> dict:
    """Every part's metrics in one dict of numpy float32 values (fractions, not percent).

    Runs on the host in float64 from the accumulated sums (a few MB); call it outside `jit`,
    after `psum`/`merge` have combined the devices. `risks` and `coverages` are the operating
    points of the confidence histogram.

    With `init`'s parts: scalars accuracy, ece, mce, aece, classwise_ece, nll, brier,
    average_confidence, overconfidence, underconfidence, aurc, eaurc, augrc, the error bounds
    of the histogram estimates (aurc_error_bound, aece_error_bound, augrc_error_bound),
    num_samples, and when tracked miou. One key per operating point: `coverage_at_{r}pct_risk`
    for r in `risks`, `risk_at_{c}pct_coverage` for c in `coverages` (e.g.
    coverage_at_5pct_risk, risk_at_80pct_coverage). Arrays: reliability_counts /
    reliability_confidence / reliability_accuracy `[B]`, and per_class_iou `[C]` when tracked.
    An empty accumulator gives zeros.
    """
    out = {}
    for part in self.parts.values():
      if isinstance(part, (ConfidenceHistogram, StreamingMetrics)):
        out.update(part.compute(risks=risks, coverages=coverages))
      else:
        out.update(part.compute())
    return out

  compute = result
