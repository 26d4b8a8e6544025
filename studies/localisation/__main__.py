"""Do ALS-trained networks look at the object? CE vs ALS vs ALS + context on clutter_objects.

    .venv/bin/python -m studies.localisation [--workdir=workdirs/localisation] \
        [--seeds=0,1,2] [--out_dir=docs/results] [--seg_steps=600]

Each (loss, seed) run uses the loss-comparison study's recipe (`studies/compare/config.py`
`clutter_objects,<loss>`: a 16/32/64 small CNN, 1,200 Adam steps) and trains into
`<workdir>/<loss>/seed<k>` unless a checkpoint is there; it is then evaluated with `evaluate_run`
(test split) unless its `metrics.json` already has the localisation scores. The scores are the
pointing game and the energy-in-box share of the true class's Grad-CAM (and Grad-CAM++) on the
2,000 test images (`calib_jax.explain`), against the chance level (the boxes' share of the image).

It also trains a tiny fully convolutional segmenter on `clutter_objects_seg` (a study-local model
registered as `bench_fcn`; the zoo's DeepLabs are too slow for a CPU demo) for its confidence maps.

Writes to `--out_dir`: `localisation.md` (mean ± std over seeds, per-seed claim check),
`cams_clutter_objects.png` (ALS, first seed, test images), `cams_clutter_objects_context.png`
(the same model on context-only images), `seg_confidence_maps.png` and
`seg_class_reliability.png`. Run from the repository root. Not a test: it trains models and
prints numbers.
"""
import os
import time

from absl import app, flags, logging

from studies.compare.run import Results
from studies.localisation.report import write_report
from studies.localisation.run import LOSSES, run_cell, train_segmenter

_WORKDIR = flags.DEFINE_string("workdir", os.path.join("workdirs", "localisation"),
                               "where the runs train (checkpoints, metrics.json, figures)")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("docs", "results"),
                               "where the report and its figures go")
_SEEDS = flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds")
_LOSSES = flags.DEFINE_string("losses", ",".join(LOSSES), "comma-separated losses")
_SEG_STEPS = flags.DEFINE_integer("seg_steps", 600, "steps of the segmenter; 0: no "
                                  "segmentation run")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  start = time.monotonic()
  losses = _LOSSES.value.split(",")
  runs: dict[str, list[Results]] = {}
  for seed in (int(s) for s in _SEEDS.value.split(",")):
    for loss in losses:
      result = run_cell(_WORKDIR.value, loss, seed)
      result["seed"] = seed
      runs.setdefault(loss, []).append(result)
      print(f"{loss} seed {seed}: pointing {result['localisation']['pointing_game']:.3f}, "
            f"energy {result['localisation']['energy_in_box']:.3f}", flush=True)
  runs = {loss: runs[loss] for loss in losses if loss in runs}
  seg = train_segmenter(_WORKDIR.value, _SEG_STEPS.value) if _SEG_STEPS.value > 0 else None
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  print(write_report(_OUT_DIR.value, runs, seg, time.monotonic() - start))
  return 0


if __name__ == "__main__":
  app.run(main)
