"""Run reporting: a tqdm progress line, JSON-lines metrics, TensorBoard scalars, the config.

Everything is written by process 0 only, under the work directory:
`config.json` (the resolved config), `metrics.jsonl` (one JSON object per logging event:
`{"step": s, "split": "train"|"val", ...}`) and TensorBoard event files in `tensorboard/`.
"""
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, TextIO

import jax
import tqdm
from absl import flags, logging

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
TENSORBOARD_SUBDIR = "tensorboard"


def _is_writer() -> bool:
  return jax.process_index() == 0


def warn(line: str) -> None:
  """A warning for the user: logged, and on process 0 also one line on stderr (unless absl
  already mirrors its log there, e.g. `--alsologtostderr`, or the console is not set up)."""
  logging.warning("%s", line)
  mirrored = any(flags.FLAGS[name].value for name in ("alsologtostderr", "logtostderr"))
  if _is_writer() and not mirrored:
    print(f"warning: {line}", file=sys.stderr, flush=True)


class _LineTqdm(tqdm.tqdm):
  """tqdm that writes every redraw as a line of its own.

  A file or pipe cannot be redrawn in place with '\\r', so each redraw becomes one log line.
  """

  def display(self, msg: str | None = None, pos: int | None = None) -> bool:
    """Writes `msg` (default: the current bar) and a newline; nothing for tqdm's clear-line."""
    del pos
    if msg == "":  # tqdm clears a terminal line on close(leave=False); a log keeps its lines.
      return False
    self.fp.write((self.__str__() if msg is None else msg) + "\n")
    self.fp.flush()
    return True


class ProgressBar:
  """A one-line progress report, `step/total [bar] rate steps/s, ETA [h:]mm:ss, extra`, on tqdm.

  The rate is the average over the steps of this process after the first one it completes
  (which includes compilation): the tqdm bar is opened at that first update, starting from its
  step, so a resumed run shows its own speed, not one diluted by the restored steps.
  """

  def __init__(self, total_steps: int, start_step: int = 0, *, width: int = 30,
               stream: TextIO | None = None, min_interval_s: float | None = None,
               unit: str = "steps"):
    """Args: total_steps, start_step (where a resumed run starts; the bar itself starts at
    the step of the first `update`, one past it in the loop), width (characters of the bar),
    stream (default stderr), min_interval_s between redraws (default 0.5 s on a terminal,
    30 s when the stream is a file or pipe, where every redraw is a new line), unit (what is
    counted, e.g. an evaluation's cells)."""
    self.total_steps = total_steps
    self.start_step = start_step
    self._width = width
    self._stream = stream or sys.stderr
    self._isatty = self._stream.isatty()
    if min_interval_s is None:
      min_interval_s = 0.5 if self._isatty else 30.0
    self._min_interval_s = min_interval_s
    self._bar: tqdm.tqdm | None = None
    self._unit = unit

  def _open(self, step: int, extra: str) -> tqdm.tqdm:
    bar_class = tqdm.tqdm if self._isatty else _LineTqdm
    return bar_class(
        total=self.total_steps, initial=step, postfix=extra or None, file=self._stream,
        unit=f" {self._unit}",
        bar_format=("{n_fmt}/{total_fmt} [{bar:%d}] {rate_noinv_fmt}, ETA {remaining}{postfix}"
                    % self._width),
        ascii=".#", mininterval=self._min_interval_s,
        # miniters=1 turns off tqdm's adaptive skipping and its monitor thread's redraws, so
        # mininterval alone decides when to redraw; smoothing=0 reports the average rate.
        miniters=1, smoothing=0.0, leave=self._isatty, dynamic_ncols=False)

  def update(self, step: int, extra: str = "", force: bool = False) -> None:
    """Records that `step` steps are done and redraws at most every `min_interval_s`.

    Args:
      step: steps completed so far (absolute, including those of a restored run).
      extra: text shown after the ETA (e.g. the loss).
      force: redraw now regardless of the interval (e.g. the last step).
    """
    if not _is_writer():
      return
    if self._bar is None:
      self._bar = self._open(step, extra)  # Draws the first line (rate unknown yet).
    self._bar.set_postfix_str(extra, refresh=False)
    if force:  # Set and redraw once (tqdm's update could draw this step a second time).
      self._bar.n = step
      self._bar.refresh()
    else:
      self._bar.update(step - self._bar.n)  # tqdm redraws when min_interval_s has passed.

  def write(self, line: str) -> None:
    """Prints a result line on stdout, above the bar on a terminal (process 0 only)."""
    if not _is_writer():
      return
    if self._isatty:
      tqdm.tqdm.write(line, file=sys.stdout)  # Clears the bar, writes, redraws it.
    else:  # Every redraw is a line of its own: nothing to clear.
      print(line, file=sys.stdout)
    sys.stdout.flush()

  def close(self) -> None:
    """Ends the bar: on a terminal, a final line with the overall rate and a newline."""
    if self._bar is not None:
      self._bar.close()
      self._bar = None


class MetricWriter:
  """Appends scalar metrics to `metrics.jsonl` and to TensorBoard summaries (clu)."""

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    self._path = os.path.join(workdir, METRICS_FILE)
    self._tb_writer = None
    if _is_writer():
      os.makedirs(workdir, exist_ok=True)
      if tensorboard:
        # Deferred: clu's TensorBoard writer imports TensorFlow, which is slow to import.
        from clu import metric_writers
        self._tb_writer = metric_writers.SummaryWriter(
            os.path.join(workdir, TENSORBOARD_SUBDIR))

  def write(self, step: int, split: str, metrics: Mapping[str, Any], *,
            tags: Mapping[str, Any] | None = None) -> None:
    """Writes one record: `{"step": step, "split": split, **tags, **metrics}`; scalar metrics.

    `tags` name a sweep member (`{"member": i, "overrides": {...}}`); its TensorBoard scalars
    are `member<i>/<split>/<name>`.
    """
    if not _is_writer():
      return
    scalars = {k: float(v) for k, v in metrics.items()}
    tags = dict(tags or {})
    with open(self._path, "a") as f:
      f.write(json.dumps({"step": int(step), "split": split, **tags, **scalars}) + "\n")
    if self._tb_writer is not None:
      prefix = f"member{tags['member']}/" if "member" in tags else ""
      self._tb_writer.write_scalars(
          int(step), {f"{prefix}{split}/{k}": v for k, v in scalars.items()})
      self._tb_writer.flush()  # TensorBoard shows a running job's progress.

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


class WorkdirError(OSError):
  """The work directory cannot be created or written."""


def check_workdir(workdir: str) -> None:
  """Raises `WorkdirError` (one line) unless `workdir` exists or can be made, and a file can be
  written in it: called before anything is built, so a bad path fails at once."""
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir, prefix=".write_test_"):
      pass
  except OSError as e:
    raise WorkdirError(f"work directory {workdir} is not writable "
                       f"({e.strerror or type(e).__name__}: {e.filename or workdir})") from None


def save_config(config: Any, workdir: str) -> str:
  """Writes the resolved config as `config.json` in the work directory; returns the path."""
  path = os.path.join(workdir, CONFIG_FILE)
  if _is_writer():
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  return path
