"""Calibration under distribution shift on Fashion-MNIST (`python -m studies.shift`)."""
