"""`make demo`: train `configs/default.py` on the offline dataset, evaluate it, print the table.

    python -m calib_jax.demo [--workdir=workdirs/demo] [--variants=ce,mbls]

Each variant (a loss of `configs/default.py`, see its docstring) trains into
`<workdir>/<variant>` and is then evaluated on the test split, with temperature and p-norm fitted
on the validation split. Re-running continues unfinished runs and re-evaluates finished ones.

The console shows a progress bar per run and the results; library logs go to
`<workdir>/log.txt` (`--verbosity=0` shows them on stderr as well, `--verbosity=1` adds DEBUG).
"""
import argparse
import os
import sys
import time

# First: quiets TensorFlow's C++ log, which only works before TensorFlow is imported.
from calib_jax.training import console  # isort: skip

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "default.py")


def run_variant(variant: str, workdir: str, config_path: str = DEFAULT_CONFIG) -> dict:
  """Trains (or resumes) and evaluates one variant; returns `evaluate_run`'s results."""
  from calib_jax.training import config as config_lib, evaluate, loop
  config = config_lib.load_config_file(f"{config_path}:{variant}")
  run_dir = os.path.join(workdir, variant)
  start = time.monotonic()
  loop.train_and_evaluate(config, run_dir)
  trained = time.monotonic()
  results = evaluate.evaluate_run(config, run_dir, split="test")
  print(f"\n[{variant}] trained in {trained - start:.0f}s, evaluated in "
        f"{time.monotonic() - trained:.0f}s; results in {evaluate.eval_dir(run_dir, 'test')}")
  print(evaluate.format_table(results), flush=True)
  return results


def main(argv: list[str] | None = None) -> int:
  """Command-line entry point of the demo."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join("workdirs", "demo"))
  parser.add_argument("--variants", default="ce",
                      help="comma-separated loss variants of configs/default.py")
  parser.add_argument("--config", default=DEFAULT_CONFIG, help="config file to demo")
  parser.add_argument("-v", "--verbosity", type=int, default=None,
                      help="also show the library logs of <workdir>/log.txt on stderr at this "
                      "absl verbosity (0: INFO, 1: DEBUG)")
  args = parser.parse_args(argv)
  if not os.path.isfile(args.config):
    print(f"demo: {args.config} not found; run from a source checkout.", file=sys.stderr)
    return 1
  console.setup(args.workdir, args.verbosity)
  summary = {}
  for variant in filter(None, args.variants.split(",")):
    results = run_variant(variant, args.workdir, args.config)
    summary[variant] = (results["pre_temperature"], results["post_temperature"])
  if len(summary) > 1:
    print(f"\n{'variant':<12}{'acc':>8}{'ECE':>8}{'ECE PosT':>10}{'AECE':>8}{'NLL':>8}"
          f"{'AURC':>8}")
    for variant, (pre, post) in summary.items():
      print(f"{variant:<12}{pre['accuracy']:>8.4f}{pre['ece']:>8.4f}{post['ece']:>10.4f}"
            f"{pre['aece']:>8.4f}{pre['nll']:>8.4f}{pre['aurc']:>8.4f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
