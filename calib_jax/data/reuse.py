"""What the input pipeline builds once per process and reads again.

Building a tf.data pipeline traces its map functions into graphs (tfds' decoding, the
evaluation processor, batching): ~0.1-0.2 CPU-s for a small split, more than one pass over
it costs. A process that evaluates the same split many times (validation every few steps, a
run resumed or evaluated after training, a study's seeds and variants, a sweep's members)
builds it once: `Reused` keeps what was built under a key of everything it was built from,
and `local_files` is the part of that key that says the prepared files are still the same
(any file of the dataset's directory rewritten, added or removed makes a new key, so a
dataset prepared again is read afresh).
"""
from __future__ import annotations

import collections
import os
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")


def local_files(directory: str) -> tuple[tuple[str, int, int], ...] | None:
  """`(name, size, mtime_ns)` of each entry of a local `directory`, sorted; None where it is
  not a local directory (a `gs://` bucket, a folder that is gone): what is read from there is
  not reused, since checking it would cost a listing over the network."""
  try:
    with os.scandir(directory) as entries:
      return tuple(sorted((entry.name, stat.st_size, stat.st_mtime_ns)
                          for entry in entries for stat in (entry.stat(),)))
  except OSError:
    return None


class ByIdentity:
  """An object as a part of a key by identity, not by value (a registry's spec: one registered
  again under its name is another one); the key holds it, so its `id` is not reused meanwhile."""
  __slots__ = ("value",)

  def __init__(self, value: object):
    self.value = value

  def __hash__(self) -> int:
    return id(self.value)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ByIdentity) and other.value is self.value


class Reused(Generic[Value]):
  """The values built for the last `capacity` keys (least recently used dropped first).

  Keys must name everything the value depends on; where that cannot be checked (`local_files`
  of a remote folder is None) the caller passes the key None, and the value is built afresh.
  """

  def __init__(self, capacity: int):
    self.capacity = capacity
    self._values: collections.OrderedDict[Hashable, Value] = collections.OrderedDict()

  def get(self, key: Hashable | None, build: Callable[[], Value]) -> Value:
    """The value stored under `key`, else `build()`, stored under `key` unless it is None."""
    if key is not None and key in self._values:
      self._values.move_to_end(key)
      return self._values[key]
    value = build()
    if key is not None:
      self._values[key] = value
      while len(self._values) > self.capacity:
        self._values.popitem(last=False)
    return value

  def __len__(self) -> int:
    return len(self._values)
