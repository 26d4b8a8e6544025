"""Evaluation under distribution shift, an evaluator: `ShiftReport(experiment, split, ...)`.

`eval.py --shift=SPEC` (`config.eval.shift`; syntax: `shift.parse_spec`) evaluates the report
split under each cell of the shift, a corruption at a severity (Hendrycks & Dietterich, ICLR
2019) or a rotation angle (Ovadia et al., NeurIPS 2019):

1. the temperature T (`posthoc.fit_temperature`) and each calibrator of `eval.calibrators`
   (`posthoc.fit_calibrator`; classification) are fitted ONCE, on the clean fit split's logits
   (the sibling `CalibrationReport`'s, or an ensemble's `log p̄`), and reused for every cell;
2. each cell is one compiled program (`step.make_shifted_predict_fn`): the clean stream's uint8
   images (the data option `raw_images`) are corrupted ON THE DEVICE (`shift.corrupt`; its
   `jpeg_compression` runs on the host through a callback) or rotated, normalised as the
   pipeline does, and run through the model (or an ensemble's stacked members); no corrupted
   copy is written. Stored corrupted sets (`dataset:NAME`) are read as they are;
3. per cell and METHOD (`pre_temperature`, `post_temperature`, each calibrator; ensembles also
   `mean_member`, the members' own pre-temperature metrics averaged, classification) the
   METRICS `accuracy`, `ece`, `aece`, `nll`, `brier`, `aurc`: classification from the cell's
   logits with the metric functions of `calib_jax.metrics`; segmentation per pixel from the
   streaming accumulators (`validation.accumulators`), the label maps left as they are,
   pre/post T only.

Each finished cell is saved to `shift_progress.json` in the evaluation directory, keyed by the
run (checkpoint step or weight file, members, the config but `eval.shift`, table, split): an
interrupted evaluation keeps its cells and the rerun computes only the others
(`shift_progress`). `results_dict` assembles the `shift` entry of metrics.json (docs/shift.md).
"""
import functools
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from calib_jax import data as data_lib
from calib_jax import ensemble, metrics, posthoc, shift
from calib_jax.evaluation import shift_progress as progress
from calib_jax.evaluation import validation
from calib_jax.experiment import Experiment
from calib_jax.shift import core as shift_core
from calib_jax.training import reporting
from calib_jax.training import step as step_lib

METRICS = ("accuracy", "ece", "aece", "nll", "brier", "aurc")
CLEAN = "clean"


def default_table(dataset: str, image_hw: tuple[int, int]) -> str:
  """The corruption table of a dataset when `eval.shift_table` is '': Tiny-ImageNet-C's for
  tiny_imagenet, CIFAR-10-C's for images of at most 32 px, else ImageNet-C's (the library's
  default, applied to any size as the reference does)."""
  if dataset == "tiny_imagenet":
    return "tiny_imagenet"
  return "cifar10" if max(image_hw) <= 32 else "imagenet"


def table_for(experiment: Experiment) -> str:
  """The table of the experiment's `eval.shift`: `eval.shift_table`, else `default_table` of
  its dataset and input size; 'dataset:NAME' for stored corrupted images."""
  spec = shift.parse_spec(experiment.config.eval.shift)
  if spec.kind == "dataset":
    return f"dataset:{spec.dataset}"
  image_hw = data_lib.PipelineOptions.create(
      experiment.meta, experiment.data.config.options.to_dict()).image_hw(experiment.meta)
  return experiment.config.eval.shift_table or default_table(experiment.meta.name, image_hw)


def shift_images_fn(name: str, severity: int, table: str) -> step_lib.ShiftImages:
  """`shift_images(images, key, param)` of a cell of `make_shifted_predict_fn`: the identity
  ('clean', and stored corrupted sets), a rotation by the traced angle ('rotate'), or the
  corruption `name` at `severity` from `table`."""
  if name == CLEAN or table.startswith("dataset:") or name in shift_core.HOST_CORRUPTIONS:
    return _identity  # host corruptions: `ShiftReport._host_shifted` before the program
  if name == "rotate":
    return _rotated
  return _corrupted(name, severity, table)


def _identity(images: jax.Array, key: jax.Array, param: jax.Array) -> jax.Array:
  del key, param
  return images


def _rotated(images: jax.Array, key: jax.Array, angle: jax.Array) -> jax.Array:
  del key
  return shift.rotate(images, angle)


def _corrupted(name: str, severity: int, table: str) -> step_lib.ShiftImages:
  def corrupted(images, key, param):
    del param
    return shift.corrupt(images, name, severity, key=key, table=table)
  return corrupted


@functools.partial(jax.jit, static_argnames="num_bins")
def cell_metrics(probs: jax.Array, labels: jax.Array, num_bins: int) -> dict[str, jax.Array]:
  """`METRICS` of probabilities `[N, C]` against labels `[N]` (the AURC of the maximum
  probability), each by its function of `calib_jax.metrics`."""
  confidence, correct = metrics.confidence_and_correct(probs, labels)
  return {"accuracy": metrics.accuracy(probs, labels),
          "ece": metrics.ece(probs, labels, num_bins), "aece": metrics.aece(probs, labels, num_bins),
          "nll": metrics.nll(probs, labels), "brier": metrics.brier(probs, labels),
          "aurc": metrics.aurc(confidence, correct)}


def _floats(values: Mapping[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(dict(values)).items()}


class ShiftReport:
  """The shift evaluation of one split (see the module docstring): `run(variables)` returns
  `{"shift": results_dict(...)}`, `write(out_dir)` the progress file's path.

  Args:
    experiment: the run's `Experiment`; `experiment.config.eval.shift` is the spec.
    split: the report split ('test').
    fit_samples: returns the clean fit split's `{"logits": [N, C] (or stacked [M, N, C]),
      "labels": [N]}` on the host when `run` is called (`CalibrationReport.fit_samples`).
    stacked: the variables are M members stacked (`eval.py --shift --ensemble`).
    progress_dir: where `shift_progress.json` lives (None: not resumable).
    run_key: what identifies the evaluated weights (checkpoint step, weight file, members).
  """

  def __init__(self, experiment: Experiment, split: str = "test", *,
               fit_samples: Callable[[], Mapping[str, np.ndarray]], stacked: bool = False,
               progress_dir: str | None = None, run_key: Mapping[str, Any] | None = None):
    self.experiment, self.split, self.stacked = experiment, split, stacked
    self.settings = experiment.config.eval
    self.spec = shift.parse_spec(self.settings.shift)
    self.table = table_for(experiment)
    self._fit_samples = fit_samples
    self.segmentation = experiment.meta.task == "segmentation"
    statistics = experiment.data.input_statistics()
    self._program = functools.partial(step_lib.make_shifted_predict_fn, experiment.model,
                                      experiment.mesh, mean=statistics[0], std=statistics[1],
                                      stacked=stacked)
    self._programs: dict[tuple[str, int], Callable] = {}
    self.progress_path = None if progress_dir is None else progress.path(progress_dir)
    self.run_key = progress.run_key(experiment.config, {
        **dict(run_key or {}), "split": split, "table": self.table, "stacked": stacked})

  def _predict(self, name: str, severity: int) -> Callable:
    """The compiled program of a cell (one per corruption and severity; one for all angles)."""
    shift_images = shift_images_fn(name, severity, self.table)
    # One program serves every cell of the identity (clean, stored sets) and every angle.
    key = (shift_images.__name__, 0) if shift_images in (_identity, _rotated) else (name,
                                                                                    severity)
    if key not in self._programs:
      self._programs[key] = self._program(shift_images)
    return self._programs[key]

  def _stream(self, name: str, severity: int):
    data, e = self.experiment.data, self.settings
    if self.spec.kind == "dataset" and name != CLEAN:
      return data.corrupted_stream(self.spec.dataset, name, severity, self.experiment.mesh,
                                   max_examples=e.max_examples)
    return data.eval_stream(self.split, self.experiment.mesh, max_examples=e.max_examples,
                            raw_images=True)

  def _fit(self) -> tuple[float, dict[str, posthoc.Calibrator]]:
    """T and the calibrators, fitted on the clean fit split's logits (an ensemble's `log p̄`)."""
    samples = self._fit_samples()
    logits = np.asarray(samples["logits"], np.float32)
    if self.stacked:
      logits = np.asarray(ensemble.ensemble_log_probs(logits))
    labels = np.asarray(samples["labels"]).astype(np.int32)
    temperature = float(posthoc.fit_temperature(logits, labels))
    calibrators = {}
    if not self.segmentation:
      for name in self.settings.calibrators:
        try:
          calibrators[name] = posthoc.fit_calibrator(name, jnp.asarray(logits),
                                                     jnp.asarray(labels))
        except posthoc.TooFewSamplesError as e:
          reporting.warn(f"shift: calibrator {name} left out: {e}")
    return temperature, calibrators

  def _logits(self, variables: Any, name: str, severity: int):
    """The cell's member-stacked logits `[M, N, C]` (M = 1 for one model) and labels `[N]`."""
    logits, labels = [], []
    for batch, out in self._predictions(variables, name, severity):
      out = validation.to_host(out)
      valid = validation.to_host(batch["mask"]).astype(bool)
      logits.append((out if self.stacked else out[None])[:, valid])
      labels.append(validation.to_host(batch["label"])[valid])
    return np.concatenate(logits, axis=1), np.concatenate(labels).astype(np.int32)

  def _predictions(self, variables: Any, name: str, severity: int):
    """The cell's batches with the program's logits on them (on the device): each batch's key
    folded from the cell's, host corruptions applied before the program."""
    predict, key, param = self._cell_inputs(name, severity)
    for i, batch in enumerate(self._stream(name, severity)):
      batch_key = jax.random.fold_in(key, i)
      batch = self._host_shifted(batch, name, severity, batch_key)
      yield batch, predict(variables, batch, batch_key, param)

  def _host_shifted(self, batch: dict[str, jax.Array], name: str, severity: int,
                    key: jax.Array) -> dict[str, jax.Array]:
    """`batch` with a host corruption (`jpeg_compression`, Pillow's codec) applied to its whole
    global batch of images by `shift.corrupt` on one device, then sharded again; other cells'
    batches as they are. (Inside the sharded program, the callback stalls the other devices'
    collectives: XLA:CPU aborted with 8 devices.)"""
    if name not in shift_core.HOST_CORRUPTIONS:
      return batch
    images = np.asarray(shift.corrupt(validation.to_host(batch["image"]), name, severity,
                                      key=key, table=self.table))
    sharding = batch["image"].sharding
    return {**batch, "image": jax.make_array_from_callback(images.shape, sharding,
                                                           lambda index: images[index])}

  def _cell_inputs(self, name: str, severity: int):
    """The cell's program, its key (the same for a cell however the cells are ordered or
    resumed) and its traced parameter (the angle)."""
    cell_id = zlib.crc32(f"{name}/{severity}".encode())
    key = jax.random.fold_in(jax.random.key(self.experiment.config.seed), cell_id)
    param = jnp.float32(severity if name == "rotate" else 0)
    return self._predict(name, severity), key, param

  def _cell(self, variables: Any, name: str, severity: int, temperature: float,
            calibrators: Mapping[str, posthoc.Calibrator]) -> dict[str, dict[str, float]]:
    """`{METHOD: {METRIC: value}}` of one cell."""
    if self.segmentation:
      return self._segmentation_cell(variables, name, severity, temperature)
    stacked, labels = self._logits(variables, name, severity)
    logits = (np.asarray(ensemble.ensemble_log_probs(stacked)) if self.stacked
              else stacked[0])
    x, y, bins = jnp.asarray(logits), jnp.asarray(labels), self.settings.num_bins
    out = {"pre_temperature": _floats(cell_metrics(jax.nn.softmax(x, -1), y, bins)),
           "post_temperature": _floats(cell_metrics(jax.nn.softmax(x / temperature, -1), y,
                                                    bins))}
    for method, calibrator in calibrators.items():
      out[method] = _floats(cell_metrics(calibrator(x), y, bins))
    if self.stacked:  # each member's own metrics, averaged: the mean member
      members = [_floats(cell_metrics(jax.nn.softmax(jnp.asarray(m), -1), y, bins))
                 for m in stacked]
      out["mean_member"] = {k: float(np.mean([m[k] for m in members])) for k in METRICS}
    return out

  def _segmentation_cell(self, variables: Any, name: str, severity: int,
                         temperature: float) -> dict[str, dict[str, float]]:
    """Per-pixel metrics of a cell from the streaming accumulators (the label maps as they
    are): before and after T."""
    meta, bins = self.experiment.meta, self.settings.num_bins
    acc = {m: validation.accumulators(meta, bins, classwise=False, histogram=True)
           for m in ("pre_temperature", "post_temperature")}
    for batch, logits in self._predictions(variables, name, severity):
      if self.stacked:
        logits = ensemble.ensemble_log_probs(logits)
      for method, t in (("pre_temperature", 1.0), ("post_temperature", temperature)):
        acc[method] = acc[method].update(logits=logits / t, labels=batch["label"],
                                         mask=batch["mask"])
    return {m: {k: float(v) for k, v in a.result(risks=(), coverages=()).items() if k in METRICS}
            for m, a in acc.items()}

  def run(self, variables: Any) -> dict[str, Any]:
    """`{"shift": results_dict(...)}` of `variables` (see the module docstring); cells already
    in the progress file for the same run are read from it, not computed."""
    temperature, calibrators = self._fit()
    cells = [(CLEAN, 0)] + self.spec.cells()
    done = progress.load(self.progress_path, self.run_key)
    todo = [c for c in cells if progress.cell_name(*c) not in done]
    logging.info("shift %s: %d cells, %d from %s", self.settings.shift, len(cells),
                 len(cells) - len(todo), self.progress_path)
    bar = (reporting.ProgressBar(len(cells), len(cells) - len(todo), min_interval_s=0.0,
                                 unit="cells")
           if self.experiment.config.progress_bar else None)
    try:
      for name, severity in todo:
        label = progress.cell_name(name, severity)
        done[label] = self._cell(variables, name, severity, temperature, calibrators)
        if jax.process_index() == 0:
          progress.save(self.progress_path, self.run_key, done)
        logging.info("shift cell %s: %s", label, done[label]["pre_temperature"])
        if bar is not None:
          bar.update(len([c for c in cells if progress.cell_name(*c) in done]),
                     extra=f" {label}", force=True)
    finally:
      if bar is not None:
        bar.close()
    return {"shift": results_dict(self.spec, self.table, done)}

  def write(self, out_dir: str) -> dict[str, str]:
    """The progress file's path (the results themselves go to metrics.json)."""
    del out_dir
    return {} if self.progress_path is None else {"shift_progress": self.progress_path}


def results_dict(spec: shift.ShiftSpec, table: str,
                 cells: Mapping[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
  """The `shift` entry of metrics.json from the cells' `{METHOD: {METRIC: value}}`:
  `table`, `kind`, `clean`, and `corruptions` ({NAME: {"severity": ...}}) with `summary`
  ({METHOD: {"severity": {METRIC: mean over the corruptions}}}, Uncertainty Baselines' cA /
  cECE / cNLL per severity), or `rotate` ({"angle": ...})."""
  out: dict[str, Any] = {"table": table, "clean": cells[CLEAN]}
  if spec.kind == "rotate":
    out.update(kind="rotate", rotate={str(a): cells[progress.cell_name("rotate", a)]
                                      for a in spec.angles})
    return out
  grid = {name: {str(s): cells[progress.cell_name(name, s)] for s in spec.severities}
          for name in spec.corruptions}
  methods = list(cells[CLEAN])
  summary = {m: {str(s): {k: float(np.mean([grid[n][str(s)][m][k] for n in spec.corruptions]))
                          for k in METRICS}
                 for s in spec.severities} for m in methods}
  out.update(kind="corruptions", corruptions=grid, summary=summary)
  return out


def format_lines(results: Mapping[str, Any]) -> list[str]:
  """The console table of `results["shift"]`: a row per severity (the clean split first; the
  summary's means over the corruptions) or per angle, with accuracy, ECE and NLL before and
  after temperature scaling (none without a shift)."""
  part = results.get("shift")
  if not part:
    return []
  if part["kind"] == "rotate":
    rows = {"clean": part["clean"], **{f"{a} deg": v for a, v in part["rotate"].items()}}
    title = "rotated images (Ovadia et al. 2019)"
  else:
    rows = {"clean": part["clean"]}
    rows.update({f"severity {s}": {m: per[s] for m, per in part["summary"].items()}
                 for s in next(iter(part["summary"].values()))})
    title = (f"{len(part['corruptions'])} corruption(s), table {part['table']}: cA / cECE / "
             "cNLL are means over the corruptions")
  columns = [("acc", "accuracy"), ("ECE", "ece"), ("NLL", "nll")]
  header = f"{'':<14}" + "".join(f"{name + ' ' + when:>11}" for name, _ in columns
                                 for when in ("PreT", "PosT"))
  lines = ["", f"under shift: {title}", header]
  for label, methods in rows.items():
    lines.append(f"{label:<14}" + "".join(
        f"{methods[method][key]:>11.4f}" for _, key in columns
        for method in ("pre_temperature", "post_temperature")))
  return lines
