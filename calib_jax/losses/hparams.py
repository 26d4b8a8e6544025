"""Declarative hyper-parameter specs, checked once at `losses.get()` time."""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Sequence


@dataclasses.dataclass(frozen=True)
class Real:
  """A real hyper-parameter in [low, high] (an end excluded with `low_open` / `high_open`)."""
  default: float
  low: float = 0.0
  high: float = math.inf
  high_open: bool = False
  low_open: bool = False

  def check(self, loss: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise TypeError(f"{loss}: {name} must be a real number, got {value!r}")
    value = float(value)
    upper_ok = value < self.high if self.high_open else value <= self.high
    lower_ok = self.low < value if self.low_open else self.low <= value
    if not (math.isfinite(value) and lower_ok and upper_ok):
      left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
      raise ValueError(f"{loss}: {name}={value} is outside {left}{self.low}, {self.high}{right}")
    return value


@dataclasses.dataclass(frozen=True)
class Choice:
  """A string hyper-parameter from a fixed set."""
  default: str
  options: Sequence[str]

  def check(self, loss: str, name: str, value: Any) -> str:
    if value not in self.options:
      raise ValueError(f"{loss}: {name}={value!r} is not one of {list(self.options)}")
    return value
