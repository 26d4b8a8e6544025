"""The studies behind docs/results.md: programs that train many runs of the library and write a
report with the papers' claims checked (not part of the installed `calib_jax` package).

* `studies.compare`: every loss on Fashion-MNIST and clutter_objects, 3 seeds (`make compare`).
* `studies.localisation`: Grad-CAM localisation of CE / ALS / ALS + context on clutter_objects,
  and a segmenter's confidence maps (`make localisation`).
* `studies.lr_table1`: the label-relaxation paper's Table 1 protocol on Fashion-MNIST.
* `studies.demo_targets`: `make demo` on several seeds against the README's targets.

Each runs from the repository root as `python -m studies.<name>` (absl flags; `--help` lists
them). A study's configs sit beside it (`studies/<name>/config.py`) and load like any config
file: `python train.py --config=studies/lr_table1/config.py:final,ce`. Reports go to
docs/results/.
"""
