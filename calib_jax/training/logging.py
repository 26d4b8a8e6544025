"""Run logging: a progress line with step rate and ETA, JSON-lines metrics, TensorBoard, config.

Everything is written by process 0 only, under the work directory:
`config.json` (the resolved config), `metrics.jsonl` (one JSON object per logging event:
`{"step": s, "split": "train"|"val", ...}`) and TensorBoard event files in `tensorboard/`.
"""
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import jax

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
TENSORBOARD_SUBDIR = "tensorboard"


def _is_writer() -> bool:
  return jax.process_index() == 0


def format_duration(seconds: float) -> str:
  """`h:mm:ss` for a duration in seconds (`--:--:--` when unknown)."""
  if not math.isfinite(seconds) or seconds < 0:
    return "--:--:--"
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
  """A one-line progress report: `step/total [bar] rate steps/s, ETA`.

  The rate is measured over the steps of this process (excluding the first, which includes
  compilation), so a resumed run reports its own speed.
  """

  def __init__(self, total_steps: int, start_step: int = 0, *, width: int = 30,
               stream: TextIO | None = None, min_interval_s: float | None = None):
    """Args: total_steps, start_step (of a resumed run), width (characters of the bar),
    stream (default stderr), min_interval_s between redraws (default 0.5 s on a terminal,
    30 s when the stream is a file or pipe, where every redraw is a new line)."""
    self.total_steps = total_steps
    self._width = width
    self._stream = stream or sys.stderr
    if min_interval_s is None:
      min_interval_s = 0.5 if self._stream.isatty() else 30.0
    self._min_interval_s = min_interval_s
    self._first_step = None
    self._first_time = None
    self._last_print = -math.inf
    self.start_step = start_step

  def rate(self, step: int, now: float | None = None) -> float:
    """Steps per second since the first completed step of this process (nan before)."""
    now = time.monotonic() if now is None else now
    if self._first_step is None or step <= self._first_step or now <= self._first_time:
      return math.nan
    return (step - self._first_step) / (now - self._first_time)

  def line(self, step: int, extra: str = "", now: float | None = None) -> str:
    """The progress text for `step` completed steps."""
    rate = self.rate(step, now)
    eta = (self.total_steps - step) / rate if rate > 0 else math.nan
    frac = min(max(step / max(self.total_steps, 1), 0.0), 1.0)
    filled = int(frac * self._width)
    bar = "#" * filled + "." * (self._width - filled)
    rate_text = f"{rate:.2f} steps/s" if math.isfinite(rate) else "-- steps/s"
    text = f"{step}/{self.total_steps} [{bar}] {rate_text}, ETA {format_duration(eta)}"
    return f"{text} {extra}".rstrip()

  def update(self, step: int, extra: str = "", force: bool = False) -> None:
    """Records that `step` steps are done and redraws at most every `min_interval_s`."""
    now = time.monotonic()
    if self._first_step is None:
      self._first_step, self._first_time = step, now
    if not _is_writer() or (not force and now - self._last_print < self._min_interval_s):
      return
    self._last_print = now
    end = "\n" if force or not self._stream.isatty() else "\r"
    self._stream.write(self.line(step, extra, now) + end)
    self._stream.flush()


def _scalar_metadata():
  """Summary metadata marking a float tensor as a TensorBoard scalar.

  tensorflow-cpu ships without the `tensorboard` package that `tf.summary.scalar` delegates to;
  this is the metadata that function writes (plugin 'scalars', empty content), so the event files
  are the same and TensorBoard shows them.
  """
  from tensorflow.core.framework import summary_pb2
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


class MetricWriter:
  """Appends scalar metrics to `metrics.jsonl` and to TensorBoard summaries."""

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    self._path = os.path.join(workdir, METRICS_FILE)
    self._tb_writer = None
    if _is_writer():
      os.makedirs(workdir, exist_ok=True)
      if tensorboard:
        import tensorflow as tf  # Deferred: TensorFlow is slow to import and only logs here.
        self._tb_writer = tf.summary.create_file_writer(os.path.join(workdir, TENSORBOARD_SUBDIR))

  def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
    """Writes one record: `{"step": step, "split": split, **metrics}`; scalars only."""
    if not _is_writer():
      return
    scalars = {k: float(v) for k, v in metrics.items()}
    with open(self._path, "a") as f:
      f.write(json.dumps({"step": int(step), "split": split, **scalars}) + "\n")
    if self._tb_writer is not None:
      import tensorflow as tf
      with self._tb_writer.as_default(step=int(step)):
        for k, v in scalars.items():
          tf.summary.write(f"{split}/{k}", tf.constant(v, tf.float32), metadata=_scalar_metadata())
      self._tb_writer.flush()

  def close(self) -> None:
    """Flushes and closes the TensorBoard writer."""
    if self._tb_writer is not None:
      self._tb_writer.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of a run's `metrics.jsonl`, in order."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def save_config(config: Any, workdir: str) -> str:
  """Writes the resolved config as `config.json` in the work directory; returns the path."""
  path = os.path.join(workdir, CONFIG_FILE)
  if _is_writer():
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  return path
