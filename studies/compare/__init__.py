"""The loss comparison on offline data: `python -m studies.compare` (see `__main__`)."""
