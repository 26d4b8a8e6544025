"""Split-conformal prediction sets for classification, on device.

`fit(name, val_logits, val_labels, alpha)` calibrates THR (LAC), APS, RAPS or SAPS on held-out
logits and returns a predictor mapping logits to a bool set mask `[..., C]` that holds the
true label with probability ≥ 1 − α; with `conditional="class"` (Mondrian) it does so for
every class. The metrics (`coverage`, `mean_set_size`,
`size_stratified_coverage`, `class_conditional_coverage`) read those masks.
"""
from calib_jax.conformal.metrics import class_conditional_coverage
from calib_jax.conformal.metrics import coverage
from calib_jax.conformal.metrics import DEFAULT_SIZE_EDGES
from calib_jax.conformal.metrics import mean_set_size
from calib_jax.conformal.metrics import size_strata
from calib_jax.conformal.metrics import size_stratified_coverage
from calib_jax.conformal.metrics import SizeStratifiedCoverage
from calib_jax.conformal.metrics import StratifiedCoverage
from calib_jax.conformal.predictor import check_class_sizes
from calib_jax.conformal.predictor import ConformalPredictor
from calib_jax.conformal.predictor import fit
from calib_jax.conformal.predictor import method_scores
from calib_jax.conformal.predictor import method_uniforms
from calib_jax.conformal.predictor import names
from calib_jax.conformal.predictor import sorted_method_scores
from calib_jax.conformal.predictor import threshold
from calib_jax.conformal.scores import aps_scores
from calib_jax.conformal.scores import class_conditional_quantile
from calib_jax.conformal.scores import conformal_quantile
from calib_jax.conformal.scores import label_scores
from calib_jax.conformal.scores import min_calibration_size
from calib_jax.conformal.scores import quantile_rank
from calib_jax.conformal.scores import rank_of
from calib_jax.conformal.scores import raps_scores
from calib_jax.conformal.scores import saps_scores
from calib_jax.conformal.scores import thr_scores

__all__ = [
    "fit", "names", "ConformalPredictor", "check_class_sizes", "method_scores", "method_uniforms",
    "threshold", "sorted_method_scores", "rank_of",
    "thr_scores", "aps_scores", "raps_scores", "saps_scores", "label_scores",
    "conformal_quantile", "class_conditional_quantile", "quantile_rank", "min_calibration_size",
    "coverage", "mean_set_size", "size_stratified_coverage", "class_conditional_coverage",
    "size_strata", "DEFAULT_SIZE_EDGES", "StratifiedCoverage", "SizeStratifiedCoverage",
]
