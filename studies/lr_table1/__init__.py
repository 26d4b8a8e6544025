"""Label relaxation Table 1 (Fashion-MNIST): `python -m studies.lr_table1` (see `__main__`)."""
