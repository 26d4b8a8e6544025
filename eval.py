"""Evaluates a trained run (or a weight file): `calib_jax.cli.evaluate` (installed as
`calib-jax-eval`), run from a source checkout.

    python eval.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls
"""
from calib_jax.cli import evaluate

if __name__ == "__main__":
  evaluate.run()
