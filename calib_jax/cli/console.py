"""A quiet console for `train.py`, `eval.py` and the demo: library logs go to `<workdir>/log.txt`.

The console shows a progress bar per run and the results; what TensorFlow, tfds, orbax, jax and
absl log at INFO/WARNING (checkpoint option dumps, dataset construction, backend probing,
Python warnings) goes to the run's log file instead. absl's own flags bring it back:
`--verbosity=0` (or `-v 0`; `-v 1` adds DEBUG) mirrors the log lines on stderr,
`--alsologtostderr` too, `--logtostderr` sends them to stderr only.

Entry points call `quiet_native_logs(sys.argv)` first, before anything imports TensorFlow: it
sets `TF_CPP_MIN_LOG_LEVEL=2` (TensorFlow's and XLA's C++ INFO/WARNING lines), which only works
before TensorFlow is imported, and imports TensorFlow with stderr (file descriptor 2) sent to a
buffer that `setup` copies into the log: TensorFlow 2.19+ prints its import-time lines (oneDNN,
CPU features) through absl's C++ log before it reads TF_CPP_MIN_LOG_LEVEL; that import leaves
out the Keras that TensorFlow imports eagerly (the programs use tf.data only). One of the flags
above on the command line skips all of this. Importing this module does none of it.
"""
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

from absl import flags
from absl import logging as absl_logging

LOG_FILE = "log.txt"
# absl's flags that ask for log lines on the console.
_LOG_FLAGS = ("--verbosity", "-v", "--v", "-verbosity", "--alsologtostderr", "--logtostderr")


def asks_for_logs(argv: list[str]) -> bool:
  """Whether a command line (program name first) has a flag that asks for logs on stderr."""
  return any(arg.split("=", 1)[0] in _LOG_FLAGS for arg in argv[1:])


# TensorFlow's import also imports Keras (`keras.src.optimizers`, eagerly, to register Keras'
# optimizers for SavedModels), and Keras imports matplotlib.pyplot, scikit-learn and SciPy's
# statistics: ~2.7 of the ~8.4 CPU-s of importing TensorFlow, for nothing the programs use
# (tf.data only). Marked missing in `sys.modules` during the import, that module fails to import
# and TensorFlow goes on without it; the mark is removed after, so a later `import keras` works.
_KERAS_EAGER_IMPORT = "keras.src.optimizers"

_import_log = ""  # What TensorFlow's import printed on stderr; `setup` writes it to the log.
_log_stream = None  # The log file `setup` opened last.


def quiet_native_logs(argv: list[str], import_tensorflow: bool = True) -> None:
  """Silences TensorFlow's and XLA's C++ INFO/WARNING lines: TF_CPP_MIN_LOG_LEVEL, then imports
  TensorFlow with stderr captured (a failing import shows the captured text and raises).
  `import_tensorflow=False` (a program that reads no dataset) sets the variable only."""
  global _import_log
  if asks_for_logs(argv) or "tensorflow" in sys.modules:
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if not import_tensorflow:
    return
  sys.stderr.flush()
  with tempfile.TemporaryFile() as buffer:
    saved = os.dup(2)
    os.dup2(buffer.fileno(), 2)
    try:
      _import_tensorflow_without_keras()
      failed = False
    except BaseException:
      failed = True
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      buffer.seek(0)
      _import_log = buffer.read().decode("utf-8", errors="replace")
      if failed:  # A broken install: its messages belong on the console.
        sys.stderr.write(_import_log)


@contextlib.contextmanager
def keras_left_out() -> Iterator[None]:
  """While open, an `import tensorflow` leaves out the Keras that TensorFlow imports eagerly
  (`_KERAS_EAGER_IMPORT` is marked not importable, and TensorFlow goes on without it); once
  closed, a later `import keras` works."""
  marked = _KERAS_EAGER_IMPORT not in sys.modules
  if marked:
    sys.modules[_KERAS_EAGER_IMPORT] = None  # "not importable": TensorFlow skips it
  try:
    yield
  finally:
    if marked and sys.modules.get(_KERAS_EAGER_IMPORT, False) is None:
      del sys.modules[_KERAS_EAGER_IMPORT]


def _import_tensorflow_without_keras() -> None:
  """Imports TensorFlow, leaving out the Keras import it makes eagerly (`keras_left_out`)."""
  try:
    with keras_left_out():
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    # A TensorFlow that no longer tolerates the missing module (today's wraps its import in
    # `try/except ImportError`, as for an install without Keras): imported whole instead.
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name


def setup(workdir: str, verbosity: int | None = None, datasets: bool = True) -> str:
  """Sends Python/absl logging to `<workdir>/log.txt` (appending) and returns that path.

  Args:
    workdir: the run's work directory (created if missing).
    verbosity: absl verbosity (0 INFO, 1 DEBUG, -1 WARNING) to mirror on stderr as well; None
      for a quiet console, or (after absl flag parsing) what `--verbosity`/`-v` says if given.
    datasets: whether the program reads datasets (tfds' progress bars are then turned off);
      False leaves tensorflow_datasets unimported (`eval.py --predictions`).

  Returns:
    The log file's path.
  """
  flag_values = flags.FLAGS
  if not flag_values.is_parsed():  # Not an absl app (the demo, a notebook): absl defaults.
    flag_values.mark_as_parsed()
  if verbosity is None and flag_values["verbosity"].present:
    verbosity = flag_values.verbosity
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOG_FILE)
  absl_logging.use_absl_handler()  # Root handler: also takes jax's and urllib3's loggers.
  handler = absl_logging.get_absl_handler().python_handler
  global _import_log, _log_stream
  stream = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
  stream.write(_import_log)
  _import_log = ""
  if handler.setStream(stream) is _log_stream and _log_stream is not None:
    _log_stream.close()  # An earlier setup's file (another run in this process).
  _log_stream = stream
  absl_logging.set_verbosity(absl_logging.INFO if verbosity is None else verbosity)
  if verbosity is not None:
    flag_values.alsologtostderr = True
  logging.captureWarnings(True)  # warnings.warn (jax, tf, numpy) -> the log, not stderr.
  if datasets and verbosity is None and not flag_values.logtostderr:
    import tensorflow_datasets as tfds  # The pipeline imports it anyway.
    tfds.disable_progress_bar()  # 'Generating splits...' bars of a first preparation.
  return path
