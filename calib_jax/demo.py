"""`make demo`: why calibration matters, in about 30 s of CPU time, offline.

    python -m calib_jax.demo [--workdir=workdirs/demo] [--variants=ce,mbls,acls] [--seed=0]
        [--num_train_steps=N] [--full_report]   # installed: calib-jax-demo

It works from any directory, in a source checkout or with the package installed: its recipe,
`configs/default.py`, travels with the package. It trains that recipe once per variant (a loss
of that file: cross-entropy, then MbLS and ACLS by default) into `<workdir>/<variant>`,
evaluates each on the digits it never saw with eval.py's calibration report (T and p-norm
fitted on the validation digits; not the post-hoc toolkit, whose calibrators, bootstrap
intervals and conformal sets the table does not show: `--full_report` adds it) and prints one
comparison table. Cross-entropy memorises its 60 training digits and is far more confident
than accurate; the margin-based losses keep the accuracy and close most of that gap. Written
next to the runs:

* `<workdir>/summary.json`: `{"variants": {name: {"accuracy", "ece", "ece_post",
  "temperature", "average_confidence", "nll", "aurc", "train_accuracy"}}, "seed": ...}`;
* `<workdir>/reliability.png`: the variants' reliability diagrams side by side.

Re-running continues unfinished runs and re-evaluates finished ones. The console shows a
progress bar per run and the results; library logs go to `<workdir>/log.txt` (`--verbosity=0`
shows them on stderr as well, `--verbosity=1` adds DEBUG).
"""
import argparse
import json
import os
import sys
import textwrap
import time
from typing import Any

import numpy as np

from calib_jax.cli import compilation_cache, console
from calib_jax.config import files

# The demo's recipe travels with the package (`configs/default.py` in a source checkout).
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                              "default.py")
SUMMARY_FILE = "summary.json"
FIGURE_FILE = "reliability.png"
DISPLAY = {"ce": "CE", "ls": "LS", "focal": "FL", "flsd": "FLSD", "ecp": "CP", "mbls": "MbLS",
           "mbls_m0": "MbLS m=0", "acls": "ACLS", "crl": "CRL", "mdca": "MDCA", "cpc": "CPC",
           "mmce": "MMCE", "lr": "LR"}
SUMMARY_KEYS = ("accuracy", "ece", "ece_post", "temperature", "average_confidence", "nll",
                "aurc", "train_accuracy")


def run_variant(variant: str, workdir: str, config_path: str = DEFAULT_CONFIG,
                seed: int = 0, num_train_steps: int | None = None,
                full_report: bool = False) -> dict[str, Any]:
  """Trains (or resumes) and evaluates one variant; returns `evaluate_run`'s results with the
  run directory and the final training accuracy added. `num_train_steps` replaces the
  recipe's length (a quick check that everything runs; the table then means little);
  `full_report` adds the post-hoc toolkit (`eval.toolkit`) to the evaluation."""
  # Deferred: these import TensorFlow or JAX, whose native logging must start after
  # `console.quiet_native_logs` has set TensorFlow's log level and imported it quietly (`run`).
  from calib_jax.evaluation import run as evaluation
  from calib_jax.run import loop
  from calib_jax.training import reporting
  config = files.load_config_file(f"{config_path}:{variant}")
  config.seed = seed
  if num_train_steps is not None:
    config.num_train_steps = num_train_steps
    config.checkpoint_every_steps = min(config.checkpoint_every_steps, num_train_steps)
  run_dir = os.path.join(workdir, variant)
  print(f"[{variant}] training {config.loss} {dict(config.loss_kwargs)} into {run_dir}",
        flush=True)
  start = time.monotonic()
  loop.train_and_evaluate(config, run_dir)
  trained = time.monotonic()
  # Set after training, so the run's saved config (what eval.py reads) keeps the recipe's.
  config.eval.toolkit = full_report
  results = evaluation.evaluate_run(config, run_dir, split="test")
  train = [r for r in reporting.read_metrics(run_dir) if r.get("split") == "train"]
  results["train_accuracy"] = train[-1]["accuracy"] if train else float("nan")
  results["run_dir"] = run_dir
  print(f"[{variant}] trained in {trained - start:.0f}s, evaluated in "
        f"{time.monotonic() - trained:.0f}s", flush=True)
  return results


def summarize(results: dict[str, Any]) -> dict[str, float]:
  """The numbers `summary.json` keeps of one variant."""
  pre, post = results["pre_temperature"], results["post_temperature"]
  row = {"accuracy": pre["accuracy"], "ece": pre["ece"], "ece_post": post["ece"],
         "temperature": results["fit"]["temperature"],
         "average_confidence": pre["average_confidence"], "nll": pre["nll"],
         "aurc": pre["aurc"], "train_accuracy": results["train_accuracy"]}
  return {k: float(row[k]) for k in SUMMARY_KEYS}


def comparison_table(summary: dict[str, dict[str, float]], num_samples: int) -> str:
  """The console table: one row per variant, percentages (NLL in nats)."""
  head = (f"{'variant':<8}{'train acc':>10}{'test acc':>10}{'mean conf':>10}{'ECE':>7}"
          f"{'NLL':>7}{'AURC':>7}{'T':>7}{'ECE after T':>13}")
  lines = [f"Test split: {num_samples} examples no model trained on; T fitted on the "
           "validation split.", "Percentages, except NLL (nats) and T.", head, "-" * len(head)]
  for name, s in summary.items():
    lines.append(f"{DISPLAY.get(name, name):<8}{100 * s['train_accuracy']:>10.1f}{100 * s['accuracy']:>10.1f}"
                 f"{100 * s['average_confidence']:>10.1f}{100 * s['ece']:>7.2f}"
                 f"{s['nll']:>7.3f}{100 * s['aurc']:>7.2f}{s['temperature']:>7.2f}"
                 f"{100 * s['ece_post']:>13.2f}")
  return "\n".join(lines)


def verdict(summary: dict[str, dict[str, float]]) -> list[str]:
  """Plain-language reading of the table (what a newcomer should notice), wrapped."""
  lines = []
  if "ce" in summary:
    ce = summary["ce"]
    gap = ce["average_confidence"] - ce["accuracy"]
    lines.append(f"CE (cross-entropy) is {100 * ce['average_confidence']:.0f}% confident on "
                 f"average but right {100 * ce['accuracy']:.0f}% of the time: its confidence "
                 f"overstates its accuracy by {100 * gap:.1f} points (ECE "
                 f"{100 * ce['ece']:.1f}%); temperature scaling needs T = "
                 f"{ce['temperature']:.2f} to correct it after training.")
    for name, s in summary.items():
      if name == "ce":
        continue
      reading = ("close to 1: calibrated by training itself" if 0.8 <= s["temperature"] <= 1.25
                 else "still far from 1")
      lines.append(f"{DISPLAY.get(name, name)}: ECE {100 * s['ece']:.1f}% "
                   f"({s['ece'] / ce['ece']:.0%} of CE's) at {100 * s['accuracy']:.1f}% "
                   f"accuracy ({100 * (s['accuracy'] - ce['accuracy']):+.1f} points); T = "
                   f"{s['temperature']:.2f}, {reading}.")
  return [textwrap.fill(line, 100, subsequent_indent="  ") for line in lines]


def reliability_figure(runs: dict[str, dict[str, Any]], path: str) -> str:
  """Side-by-side reliability diagrams (before temperature scaling) of the variants."""
  from calib_jax import plotting
  models = {}
  for name, results in runs.items():
    with np.load(results["files"]["predictions"]) as saved:
      models[DISPLAY.get(name, name)] = (saved["probs_pre"], saved["labels"])
  return plotting.reliability_diagrams(
      models, path, title="Reliability on the test split (bars on the diagonal = calibrated)")


def main(argv: list[str] | None = None) -> int:
  """Command-line entry point of the demo."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join("workdirs", "demo"))
  parser.add_argument("--variants", default="ce,mbls,acls",
                      help="comma-separated loss variants of the config (default.py: any loss "
                      "column, e.g. ce,ls,focal,mbls,acls)")
  parser.add_argument("--seed", type=int, default=0, help="seed of every run")
  parser.add_argument("--config", default=DEFAULT_CONFIG, help="config file to demo")
  parser.add_argument("--num_train_steps", type=int, default=None,
                      help="train this many steps instead of the recipe's (a quick check that "
                      "everything runs; the comparison then means little)")
  parser.add_argument("--full_report", action="store_true",
                      help="also run the post-hoc toolkit on each run (calibrators with 95%% "
                      "bootstrap intervals, conformal sets, failure detection: eval.py's whole "
                      "report, in <workdir>/<variant>/eval_test/; slower)")
  parser.add_argument("-v", "--verbosity", type=int, default=None,
                      help="also show the library logs of <workdir>/log.txt on stderr at this "
                      "absl verbosity (0: INFO, 1: DEBUG)")
  args = parser.parse_args(argv)
  args.config = files.resolve_config_path(args.config)
  if not os.path.isfile(args.config):
    print(f"demo: config file {args.config} not found (packaged recipes: "
          f"{', '.join(files.packaged_configs())})", file=sys.stderr)
    return 1
  if args.num_train_steps is not None and args.num_train_steps < 1:
    print(f"demo: --num_train_steps must be >= 1, got {args.num_train_steps}", file=sys.stderr)
    return 1
  names = [v for v in args.variants.split(",") if v]
  valid = tuple(files.load_config_module(args.config).VARIANTS)
  unknown = [v for v in names if v not in valid]
  if unknown or not names:
    print(f"demo: unknown variant(s) {', '.join(unknown) or '(none given)'}; valid: "
          f"{', '.join(valid)}", file=sys.stderr)
    return 1
  console.setup(args.workdir, args.verbosity)
  start = time.monotonic()
  runs = {name: run_variant(name, args.workdir, args.config, args.seed, args.num_train_steps,
                           args.full_report)
          for name in names}
  summary = {name: summarize(results) for name, results in runs.items()}
  num_samples = next(iter(runs.values()))["pre_temperature"]["num_samples"]
  with open(os.path.join(args.workdir, SUMMARY_FILE), "w") as f:
    json.dump({"variants": summary, "seed": args.seed, "config": args.config,
               "test_samples": num_samples}, f, indent=1)
  figure = reliability_figure(runs, os.path.join(args.workdir, FIGURE_FILE))
  print("\n" + comparison_table(summary, num_samples))
  print("\n" + "\n".join(verdict(summary)))
  report = ("full report and plots" if args.full_report else
            "calibration report and plots; --full_report adds the post-hoc toolkit")
  print(f"\nFiles: {os.path.join(args.workdir, SUMMARY_FILE)} (numbers), {figure} "
        f"(reliability diagrams), {args.workdir}/<variant>/eval_test/ (each run's {report}). "
        f"Took {time.monotonic() - start:.0f}s.")
  return 0


def run() -> None:
  """The program (`python -m calib_jax.demo`, `make demo`, the `calib-jax-demo` command)."""
  console.quiet_native_logs(sys.argv)
  compilation_cache.enable()
  sys.exit(main())


if __name__ == "__main__":
  run()
