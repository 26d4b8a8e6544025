"""Evaluates a trained run: calibration and selective-classification metrics, before and after
temperature scaling, written to `<workdir>/eval_<split>/metrics.json` with plots.

    calib-jax-eval --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls \\
        [--split=test] [--step=N]

(`python eval.py ...` in a source checkout, `python -m calib_jax.cli.evaluate ...` anywhere.)
With `--predictions=FILE.npz` any model's logits are evaluated instead (no config or model):
post-hoc calibrators, bootstrap intervals, conformal sets, failure and OOD detection
(`evaluation.predictions`), written to `<workdir>/eval_predictions/`. A trained run's report
carries the same toolkit (`config.eval.toolkit`, `config.eval.calibrators`); `--ood=SET` adds
OOD detection against the test split; `--shift=all` (or `NAME[,NAME][:SEVERITIES]`, `rotate`,
`dataset:NAME`) adds the report under corruptions or rotations (`evaluation.shift`), resumable.
With `--ensemble` (a sweep's run) the sweep's members (`--members=0,2,4`, or the greedy best K
with `--ensemble_greedy=K`) are evaluated as one ensemble, their softmax probabilities averaged
(`evaluation.run.evaluate_ensemble`), written to `<workdir>/eval_<split>/ensemble/`.
With `--weights=FILE` (our variables file, or a torchvision / torch-uncertainty / timm
.pth/.pt/.bin/.ckpt/.safetensors state dict or Lightning checkpoint of the config's model)
those weights are evaluated instead of a checkpoint: no training run is needed, the workdir
only receives the results.

Without `--config`, the run's own `<workdir>/config.json` (saved by train.py) is used, so the
report names the loss, model and sweep the run was trained with; a `--config` whose model does
not fit the checkpoint is refused in one line naming the differing fields.
The console shows the results table; library logs go to `<workdir>/log.txt` (`--verbosity=0`
or `--alsologtostderr` shows them on stderr as well).
"""
import os
import sys

from absl import app, logging
from absl import flags as absl_flags

from calib_jax.cli import compilation_cache, console, flags
from calib_jax.config import ConfigError

_SPLIT = absl_flags.DEFINE_enum("split", "test", ["test", "val"], "Split to report.")
_STEP = absl_flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: newest).")
_MEMBER = absl_flags.DEFINE_string(
    "member", None, "For a sweep's run (config.sweep): the member to evaluate (0-based index) "
    "or 'all' (the default for a sweep); results go to <workdir>/eval_<split>/member<i>/.")
_ENSEMBLE = absl_flags.DEFINE_boolean(
    "ensemble", False, "For a sweep's run: evaluate its members as one ensemble (their softmax "
    "probabilities averaged; the members' forward passes as one program): the ensemble's "
    "report, each member and the mean member, and the ensemble's uncertainty scores; results in "
    "<workdir>/eval_<split>/ensemble/.")
_MEMBERS = absl_flags.DEFINE_string(
    "members", None, "With --ensemble: the members of the ensemble, e.g. 0,2,4 (default: all).")
_ENSEMBLE_GREEDY = absl_flags.DEFINE_integer(
    "ensemble_greedy", None, "With --ensemble: the greedy best-K ensemble, the K distinct "
    "members (of --members) chosen one by one by the fit split's NLL of their average "
    "(Caruana et al. 2004).", lower_bound=1)
_PREDICTIONS = absl_flags.DEFINE_string(
    "predictions", None, "An .npz of any model's predictions (arrays val_logits, val_labels, "
    "test_logits, test_labels; optional ood_logits) to evaluate instead of a run: no config or "
    "model; results in <workdir>/eval_predictions/.")
_OOD = absl_flags.DEFINE_string(
    "ood", None, "Out-of-distribution set for the toolkit's OOD detection (config.eval.ood): "
    "'context' (objects removed; datasets with boxes), a split of the dataset, or "
    "'DATASET:SPLIT' of another registered dataset, e.g. --ood=mnist:test for Fashion-MNIST.")
_BOOTSTRAP = absl_flags.DEFINE_integer(
    "bootstrap_samples", None, "Resamples of the toolkit's 95 % bootstrap intervals (default: "
    "config.eval.bootstrap_samples; 1000 with --predictions); 0 = no intervals, faster on a CPU.",
    lower_bound=0)
_SHIFT = absl_flags.DEFINE_string(
    "shift", None, "Also evaluate under distribution shift (config.eval.shift): 'all' (the 15 "
    "benchmark corruptions, severities 1-5), 'NAME[,NAME][:SEVERITIES]' (e.g. "
    "gaussian_noise,fog:1,3,5), 'rotate' (0-180 degrees) or 'dataset:NAME' (stored corrupted "
    "images); the test images are corrupted on the device, T and the calibrators fitted on the "
    "clean fit split; resumable (shift_progress.json). Table: config.eval.shift_table.")
_WEIGHTS = absl_flags.DEFINE_string(
    "weights", None, "Weight file to evaluate instead of the workdir's checkpoint: our variables "
    "file or a PyTorch .pth/.pt/.bin/.ckpt/.safetensors state dict (or Lightning checkpoint) of "
    "the config's model.")


def main(argv: list[str]) -> None:
  """absl's main: restores the checkpoint (or reads --weights), writes metrics and plots,
  prints a summary."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _WEIGHTS.value and _STEP.value is not None:
    raise app.UsageError("--step picks a checkpoint; it cannot go with --weights")
  if not _ENSEMBLE.value and (_MEMBERS.value is not None or _ENSEMBLE_GREEDY.value is not None):
    raise app.UsageError("--members and --ensemble_greedy choose an ensemble's members; they "
                         "need --ensemble")
  if _ENSEMBLE.value and (_WEIGHTS.value or _MEMBER.value is not None or _PREDICTIONS.value):
    raise app.UsageError("--ensemble evaluates a sweep's checkpoint; it cannot go with "
                         "--weights, --member or --predictions (pick members with --members)")
  workdir = flags.workdir()
  if _PREDICTIONS.value:
    _evaluate_predictions(_PREDICTIONS.value, workdir)
    return
  # Function-level imports: a predictions file (above) needs none of the data pipeline's
  # TensorFlow and tensorflow_datasets, which these pull in (~4 s).
  # Deferred: these import TensorFlow, or JAX (with orbax and tensorstore), whose native logging
  # must start after `run` has set TensorFlow's log level and imported it quietly
  # (`console.quiet_native_logs`): with JAX imported first, tf.data's C++ warnings reach the
  # console (seen with `eval.py`).
  from calib_jax.cli import run_config
  from calib_jax.training import checkpoint, reporting
  from calib_jax.data.checks import DataError
  from calib_jax.evaluation import run as evaluation
  from calib_jax.experiment import WeightFileError
  if _WEIGHTS.value:
    resolved = os.path.abspath(os.path.expanduser(_WEIGHTS.value))
    if not os.path.isfile(resolved):  # Before the workdir is made for the results.
      sys.exit(f"eval.py: weights={_WEIGHTS.value!r}: no such file ({resolved})")
    os.makedirs(workdir, exist_ok=True)  # It only receives the results.
  elif not os.path.isdir(workdir):
    sys.exit(f"eval.py: work directory {workdir} not found; train into it with train.py first "
             "(or evaluate a weight file with --weights=FILE).")
  try:
    console.setup(workdir)
  except OSError as e:  # Before anything is built: the work directory cannot be written.
    sys.exit(f"eval.py: work directory {workdir} is not writable ({e.strerror or e})")
  try:
    config, _ = run_config.config_for(workdir)  # the run's own config.json without --config
  except ConfigError as e:
    sys.exit(f"eval.py: {e}")
  if _OOD.value is not None:
    config.eval.ood = _OOD.value
  if _BOOTSTRAP.value is not None:
    config.eval.bootstrap_samples = _BOOTSTRAP.value
  if _SHIFT.value is not None:
    config.eval.shift = _SHIFT.value
  try:
    if _ENSEMBLE.value:
      _evaluate_ensemble(config, workdir)
      return
    evaluated = []
    for member in _members(config):
      results = evaluation.evaluate_run(config, workdir, split=_SPLIT.value, step=_STEP.value,
                                        weights=_WEIGHTS.value, member=member)
      print(evaluation.format_table(results) + ("\n" if member is not None else ""))
      evaluated.append(results)
    if len(evaluated) > 1:  # a sweep's members side by side
      print(evaluation.format_members(evaluated))
  except checkpoint.CheckpointMismatchError as e:
    logging.error("%s", e)
    line = run_config.mismatch_line(workdir, run_config.saved_config(workdir), config, e,
                                    evaluating=True)
    sys.exit(f"eval.py: {line}")
  except (ConfigError, WeightFileError, checkpoint.UnreadableCheckpointError, DataError,
          FileNotFoundError, reporting.WorkdirError, ValueError) as e:
    logging.error("%s", e)
    sys.exit(f"eval.py: {str(e).splitlines()[0] if not isinstance(e, ConfigError) else e}")


def _evaluate_ensemble(config, workdir: str) -> None:
  """`--ensemble [--members=...] [--ensemble_greedy=K]`: a sweep's members as one ensemble
  (errors are `main`'s one line)."""
  from calib_jax.evaluation import ensembles  # Deferred with evaluation.run: TensorFlow.
  from calib_jax.evaluation import run as evaluation
  from calib_jax import sweep  # Deferred as `main`'s imports: it imports JAX (see there).
  parsed = sweep.parse(config) if config.sweep else None
  members = None if parsed is None else ensembles.parse_members(_MEMBERS.value, parsed.size)
  results = evaluation.evaluate_ensemble(config, workdir, split=_SPLIT.value, step=_STEP.value,
                                         members=members, greedy=_ENSEMBLE_GREEDY.value)
  print(evaluation.format_ensemble(results))
  print(f"\nwritten: {', '.join(results.get('files', {}).values())}")


def _evaluate_predictions(path: str, workdir: str) -> None:
  """`--predictions=FILE.npz`: the report of the file's logits; bad files exit with one line."""
  from calib_jax.evaluation import predictions
  if (_WEIGHTS.value or _MEMBER.value is not None or _STEP.value is not None or _OOD.value
      or _SHIFT.value):
    sys.exit("eval.py: --predictions evaluates a file's logits (its ood_logits array is the "
             "OOD set); it cannot go with --weights, --member, --step, --ood or --shift")
  try:  # Library logs (jax's backend probing) go to the log file, as for a run.
    console.setup(workdir, datasets=False)
  except OSError as e:
    sys.exit(f"eval.py: work directory {workdir} is not writable ({e.strerror or e})")
  try:
    arrays = predictions.load_npz(os.path.abspath(os.path.expanduser(path)))
    options = {} if _BOOTSTRAP.value is None else {"bootstrap_samples": _BOOTSTRAP.value}
    results, files = predictions.evaluate_and_write(
        os.path.join(workdir, predictions.PREDICTIONS_DIR), arrays, **options)
  except predictions.PredictionsError as e:
    sys.exit(f"eval.py: {e}")
  print(predictions.format_table(results))
  print(f"\nwritten: {', '.join(files.values())}")


def _members(config) -> list[int | None]:
  """The members `--member` names: [None] for a single run; one index, or all of a sweep's."""
  from calib_jax import sweep  # Deferred as `main`'s imports: it imports JAX (see there).
  parsed = sweep.parse(config) if config.sweep else None
  text = _MEMBER.value
  if parsed is None:
    if text is not None:
      sys.exit("eval.py: --member is for a sweep's run; this config has no sweep")
    return [None]
  if text is None or text == "all":
    return list(range(parsed.size))
  if not text.isdigit() or int(text) >= parsed.size:
    sys.exit(f"eval.py: --member={text!r} is not a member: use 0..{parsed.size - 1} or 'all'")
  return [int(text)]


def _asks_for_predictions(argv: list[str]) -> bool:
  """Whether a command line (program name first) has `--predictions=FILE`."""
  return any(arg.split("=", 1)[0] == "--predictions" for arg in argv[1:])


def _second_cpu_device() -> None:
  """Gives JAX two CPU devices (unless the user chose a number): a predictions report computes
  its bootstrap intervals on the second, beside the rest of the report on the first
  (`evaluation.predictions_intervals`); XLA:CPU runs one device's programs one at a time."""
  import jax  # Deferred as in `compilation_cache.enable` (imported there already).
  if ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
      and jax.config.jax_num_cpu_devices < 0):
    jax.config.update("jax_num_cpu_devices", 2)


def run() -> None:
  """The program: quiet native logs, the compilation cache, flags, then `main` under absl.
  A predictions file never touches the data pipeline, so TensorFlow is not imported for it."""
  console.quiet_native_logs(sys.argv, import_tensorflow=not _asks_for_predictions(sys.argv))
  compilation_cache.enable()
  if _asks_for_predictions(sys.argv):
    _second_cpu_device()
  flags.define(sys.argv)
  app.run(main, flags_parser=flags.parse_flags)


if __name__ == "__main__":
  run()
