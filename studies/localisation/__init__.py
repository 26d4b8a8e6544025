"""Grad-CAM localisation on clutter_objects: `python -m studies.localisation` (see `__main__`)."""
