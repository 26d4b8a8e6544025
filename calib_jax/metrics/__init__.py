"""Calibration, selective-classification and detection metrics on device
(docs/conventions.md#metrics).

Calibration metrics take `(probs [..., C], labels [...])`; selective metrics take
`(scores [...], correct [...])`, detection metrics `(scores [...], positives [...])`; every
metric takes an optional bool `mask [...]`, and `bootstrap` gives any of them an interval.
The streaming accumulators (`ScalarSums`, `BinnedCalibration`, `ClasswiseCalibration`,
`ConfidenceHistogram`, `ConfusionMatrix`) accumulate them over batches and devices;
`StreamingMetrics` combines them.
"""
from calib_jax.metrics.accumulators import BinnedCalibration
from calib_jax.metrics.accumulators import ClasswiseCalibration
from calib_jax.metrics.accumulators import ConfusionMatrix
from calib_jax.metrics.accumulators import ScalarSums
from calib_jax.metrics._ranking import use_cacheable_cpu_sorts
from calib_jax.metrics.bootstrap import bootstrap
from calib_jax.metrics.bootstrap import top_label_rows
from calib_jax.metrics.calibration import accuracy
from calib_jax.metrics.calibration import aece
from calib_jax.metrics.calibration import average_confidence
from calib_jax.metrics.calibration import bin_index
from calib_jax.metrics.calibration import brier
from calib_jax.metrics.calibration import classwise_ece
from calib_jax.metrics.calibration import classwise_ece_from_bins
from calib_jax.metrics.calibration import confidence_and_correct
from calib_jax.metrics.calibration import ece
from calib_jax.metrics.calibration import ece_from_bins
from calib_jax.metrics.calibration import mce
from calib_jax.metrics.calibration import mce_from_bins
from calib_jax.metrics.calibration import nll
from calib_jax.metrics.calibration import overconfidence
from calib_jax.metrics.calibration import reliability_bins
from calib_jax.metrics.calibration import reliability_from_bins
from calib_jax.metrics.calibration import ReliabilityBins
from calib_jax.metrics.calibration import underconfidence
from calib_jax.metrics.calibration_l2 import debiased_ece
from calib_jax.metrics.calibration_l2 import rms_calibration_error
from calib_jax.metrics.segmentation import confusion_matrix
from calib_jax.metrics.segmentation import iou_from_confusion
from calib_jax.metrics.segmentation import miou
from calib_jax.metrics.detection import aupr
from calib_jax.metrics.detection import auroc
from calib_jax.metrics.detection import fpr_at_tpr
from calib_jax.metrics.histogram import ConfidenceHistogram
from calib_jax.metrics.segmentation import subsample_pixel_indices
from calib_jax.metrics.segmentation import subsample_pixels
from calib_jax.metrics.segmentation import valid_mask
from calib_jax.metrics.selective import aurc
from calib_jax.metrics.selective import augrc
from calib_jax.metrics.selective import coverage_at_risk
from calib_jax.metrics.selective import coverage_at_risk_key
from calib_jax.metrics.selective import eaurc
from calib_jax.metrics.selective import rank_summary
from calib_jax.metrics.selective import risk_at_coverage
from calib_jax.metrics.selective import risk_at_coverage_key
from calib_jax.metrics.selective import risk_coverage_curve
from calib_jax.metrics.selective import selective_summary
from calib_jax.metrics.smooth import smooth_calibration_curve
from calib_jax.metrics.smooth import smooth_ece
from calib_jax.metrics.smooth import top_label_smooth_ece
from calib_jax.metrics.streaming import StreamingMetrics

__all__ = [
    "accuracy", "aece", "average_confidence", "bin_index", "brier", "classwise_ece",
    "classwise_ece_from_bins", "confidence_and_correct", "top_label_rows", "ece", "ece_from_bins",
    "mce", "mce_from_bins", "nll", "overconfidence", "reliability_bins",
    "reliability_from_bins", "ReliabilityBins", "underconfidence",
    "debiased_ece", "rms_calibration_error", "smooth_calibration_curve", "smooth_ece",
    "top_label_smooth_ece", "use_cacheable_cpu_sorts",
    "bootstrap", "aupr", "auroc", "fpr_at_tpr",
    "confusion_matrix", "iou_from_confusion", "miou", "subsample_pixel_indices",
    "subsample_pixels", "valid_mask",
    "aurc", "augrc", "coverage_at_risk", "coverage_at_risk_key", "eaurc", "rank_summary",
    "risk_at_coverage",
    "risk_at_coverage_key", "risk_coverage_curve", "selective_summary",
    "BinnedCalibration", "ClasswiseCalibration", "ConfidenceHistogram", "ConfusionMatrix",
    "ScalarSums", "StreamingMetrics",
]
