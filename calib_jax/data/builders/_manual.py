"""Helpers shared by the manual-download builders: locating an archive or its extracted folder."""
from __future__ import annotations

import io
import os

import numpy as np


def manual_dir(dl_manager) -> str:
  """The builder's manual dir as a string, with tfds' own error if it is missing or empty."""
  return os.fspath(dl_manager.manual_dir)


def locate(dl_manager, archives: tuple[str, ...], folder: str, instructions: str) -> str:
  """Returns the root folder of a dataset found in the manual dir.

  Looks for an already extracted ``folder`` first, then for any of ``archives`` (extracted
  through ``dl_manager``, which caches the extraction), and returns the path that contains
  ``folder``.
  """
  root = manual_dir(dl_manager)
  if os.path.isdir(os.path.join(root, folder)):
    return os.path.join(root, folder)
  for name in archives:
    path = os.path.join(root, name)
    if os.path.exists(path):
      extracted = os.fspath(dl_manager.extract(path))
      if os.path.isdir(os.path.join(extracted, folder)):
        return os.path.join(extracted, folder)
      raise FileNotFoundError(f"{path} does not contain the folder {folder!r}.")
  raise FileNotFoundError(
      f"Neither {folder}/ nor any of {list(archives)} found in the manual dir {root}. "
      + instructions)


def rgb_jpeg(path: str) -> io.BytesIO | np.ndarray:
  """JPEG bytes of an RGB image file; grayscale/CMYK files are converted to an RGB array."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(path) as img:
    if img.mode == "RGB" and img.format == "JPEG":
      with open(path, "rb") as f:
        return io.BytesIO(f.read())
    return np.asarray(img.convert("RGB"))
