"""Which post-hoc calibrator suits which training loss, and how large are conformal sets?

`python -m studies.calibrators`: CE, LS, LR, MbLS and ACLS on the label-relaxation Table 1
protocol (Fashion-MNIST MLP), each calibrated post hoc on a held-out validation split and
evaluated on the test split with `calib_jax.evaluate_predictions`.
"""
