"""Trains a model from an ml_collections config: `calib_jax.cli.train` (installed as
`calib-jax-train`), run from a source checkout.

    python train.py --config=configs/cifar10_resnet50.py:mbls --workdir=workdirs/c10_mbls

`python train.py --help` lists the flags; `python -m calib_jax.dry_run` compiles a config for
TPU slices and GPUs before you pay for them.
"""
from calib_jax.cli import train

if __name__ == "__main__":
  train.run()
