"""Do ALS-trained networks look at the object? CE vs ALS vs ALS + context on clutter_objects.

    PYTHONPATH=. .venv/bin/python bench/localisation.py [--workdir=workdirs/localisation] \
        [--seeds=0,1,2] [--out_dir=docs/results] [--seg_steps=600]

Each (loss, seed) run uses the loss-comparison study's recipe (`configs/compare.py`
`clutter_objects,<loss>`: a 16/32/64 small CNN, 1,200 Adam steps) and trains into
`<workdir>/<loss>/seed<k>` unless a checkpoint is there; it is then evaluated with `evaluate_run`
(test split) unless its `metrics.json` already has the localisation scores. The scores are the
pointing game and the energy-in-box share of the true class's Grad-CAM (and Grad-CAM++) on the
2,000 test images (`calib_jax.explain`), against the chance level (the boxes' share of the image).

It also trains a tiny fully convolutional segmenter on `clutter_objects_seg` (a bench-local model
registered as `bench_fcn`; the zoo's DeepLabs are too slow for a CPU demo) for its confidence maps.

Writes to `--out_dir`: `localisation.md` (mean ± std over seeds, per-seed claim check),
`cams_clutter_objects.png` (ALS, first seed, test images), `cams_clutter_objects_context.png`
(the same model on context-only images), `seg_confidence_maps.png` and
`seg_class_reliability.png`. Not a test: it trains models and prints numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CONFIG = os.path.join(ROOT, "configs", "compare.py")
LOSSES = ("ce", "als", "als_context")
DISPLAY = {"ce": "CE", "als": "ALS", "als_context": "ALS + context"}

Results = dict[str, Any]


def run_cell(workdir: str, loss: str, seed: int) -> Results:
  """Trains (unless checkpointed) and evaluates (unless scored) one run; its metrics.json."""
  from calib_jax import config as config_lib
  from calib_jax.evaluation import run as evaluate
  from calib_jax.training import checkpoint, loop
  path = os.path.abspath(os.path.join(workdir, loss, f"seed{seed}"))
  metrics_file = os.path.join(evaluate.eval_dir(path, "test"), evaluate.RESULTS_FILE)
  if os.path.exists(metrics_file):
    with open(metrics_file) as f:
      results = json.load(f)
    if "localisation" in results:
      return results
  config = config_lib.load_config_file(f"{CONFIG}:clutter_objects,{loss}")
  config.seed = seed
  if checkpoint.Checkpointer(path, read_only=True).latest_step() is None:
    start = time.monotonic()
    loop.train_and_evaluate(config, path)
    print(f"trained {loss} seed {seed} in {time.monotonic() - start:.0f} s", flush=True)
  return evaluate.evaluate_run(config, path, split="test")


def _mean_std(values: list[float]) -> str:
  if len(values) == 1:
    return f"{values[0]:.3f}"
  return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


COLUMNS = (
    ("Acc", lambda r: r["pre_temperature"]["accuracy"]),
    ("ECE", lambda r: r["pre_temperature"]["ece"]),
    ("Pointing game (Grad-CAM)", lambda r: r["localisation"]["pointing_game"]),
    ("Energy in box (Grad-CAM)", lambda r: r["localisation"]["energy_in_box"]),
    ("Pointing game (Grad-CAM++)", lambda r: r["localisation"]["grad_cam_pp"]["pointing_game"]),
    ("Energy in box (Grad-CAM++)", lambda r: r["localisation"]["grad_cam_pp"]["energy_in_box"]),
    ("Context-only confidence", lambda r: r["context"]["average_confidence"]),
)


def table(runs: dict[str, list[Results]]) -> str:
  lines = ["| Loss | seeds | " + " | ".join(c for c, _ in COLUMNS) + " |",
           "|---|---|" + "---|" * len(COLUMNS)]
  for loss, results in runs.items():
    cells = [_mean_std([float(value(r)) for r in results]) for _, value in COLUMNS]
    lines.append(f"| {DISPLAY[loss]} | {len(results)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def claims(runs: dict[str, list[Results]]) -> str:
  """Seed-by-seed: does each ALS variant localise better than CE (same seed)?"""
  lines = ["| Claim | per seed (ALS − CE) | holds on |", "|---|---|---|"]
  ce = {r["seed"]: r for r in runs.get("ce", [])}
  for loss in ("als", "als_context"):
    for name, key in (("pointing game", "pointing_game"), ("energy in box", "energy_in_box")):
      diffs = [r["localisation"][key] - ce[r["seed"]]["localisation"][key]
               for r in runs.get(loss, []) if r["seed"] in ce]
      if diffs:
        lines.append(f"| {DISPLAY[loss]} > CE, {name} (Grad-CAM) | "
                     + ", ".join(f"{d:+.3f}" for d in diffs)
                     + f" | {sum(d > 0 for d in diffs)}/{len(diffs)} seeds |")
  return "\n".join(lines)


# ------------------------------------------------------------------------------ segmentation


def train_segmenter(workdir: str, steps: int) -> Results:
  """A tiny dilated FCN on clutter_objects_seg, trained and evaluated (for its pictures)."""
  import flax.linen as nn
  from calib_jax import models
  from calib_jax import config as config_lib
  from calib_jax.evaluation import run as evaluate
  from calib_jax.training import checkpoint, loop

  class BenchFCN(nn.Module):
    """conv 16 - conv 32 (dilation 2) - conv 32 (dilation 4), BN-ReLU each, 1x1 'head'."""
    num_classes: int

    @nn.compact
    def __call__(self, x, train=False):
      for i, (width, dilation) in enumerate(((16, 1), (32, 2), (32, 4))):
        x = nn.Conv(width, (3, 3), kernel_dilation=dilation, use_bias=False, name=f"conv{i}")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, name=f"bn{i}")(x))
      return nn.Conv(self.num_classes, (1, 1), name="head")(x)

  models.register("bench_fcn", BenchFCN, overwrite=True)
  config = config_lib.base_config()
  config.data.name = "clutter_objects_seg"
  config.model = "bench_fcn"
  config.data.batch_size = 32
  config.data.eval_batch_size = 100
  config.num_train_steps = steps
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.schedule.name = "cosine"
  config.schedule.warmup_epochs = 0.1
  config.eval_every_steps = 0
  config.checkpoint_every_steps = steps
  config.progress_bar = False
  config.tensorboard = False
  config.eval.pnorm_candidates = (2,)
  path = os.path.abspath(os.path.join(workdir, "seg_fcn"))
  if checkpoint.Checkpointer(path, read_only=True).latest_step() is None:
    loop.train_and_evaluate(config, path)
  return evaluate.evaluate_run(config, path, split="test")


# ------------------------------------------------------------------------------------ report


def write_report(out_dir: str, runs: dict[str, list[Results]], seg: Results | None,
                 seconds: float) -> str:
  first = runs["als"][0] if runs.get("als") else next(iter(runs.values()))[0]
  loc = first["localisation"]
  copies = {"cams_clutter_objects.png": first["files"]["cams"]}
  if "cams_context" in first["files"]:
    copies["cams_clutter_objects_context.png"] = first["files"]["cams_context"]
  if seg is not None:
    copies["seg_confidence_maps.png"] = seg["files"]["seg_maps"]
    copies["seg_class_reliability.png"] = seg["files"]["class_reliability"]
  for name, source in copies.items():
    shutil.copyfile(source, os.path.join(out_dir, name))
  seeds = sorted({r["seed"] for results in runs.values() for r in results})
  text = [
      "# Do ALS networks look at the object? (clutter_objects)",
      "",
      "Generated by `bench/localisation.py`. Recipe: `configs/compare.py` `clutter_objects,<loss>`"
      " (small CNN 16/32/64, 1,200 Adam steps, batch 32), seeds "
      f"{', '.join(map(str, seeds))}; test split, {loc['num_images']} images. Maps of the "
      f"**true class** at layer `{loc['layer']}` (this script: {int(seconds)} s on a shared "
      "2-core CPU, reusing runs already trained).",
      "",
      "* **Pointing game**: the fraction of images whose map maximum lies inside an object box.",
      "* **Energy in box**: the share of the map's mass inside the boxes.",
      f"* **Chance** (a uniform map / a random point): the boxes' mean share of the image, "
      f"{loc['box_area']:.3f}.",
      "",
      table(runs),
      "",
      "## The claim, seed by seed",
      "",
      claims(runs),
      "",
      "![CAM grid](cams_clutter_objects.png)",
      "",
      f"`cams_clutter_objects.png`: {DISPLAY.get(first['loss'], first['loss'])}, seed "
      f"{first['seed']}, first 8 test images: image | Grad-CAM | Grad-CAM++ of the predicted "
      "class, boxes dashed, top-3 probabilities green when right and red when wrong. "
      "`cams_clutter_objects_context.png`: the same images with the objects filled with the mean "
      "pixel.",
  ]
  if seg is not None:
    text += ["", "## Segmentation confidence maps", "",
             f"A tiny dilated FCN (`bench_fcn`, {seg['step']} Adam steps) on clutter_objects_seg: "
             f"mIoU {seg['pre_temperature']['miou']:.3f}, pixel ECE "
             f"{100 * seg['pre_temperature']['ece']:.2f}%, mean classwise ECE of the validation "
             f"pixels {100 * seg['seg_maps']['mean_classwise_ece']:.2f}%.", "",
             "![confidence maps](seg_confidence_maps.png)", "",
             "![classwise reliability](seg_class_reliability.png)"]
  path = os.path.join(out_dir, "localisation.md")
  with open(path, "w") as f:
    f.write("\n".join(text) + "\n")
  return path


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join("workdirs", "localisation"))
  parser.add_argument("--out_dir", default=os.path.join("docs", "results"))
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--losses", default=",".join(LOSSES))
  parser.add_argument("--seg_steps", type=int, default=600, help="0: no segmentation run")
  args = parser.parse_args(argv)
  start = time.monotonic()
  runs: dict[str, list[Results]] = {}
  for seed in (int(s) for s in args.seeds.split(",")):
    for loss in args.losses.split(","):
      result = run_cell(args.workdir, loss, seed)
      result["seed"] = seed
      runs.setdefault(loss, []).append(result)
      print(f"{loss} seed {seed}: pointing {result['localisation']['pointing_game']:.3f}, "
            f"energy {result['localisation']['energy_in_box']:.3f}", flush=True)
  runs = {loss: runs[loss] for loss in args.losses.split(",") if loss in runs}
  seg = train_segmenter(args.workdir, args.seg_steps) if args.seg_steps > 0 else None
  os.makedirs(args.out_dir, exist_ok=True)
  print(write_report(args.out_dir, runs, seg, time.monotonic() - start))
  return 0


if __name__ == "__main__":
  sys.exit(main())
