"""Confidence scores and post-hoc calibration; conventions in docs/conventions.md.

Scores map logits `[..., C]` to one number per sample, higher = more confident:
`msp`, `max_logit`, `neg_entropy`, `energy` (Liu et al. 2020) and `max_logit_pnorm` (logit
normalisation, Cattelan & Silva 2023; Xia et al. 2024 Eq. 17). `fit_temperature` minimises
held-out NLL; `select_temperature_from_grid` picks the grid value with the lowest held-out ECE
(the label relaxation paper's protocol); `select_pnorm` picks the p-norm with the lowest
held-out AURC, or falls back to MSP. `fit_calibrator(name, val_logits, val_labels)` fits any of
`calibrator_names()` (temperature, vector, matrix and Dirichlet scaling, isotonic regression,
histogram binning, BBQ, beta calibration) and returns a `Calibrator` mapping logits to probabilities.

Modules: `scores`, `pnorm`, `temperature`, `scaling`, `isotonic`, `binning`, `bbq`, `beta`,
`registry`.
"""
from calib_jax.posthoc._fitting import TooFewSamplesError
from calib_jax.posthoc.pnorm import max_logit_pnorm
from calib_jax.posthoc.pnorm import pnorm_aurcs
from calib_jax.posthoc.pnorm import select_pnorm
from calib_jax.posthoc.registry import calibrator_names
from calib_jax.posthoc.registry import Calibrator
from calib_jax.posthoc.registry import fit_calibrator
from calib_jax.posthoc.scores import energy
from calib_jax.posthoc.scores import max_logit
from calib_jax.posthoc.scores import msp
from calib_jax.posthoc.scores import neg_entropy
from calib_jax.posthoc.temperature import apply_temperature
from calib_jax.posthoc.temperature import fit_temperature
from calib_jax.posthoc.temperature import LR_PAPER_TEMPERATURES
from calib_jax.posthoc.temperature import select_temperature_from_grid

__all__ = [
    "Calibrator", "LR_PAPER_TEMPERATURES", "apply_temperature", "calibrator_names", "energy",
    "fit_calibrator", "fit_temperature", "max_logit", "max_logit_pnorm", "msp", "neg_entropy",
    "pnorm_aurcs", "select_pnorm", "select_temperature_from_grid", "TooFewSamplesError",
]
