"""Evaluation: evaluators built from an `experiment.Experiment`, and the program behind eval.py.

    from calib_jax import evaluation
    results = evaluation.evaluate_run(config, workdir)   # metrics.json + plots

Modules: `validation` (`ValidationEvaluator`, the training loop's; the accumulators),
`predictions` (`evaluate_predictions`: any model's logits; its inputs read and checked in
`predictions_input`, its plots in `predictions_plots`), `toolkit`, `report` (`CalibrationReport`: PreT/PosT calibration and selective metrics),
`maps` (`MapReport`: class activation and confidence maps), `shift` (`ShiftReport`: the report
under corruptions or rotations, `eval.py --shift`; its progress file in `shift_progress`),
`run` (`evaluate_run`, `format_table`, `format_members`).
"""
# The names are loaded on first use: every module here but `predictions` imports TensorFlow
# (through `calib_jax.experiment`), which `eval.py --predictions` never needs.
import importlib

_LAZY = {
    "evaluate_run": ("calib_jax.evaluation.run", "evaluate_run"),
    "format_table": ("calib_jax.evaluation.run", "format_table"),
    "format_members": ("calib_jax.evaluation.run", "format_members"),
    "eval_dir": ("calib_jax.evaluation.run", "eval_dir"),
    "CalibrationReport": ("calib_jax.evaluation.report", "CalibrationReport"),
    "MapReport": ("calib_jax.evaluation.maps", "MapReport"),
    "ShiftReport": ("calib_jax.evaluation.shift", "ShiftReport"),
    "ValidationEvaluator": ("calib_jax.evaluation.validation", "ValidationEvaluator"),
}


def __getattr__(name):
  if name in _LAZY:
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
