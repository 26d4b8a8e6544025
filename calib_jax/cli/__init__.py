"""The command-line programs: `train` (`calib-jax-train`, `train.py`), `eval`
(`calib-jax-eval`, `eval.py`), their shared `flags`, and the quiet `console`.

Nothing here acts when imported: each program's `run()` quiets the native logs, defines the
flags and hands over to absl.
"""
