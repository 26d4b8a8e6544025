"""The progress file of a shift evaluation (`shift.ShiftReport`): `shift_progress.json`.

A long shift evaluation (`--shift=all`: 75 cells and the clean one, each a pass over the test
split) saves every finished cell as it completes, so an interrupted evaluation keeps them and
the rerun computes only the others. The file holds

    {"key": {...}, "fingerprint": "<sha256 of the key>", "cells": {"clean": {...},
     "gaussian_noise/1": {METHOD: {METRIC: value}}, ..., "rotate/15": ...}}

and is read back only when its fingerprint is the current run's: the same checkpoint step (or
weight file), members, split, table, and config (all of it but `eval.shift`, so a larger spec
reuses the cells of a smaller one). Another checkpoint or config starts a new file. It is
written by process 0 through a temporary file and `os.replace`, so a kill leaves the previous
version whole; every process reads it (the evaluation directory is on shared storage, as the
checkpoints are).
"""
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

FILE = "shift_progress.json"


def path(directory: str) -> str:
  """The progress file of the evaluation directory `directory`."""
  return os.path.join(directory, FILE)


def cell_name(name: str, severity: int) -> str:
  """A cell's key: 'clean', 'NAME/SEVERITY' or 'rotate/ANGLE'."""
  return name if name == "clean" else f"{name}/{severity}"


def run_key(config: ml_collections.ConfigDict, extra: Mapping[str, Any]) -> dict[str, Any]:
  """What identifies the cells of a run: `extra` (step, weights, members, split, table) and
  the config's fingerprint without `eval.shift`."""
  settings = config.to_dict()
  settings["eval"] = {k: v for k, v in settings["eval"].items() if k != "shift"}
  text = json.dumps(settings, sort_keys=True, default=repr)
  return {**{k: extra[k] for k in sorted(extra)},
          "config": hashlib.sha256(text.encode()).hexdigest()}


def _fingerprint(key: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()


def load(file: str | None, key: Mapping[str, Any]) -> dict[str, Any]:
  """The saved cells of the run `key` (empty without a file, for another run, or for a file
  that cannot be read: the cells are computed again)."""
  if file is None or not os.path.exists(file):
    return {}
  try:
    with open(file, encoding="utf-8") as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(saved, dict) or saved.get("fingerprint") != _fingerprint(key):
    return {}
  return dict(saved.get("cells", {}))


def save(file: str | None, key: Mapping[str, Any], cells: Mapping[str, Any]) -> None:
  """Writes the cells of the run `key` (atomically: a temporary file, then `os.replace`)."""
  if file is None:
    return
  os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
  temporary = f"{file}.tmp"
  with open(temporary, "w", encoding="utf-8") as f:
    json.dump({"key": dict(key), "fingerprint": _fingerprint(key), "cells": dict(cells)}, f,
              indent=1, sort_keys=True, default=repr)
  os.replace(temporary, file)
