"""Distribution shift: Hendrycks & Dietterich's image corruptions and rotated images.

`corrupt(images, name, severity)` applies one of the 19 corruptions of ImageNet-C (15 benchmark,
4 validation) to a uint8 batch as a jitted JAX program, equal to the reference `imagecorruptions`
(deterministic ones) or drawn from its distribution (random ones); `table=` picks the ImageNet-C,
CIFAR-10-C or Tiny-ImageNet-C parameters. `rotate` gives Ovadia et al.'s rotated images;
`parse_spec` reads `eval.py --shift`. See docs/shift.md.
"""
from calib_jax.shift.core import BENCHMARK_CORRUPTIONS
from calib_jax.shift.core import VALIDATION_CORRUPTIONS
from calib_jax.shift.core import corrupt
from calib_jax.shift.core import corruption_names
from calib_jax.shift.core import requirement_problems
from calib_jax.shift.core import table_names
from calib_jax.shift.rotation import ROTATION_ANGLES
from calib_jax.shift.rotation import rotate
from calib_jax.shift.spec import ShiftSpec
from calib_jax.shift.spec import parse_spec

__all__ = [
    "BENCHMARK_CORRUPTIONS", "VALIDATION_CORRUPTIONS", "ROTATION_ANGLES", "ShiftSpec", "corrupt",
    "corruption_names", "parse_spec", "requirement_problems", "rotate", "table_names",
]
