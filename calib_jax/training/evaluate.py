"""Evaluation (placeholder while metrics land)."""
