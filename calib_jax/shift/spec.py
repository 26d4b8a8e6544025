"""`parse_spec`: the text of `eval.py --shift` / `config.eval.shift` as a `ShiftSpec`.

Syntax (one of):

* `all`: the 15 benchmark corruptions of ImageNet-C (`BENCHMARK_CORRUPTIONS`) at severities
  1..5 (75 cells);
* `NAME[,NAME...][:SEVERITIES]`: the named corruptions (any of `corruption_names()`, the 4
  validation ones included; `all` may stand among them for the 15) at the given severities,
  comma-separated integers in 1..5 (default all five), e.g. `gaussian_noise,fog:1,3,5`;
* `rotate`: Ovadia et al.'s rotated images at `ROTATION_ANGLES` (0, 15, ..., 180 degrees);
* `dataset:NAME`: a registered dataset of stored corrupted images (tfds `cifar10_corrupted`,
  `imagenet2012_corrupted`), the 15 benchmark corruptions at severities 1..5 read from it.

A bad spec raises a one-line `ValueError` naming the problem and the valid choices.
"""
from __future__ import annotations

import dataclasses

from calib_jax.shift.core import BENCHMARK_CORRUPTIONS, corruption_names
from calib_jax.shift.rotation import ROTATION_ANGLES

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
KINDS = ("corruptions", "rotate", "dataset")


@dataclasses.dataclass(frozen=True)
class ShiftSpec:
  """A parsed shift: what is evaluated, cell by cell.

  Attributes:
    kind: "corruptions" (computed on the device), "rotate" or "dataset" (stored images).
    corruptions: the corruption names (kinds "corruptions" and "dataset").
    severities: the severities of every corruption.
    angles: the rotation angles in degrees (kind "rotate").
    dataset: the registered dataset of kind "dataset".
  """
  kind: str
  corruptions: tuple[str, ...] = ()
  severities: tuple[int, ...] = ()
  angles: tuple[int, ...] = ()
  dataset: str = ""

  def cells(self) -> list[tuple[str, int]]:
    """The evaluated cells in order: `(corruption, severity)`, or `("rotate", angle)`."""
    if self.kind == "rotate":
      return [("rotate", angle) for angle in self.angles]
    return [(name, severity) for name in self.corruptions for severity in self.severities]


def _severities(text: str, spec: str) -> tuple[int, ...]:
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isdigit() and 1 <= int(p) <= 5 for p in parts):
    raise ValueError(f"shift {spec!r}: severities must be comma-separated integers in 1..5, "
                     f"got {text!r}")
  return tuple(sorted({int(p) for p in parts}))


def parse_spec(text: str) -> ShiftSpec:
  """The `ShiftSpec` of `text` (see the module docstring); a one-line ValueError if bad."""
  if not isinstance(text, str) or not text.strip():
    raise ValueError(f"shift must be 'all', 'NAME[,NAME][:SEVERITIES]', 'rotate' or "
                     f"'dataset:NAME', got {text!r}")
  spec = text.strip()
  if spec == "rotate":
    return ShiftSpec("rotate", angles=ROTATION_ANGLES)
  if spec.startswith("dataset:"):
    name = spec[len("dataset:"):].strip()
    if not name:
      raise ValueError(f"shift {spec!r}: name the dataset, e.g. 'dataset:cifar10_corrupted'")
    return ShiftSpec("dataset", corruptions=BENCHMARK_CORRUPTIONS, severities=SEVERITIES,
                     dataset=name)
  names_text, _, severity_text = spec.partition(":")
  severities = _severities(severity_text, spec) if severity_text else SEVERITIES
  known = corruption_names()
  names: list[str] = []
  for name in (n.strip() for n in names_text.split(",")):
    chosen = BENCHMARK_CORRUPTIONS if name == "all" else (name,)
    if name not in known and name != "all":
      raise ValueError(f"shift {spec!r}: unknown corruption {name!r}; choose 'all', 'rotate', "
                       f"'dataset:NAME' or names of: {', '.join(known)}")
    names += [n for n in chosen if n not in names]
  return ShiftSpec("corruptions", corruptions=tuple(names), severities=severities)
