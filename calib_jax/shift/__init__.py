"""Distribution shift: Hendrycks & Dietterich's image corruptions and rotated images.

`corrupt(images, name, severity)` applies one of the 19 corruptions of ImageNet-C (15 benchmark,
4 validation) to a uint8 batch as a jitted JAX program, equal to the reference `imagecorruptions`
(deterministic ones) or drawn from its distribution (random ones); `table=` picks the ImageNet-C,
CIFAR-10-C or Tiny-ImageNet-C parameters. `rotate` gives Ovadia et al.'s rotated images.
See docs/shift.md.
"""
from calib_jax.shift.core import BENCHMARK_CORRUPTIONS
from calib_jax.shift.core import VALIDATION_CORRUPTIONS
from calib_jax.shift.core import corrupt
from calib_jax.shift.core import corruption_names
from calib_jax.shift.core import table_names
from calib_jax.shift.rotation import ROTATION_ANGLES
from calib_jax.shift.rotation import rotate

__all__ = [
    "BENCHMARK_CORRUPTIONS", "VALIDATION_CORRUPTIONS", "ROTATION_ANGLES", "corrupt",
    "corruption_names", "rotate", "table_names",
]
