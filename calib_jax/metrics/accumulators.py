"""Composable streaming accumulators: sums over batches and devices, metrics on the host.

```python
acc = metrics.BinnedCalibration.init(num_bins=15)
for batch in eval_set:
  acc = acc.update(logits=logits, labels=labels, mask=mask)   # or probs=...
acc = acc.psum("batch")       # inside shard_map / pmap, to combine devices
summary = acc.compute()       # on the host: dict of numpy float32 values
```

Every accumulator is an immutable pytree (`pytree_dataclass`) whose leaves are all sums,
so `merge` is `+` and combining devices is a `psum`. `init`, `update`, `add`, `merge` and
`psum` are jit-able and run on device; `compute()` reads the sums and finishes on the host in
float64, rounding each result once to float32. `update` checks and flattens the inputs
eagerly, then runs one compiled program: the batch's per-sample values (`Batch`: softmax,
argmax, confidence, `log p_y`) and the accumulator's `add`. `StreamingMetrics` (streaming.py)
combines accumulators, so that a batch is prepared once for all of them.

The accumulators, their sums (masked entries left out) and what `compute()` gives:

* `ScalarSums`: N, Σ 1[ŷ = y], Σ −log p_y, Σ Brier, Σ c, Σ c over wrong, Σ (1 − c) over
  right → num_samples, accuracy, nll, brier, average_confidence, over/underconfidence;
* `BinnedCalibration`: per equal-width bin of c, the count, Σ c and Σ 1[ŷ = y] → ece, mce,
  reliability_counts / _confidence / _accuracy;
* `ClasswiseCalibration`: per class k and bin of p_k, Σ p_k and #[y = k] (optionally the
  count) → classwise_ece (and per_class_ece);
* `ConfusionMatrix`: `[C, C]` counts → miou, per_class_iou;
* `ConfidenceHistogram` (histogram.py): fine histogram of c, counts, errors and offsets →
  aece, aurc, eaurc, augrc, the operating points and the estimates' error bounds.

All but the histogram's are exact: they apply the one-shot metrics' formulas
(`calibration.*_from_bins`, `segmentation.iou_from_confusion`) to the accumulated sums.
"""
import dataclasses
import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax.metrics import _arrays
from calib_jax import arrays
from calib_jax.metrics import calibration
from calib_jax.metrics import segmentation

ArrayLike = jax.typing.ArrayLike
_INT_RESULTS = ("num_samples", "reliability_counts")


class Batch(NamedTuple):
  """A flattened batch and the per-sample values the accumulators read (all `[N]` but probs)."""
  probs: jax.Array          # f32 [N, C]
  labels: jax.Array         # int32
  mask: Optional[jax.Array]  # bool, or None when every entry counts
  valid: jax.Array          # bool, the mask (all True without one)
  pred: jax.Array           # int32, argmax (first index on ties)
  confidence: jax.Array     # f32, max_k p_k
  correct: jax.Array        # bool, pred == labels
  log_prob: jax.Array       # f32, log p_y (`calibration.label_log_prob`)


def make_batch(x: jax.Array, labels: jax.Array, mask: Optional[jax.Array],
               from_logits: bool) -> Batch:
  """The `Batch` of flat, checked `x [N, C]` (logits or probabilities), labels and mask
  (traceable: what `update` runs inside its compiled program)."""
  probs = jax.nn.softmax(x, axis=-1) if from_logits else x
  # No optimization barrier around the argmax (the old single-program update had one against
  # XLA re-fusing it into every scatter): timed paired on XLA:CPU, N·C = 1e5·10 to 3e4·1000,
  # from logits and from probs, the update is the same speed with and without it (±2 %).
  pred, conf = arrays.prediction_and_confidence(probs)
  return Batch(probs=probs, labels=labels, mask=mask,
               valid=jnp.ones(labels.shape, bool) if mask is None else mask, pred=pred,
               confidence=conf, correct=pred == labels,
               log_prob=calibration.label_log_prob(x, labels, from_logits))


def flatten_inputs(labels: ArrayLike, logits: Optional[ArrayLike], probs: Optional[ArrayLike],
                   mask: Optional[ArrayLike], num_classes: Optional[int]):
  """Checks `update`'s arguments; `(x [N, C], labels [N], mask [N] or None, from_logits)`, or
  None for an empty batch. Out-of-range labels at valid positions raise when concrete."""
  if (logits is None) == (probs is None):
    raise ValueError("pass exactly one of logits= or probs=.")
  x = logits if logits is not None else probs
  shape = tuple(np.shape(x))
  if not shape or (num_classes is not None and shape[-1] != num_classes):
    raise ValueError(
        f"{'logits' if logits is not None else 'probs'} must have shape [..., "
        f"{num_classes if num_classes is not None else 'C'}], got {shape}.")
  if int(np.prod(shape[:-1])) == 0:
    return None  # an empty batch adds nothing
  x, labels, mask = arrays.flatten_probs_labels(x, labels, mask)
  return x, labels, mask, logits is not None


@functools.partial(jax.jit, static_argnames="from_logits")
def _add(acc, x, labels, mask, from_logits: bool):
  return acc.add(make_batch(x, labels, mask, from_logits))


def static_field(**kwargs):
  """A `pytree_dataclass` field kept out of the pytree: a setting (bins, classes), part of the
  tree's structure, so a change of it retraces a jitted function instead of being summed."""
  return dataclasses.field(metadata={"static": True}, **kwargs)


def pytree_dataclass(cls: type) -> type:
  """`cls` as a frozen dataclass registered as a JAX pytree: the `static_field`s are its
  metadata, every other field a child.

  Plain dataclasses and `jax.tree_util.register_dataclass` (what `flax.struct.dataclass`
  does, less its serialization hooks) rather than flax: a predictions report would otherwise
  import flax for this alone (~0.2 s of CPU after JAX; 0.4–1.5 s of wall time measured on a
  loaded machine, its files read).
  """
  cls = dataclasses.dataclass(frozen=True)(cls)
  fields = dataclasses.fields(cls)
  return jax.tree_util.register_dataclass(
      cls, data_fields=[f.name for f in fields if not f.metadata.get("static", False)],
      meta_fields=[f.name for f in fields if f.metadata.get("static", False)])


def to_host(x) -> np.ndarray:
  """A sum on the host: float64 for float sums, int64 for counts."""
  x = np.asarray(x)
  return x.astype(np.float64 if x.dtype.kind == "f" else np.int64)


def finish(out: dict) -> dict:
  """Rounds each float64 result once to numpy float32 (counts stay integers)."""
  return {key: (value if key in _INT_RESULTS else np.asarray(value, np.float32))
          for key, value in out.items()}


class Accumulator:
  """What the accumulators share: `update`, `merge`, `psum` and `config`.

  A subclass is a `pytree_dataclass` of sums with `init(...)` (zeros), `add(batch)`
  (traceable: the sums plus those of a `Batch`) and `compute()` (host: dict of results).
  `num_classes`, when the subclass has it, is checked against the width of the inputs.
  """
  num_classes: Optional[int] = None

  def add(self, batch: Batch):
    raise NotImplementedError

  def replace(self, **changes):
    """A copy with the given fields changed (the accumulators are immutable)."""
    return dataclasses.replace(self, **changes)

  def compute(self) -> dict:
    raise NotImplementedError

  def update(self, *, labels: ArrayLike, logits: Optional[ArrayLike] = None,
             probs: Optional[ArrayLike] = None, mask: Optional[ArrayLike] = None):
    """Adds a batch: exactly one of `logits [..., C]` / `probs [..., C]`, labels `[...]`.

    NLL is exact from logits (log-softmax); from probs, `p_y` is clipped at float32 tiny.
    `mask [...]` (bool) selects valid entries, e.g. padding or segmentation ignore pixels.
    Out-of-range labels at valid positions raise when concrete (not inside a trace).
    """
    inputs = flatten_inputs(labels, logits, probs, mask, self.num_classes)
    return self if inputs is None else _add(self, *inputs)

  def config(self) -> dict:
    """The static settings and which optional sums are kept; accumulators merge when equal."""
    out = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.metadata.get("static", False):
        out[field.name] = value
      elif value is None or isinstance(value, Accumulator):
        out[field.name] = None if value is None else value.config()
    return out

  def merge(self, other):
    """Sum of two accumulators of the same type and configuration."""
    if type(other) is not type(self):
      raise TypeError(f"can only merge with {type(self).__name__}, got {type(other).__name__}.")
    if self.config() != other.config():
      raise ValueError(f"cannot merge accumulators with configs {self.config()} and "
                       f"{other.config()}.")
    return jax.tree_util.tree_map(jnp.add, self, other)

  def psum(self, axis_name):
    """Sums the accumulators of all devices along `axis_name` (inside shard_map/pmap)."""
    return jax.tree_util.tree_map(lambda x: lax.psum(x, axis_name), self)


_ZI, _ZF = functools.partial(jnp.zeros, dtype=jnp.int32), functools.partial(jnp.zeros,
                                                                               dtype=jnp.float32)


@pytree_dataclass
class ScalarSums(Accumulator):
  """Per-sample sums: accuracy, NLL, Brier score, mean confidence, over/underconfidence.

  With N valid samples, `c` the confidence and ŷ the prediction: accuracy `Σ 1[ŷ = y] / N`,
  nll `Σ −log p_y / N`, brier `Σ Σ_k (p_k − 1[k = y])² / N`, average_confidence `Σ c / N`,
  overconfidence `Σ_{ŷ≠y} c / #wrong`, underconfidence `Σ_{ŷ=y} (1 − c) / #right`.
  """
  count: jax.Array                  # int32 [], valid samples
  num_correct: jax.Array            # int32 []
  nll_sum: jax.Array                # f32 []
  brier_sum: jax.Array              # f32 []
  confidence_sum: jax.Array         # f32 []
  wrong_confidence_sum: jax.Array   # f32 [], Σ c over wrong predictions
  right_doubt_sum: jax.Array        # f32 [], Σ (1 − c) over correct predictions

  @classmethod
  def init(cls) -> "ScalarSums":
    return cls(count=_ZI(()), num_correct=_ZI(()), nll_sum=_ZF(()), brier_sum=_ZF(()),
               confidence_sum=_ZF(()), wrong_confidence_sum=_ZF(()),
               right_doubt_sum=_ZF(()))

  def add(self, b: Batch) -> "ScalarSums":
    def total(v):
      return jnp.sum(jnp.where(b.valid, v, 0.0))

    wrong, right = b.valid & ~b.correct, b.valid & b.correct
    return self.replace(
        count=self.count + jnp.sum(b.valid, dtype=jnp.int32),
        num_correct=self.num_correct + jnp.sum(right, dtype=jnp.int32),
        nll_sum=self.nll_sum - total(b.log_prob),
        brier_sum=self.brier_sum + total(calibration.brier_per_sample(b.probs, b.labels)),
        confidence_sum=self.confidence_sum + total(b.confidence),
        wrong_confidence_sum=self.wrong_confidence_sum
        + jnp.sum(jnp.where(wrong, b.confidence, 0.0)),
        right_doubt_sum=self.right_doubt_sum
        + jnp.sum(jnp.where(right, 1.0 - b.confidence, 0.0)))

  def compute(self) -> dict:
    """num_samples, accuracy, nll, brier, average_confidence, overconfidence, underconfidence."""
    h = {k: to_host(v) for k, v in vars(self).items()}
    n, right = int(h["count"]), h["num_correct"]
    div = _arrays.safe_div
    return finish({
        "num_samples": n, "accuracy": div(right, n), "nll": div(h["nll_sum"], n),
        "brier": div(h["brier_sum"], n), "average_confidence": div(h["confidence_sum"], n),
        "overconfidence": div(h["wrong_confidence_sum"], n - right),
        "underconfidence": div(h["right_doubt_sum"], right)})


@pytree_dataclass
class BinnedCalibration(Accumulator):
  """Equal-width bins of the confidence (`calibration.bin_sums`): ECE, MCE, reliability.

  `ece = Σ_b |hits_b − Σ_{i∈b} c_i| / N`, `mce = max_b |hits_b − Σ_{i∈b} c_i| / |B_b|`
  (`calibration.ece_from_bins`, `mce_from_bins`); reliability_counts / _confidence /
  _accuracy `[B]` are the per-bin count, mean confidence and accuracy.
  """
  num_bins: int = static_field()
  counts: jax.Array            # int32 [B]
  confidence_sum: jax.Array    # f32 [B]
  hits: jax.Array              # int32 [B]

  @classmethod
  def init(cls, num_bins: int = 15) -> "BinnedCalibration":
    num_bins = arrays.check_num_bins(num_bins)
    return cls(num_bins=num_bins, counts=_ZI(num_bins), confidence_sum=_ZF(num_bins),
               hits=_ZI(num_bins))

  def add(self, b: Batch) -> "BinnedCalibration":
    sums = calibration.bin_sums(b.confidence, b.correct, b.mask, self.num_bins)
    return self.replace(counts=self.counts + sums[0],
                        confidence_sum=self.confidence_sum + sums[1], hits=self.hits + sums[2])

  def compute(self) -> dict:
    """ece, mce, reliability_counts / reliability_confidence / reliability_accuracy."""
    counts, conf, hits = (to_host(x) for x in (self.counts, self.confidence_sum, self.hits))
    bins = calibration.reliability_from_bins(counts, conf, hits)
    return finish({
        "ece": calibration.ece_from_bins(conf, hits, int(counts.sum())),
        "mce": calibration.mce_from_bins(counts, conf, hits),
        "reliability_counts": counts.astype(np.int32),
        "reliability_confidence": bins.confidence, "reliability_accuracy": bins.accuracy})


@pytree_dataclass
class ClasswiseCalibration(Accumulator):
  """Per class k, equal-width bins of `p_k` against `1[y = k]` (`calibration.classwise_bin_sums`).

  classwise_ece `= mean_k Σ_b |#[y = k]_kb − Σ_{i∈b} p_ik| / N`
  (`calibration.classwise_ece_from_bins`). With `counts=True` it also keeps the number of
  samples per class and bin (for per-class reliability diagrams) and `compute()` adds
  `per_class_ece [C]` (`calibration.ece_from_bins` of each class's bins).
  """
  num_classes: int = static_field()
  num_bins: int = static_field()
  count: jax.Array                 # int32 [], valid samples
  confidence_sum: jax.Array        # f32 [C, B], Σ p_k
  hits: jax.Array                  # int32 [C, B], #[y = k]
  counts: Optional[jax.Array]      # int32 [C, B] or None

  @classmethod
  def init(cls, num_classes: int, num_bins: int = 15, *,
           counts: bool = False) -> "ClasswiseCalibration":
    shape = (arrays.check_num_classes(num_classes), arrays.check_num_bins(num_bins))
    return cls(num_classes=shape[0], num_bins=shape[1], count=_ZI(()),
               confidence_sum=_ZF(shape), hits=_ZI(shape), counts=_ZI(shape) if counts else None)

  def add(self, b: Batch) -> "ClasswiseCalibration":
    conf, hits = calibration.classwise_bin_sums(b.probs, b.labels, b.mask, self.num_bins)
    counts = self.counts
    if counts is not None:
      index = calibration.bin_index(b.probs, self.num_bins) + self.num_bins * jnp.arange(
          self.num_classes)
      weight = jnp.broadcast_to(b.valid[:, None], b.probs.shape).astype(jnp.int32)
      size = self.num_classes * self.num_bins
      counts = counts + jax.ops.segment_sum(weight.reshape(-1), index.reshape(-1),
                                            size).reshape(counts.shape)
    return self.replace(count=self.count + jnp.sum(b.valid, dtype=jnp.int32),
                        confidence_sum=self.confidence_sum + conf, hits=self.hits + hits,
                        counts=counts)

  def compute(self) -> dict:
    """classwise_ece, and per_class_ece `[C]` when the counts are kept."""
    n, conf, hits = (to_host(x) for x in (self.count, self.confidence_sum, self.hits))
    out = {"classwise_ece": calibration.classwise_ece_from_bins(conf, hits, int(n))}
    if self.counts is not None:
      out["per_class_ece"] = calibration.ece_from_bins(conf, hits, int(n))
    return finish(out)


@pytree_dataclass
class ConfusionMatrix(Accumulator):
  """`[C, C]` counts, rows = label, columns = prediction: mIoU and per-class IoU
  `TP / (TP + FP + FN)` (`segmentation.iou_from_confusion`)."""
  num_classes: int = static_field()
  confusion: jax.Array          # int32 [C, C]

  @classmethod
  def init(cls, num_classes: int) -> "ConfusionMatrix":
    num_classes = arrays.check_num_classes(num_classes)
    return cls(num_classes=num_classes, confusion=_ZI((num_classes, num_classes)))

  def add(self, b: Batch) -> "ConfusionMatrix":
    return self.replace(confusion=self.confusion + segmentation.confusion_counts(
        b.pred, b.labels, b.mask, self.num_classes))

  def compute(self) -> dict:
    """miou and per_class_iou `[C]`."""
    miou, per_class = segmentation.iou_from_confusion(jnp.asarray(np.asarray(self.confusion)))
    return finish({"miou": np.asarray(miou), "per_class_iou": np.asarray(per_class)})
