"""Ensembles of member-stacked logits `[M, ..., C]` (docs/ensembles.md).

An ensemble averages its members' softmax **probabilities**, `p̄ = (1/M) Σ_m softmax(z_m)`
(`mean_probs`; `ensemble_log_probs` is `log p̄`, its logits for the metrics and post-hoc
calibrators). Scores (natural log): `predictive_entropy` H(p̄), `expected_entropy`
(1/M) Σ_m H(p_m), `mutual_information` (their difference, ≥ 0) and `disagreement` (the
fraction of member pairs predicting different classes). `member_metrics` gives each member's
accuracy, ECE, NLL and Brier and the mean member; `greedy_select` is Caruana et al.'s forward
selection by validation NLL. Every function is pure and jit-able.

Modules: `averaging`, `uncertainty`, `disagreement`, `members`, `selection`.
"""
from calib_jax.ensemble._inputs import stack_members
from calib_jax.ensemble.averaging import ensemble_log_probs
from calib_jax.ensemble.averaging import mean_probs
from calib_jax.ensemble.averaging import member_log_probs
from calib_jax.ensemble.disagreement import disagreement
from calib_jax.ensemble.members import MEMBER_METRICS
from calib_jax.ensemble.members import member_metrics
from calib_jax.ensemble.selection import greedy_select
from calib_jax.ensemble.uncertainty import expected_entropy
from calib_jax.ensemble.uncertainty import mutual_information
from calib_jax.ensemble.uncertainty import predictive_entropy

__all__ = [
    "disagreement", "ensemble_log_probs", "expected_entropy", "greedy_select", "mean_probs",
    "member_log_probs", "member_metrics", "MEMBER_METRICS", "mutual_information",
    "predictive_entropy", "stack_members",
]
