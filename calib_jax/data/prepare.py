"""Finding or preparing a registered dataset's tfds builder, with the fallback to a local copy.

A catalogue dataset is downloaded and prepared by tfds on first use. A dataset with a local
fallback builder (`fashion_mnist`: `fashion_mnist_debian`, from the Debian package's files)
uses whichever of the two is prepared in data_dir, the catalogue one first; when neither is,
it downloads, and when the download fails (offline) it prepares the fallback from local files.
Both prepare the same examples in the same order: the fallback is tfds' own builder fed with
local copies of the same files.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import os

import requests
import tensorflow_datasets as tfds
from absl import logging

from calib_jax.data import registry

__all__ = ["prepared_builder", "prepared_tfds_name"]


class PrepareError(FileNotFoundError):
  """A dataset could not be prepared; `reason` is the underlying error in one short line."""

  def __init__(self, message: str, reason: str):
    super().__init__(message)
    self.reason = reason


class DownloadError(PrepareError):
  """tfds could not download a catalogue dataset (no network, server error)."""


class _StdoutToLog(io.TextIOBase):
  """A text stream whose lines become INFO log records (tfds prints while preparing)."""

  def write(self, text: str) -> int:
    """Logs each non-empty line of `text`; returns its length."""
    for line in text.splitlines():
      if line.strip():
        logging.info("%s", line.rstrip())
    return len(text)


def _candidates(spec: registry.DatasetSpec, tfds_name: str | None) -> list[str]:
  """tfds names that hold `spec`'s data, in order of preference (an explicit name: only it)."""
  if tfds_name:
    return [tfds_name]
  return [spec.meta.tfds_name] + ([spec.source.fallback] if spec.source.fallback else [])


def prepared_tfds_name(name: str, data_dir: str | None, tfds_name: str | None = None) -> str:
  """The tfds name of registered dataset `name` that is prepared in `data_dir` (the preferred
  one when none is: then `prepared_builder` prepares it)."""
  candidates = _candidates(registry.spec(name), tfds_name)
  for candidate in candidates:
    if tfds.builder(candidate, data_dir=data_dir).is_prepared():
      return candidate
  return candidates[0]


def prepared_builder(spec: registry.DatasetSpec, data_dir: str | None, *,
                     tfds_name: str | None = None, download: bool = True,
                     download_retries: int = 3, manual_dir: str | None = None
                     ) -> tfds.core.DatasetBuilder:
  """The prepared tfds builder of `spec`'s dataset, preparing (downloading) it if needed.

  Args:
    spec: the registry's spec of the dataset.
    data_dir: tfds data dir (None: tfds' default).
    tfds_name: read this tfds dataset instead of the registered one(s).
    download: whether a catalogue dataset may be downloaded.
    download_retries: tfds' retries of each download request.
    manual_dir: where local builders look for their files.

  Raises:
    FileNotFoundError: the data are not available; one line saying how to get them.
  """
  candidates = _candidates(spec, tfds_name)
  for candidate in candidates:
    builder = tfds.builder(candidate, data_dir=data_dir)
    if builder.is_prepared():
      return builder
  name, fallback = candidates[0], (candidates[1] if len(candidates) > 1 else None)
  root = builder.data_dir_root
  if spec.source.kind == "catalog" and not download:
    if fallback:
      logging.info("%s: download is False (config: data.options.download); preparing %r from "
                   "local files.",
                   spec.meta.name, fallback)
      return _prepare_fallback(spec, fallback, data_dir, manual_dir, root, "download is off")
    raise FileNotFoundError(
        f"{spec.meta.name}: tfds dataset {name!r} is not prepared in {root} and "
        f"download is False (config: data.options.download). {spec.source.how_to_get}")
  try:
    return _prepare_once(name, data_dir, spec, download_retries, manual_dir)
  except DownloadError as e:
    if not fallback:
      raise
    logging.info("%s: could not download %r (%s); preparing %r from local files instead.",
                 spec.meta.name, name, e.reason, fallback)
    return _prepare_fallback(spec, fallback, data_dir, manual_dir, root,
                             f"could not download {name!r}: {e.reason}")


def _prepare_fallback(spec: registry.DatasetSpec, fallback: str, data_dir: str | None,
                      manual_dir: str | None, root: str, why: str) -> tfds.core.DatasetBuilder:
  """Prepares the local fallback builder; one line naming both ways to get the data if not."""
  try:
    return _prepare_once(fallback, data_dir, spec, 0, manual_dir)
  except PrepareError as e:
    raise FileNotFoundError(
        f"{spec.meta.name}: not prepared in {root} ({why}) and no local copy to prepare "
        f"{fallback!r} from ({e.reason}). {spec.source.how_to_get}") from e


def _first_line(error: BaseException) -> str:
  return (str(error).splitlines() or [type(error).__name__])[0][:300]


def _prepare_once(tfds_name: str, data_dir: str | None, spec: registry.DatasetSpec, retries: int,
                  manual_dir: str | None) -> tfds.core.DatasetBuilder:
  """Prepares a dataset, once, even when several processes ask at the same time.

  Processes on one machine (data-parallel hosts, test workers, two users' jobs) can find the same
  dataset unprepared together; tfds would then build it twice into the same directory and one
  of them fails renaming its files. An exclusive file lock beside the dataset's directory makes
  the others wait and then find it prepared. What tfds prints meanwhile goes to the log.
  """
  builder = tfds.builder(tfds_name, data_dir=data_dir)
  lock_path = builder.data_dir.rstrip(os.sep) + ".prepare.lock"
  os.makedirs(os.path.dirname(lock_path), exist_ok=True)
  with open(lock_path, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      builder = tfds.builder(tfds_name, data_dir=data_dir)  # Re-read: it may be prepared now.
      if not builder.is_prepared():
        with _download_retries(retries), contextlib.redirect_stdout(_StdoutToLog()):
          builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
              manual_dir=manual_dir, try_download_gcs=False))
    except (AssertionError, FileNotFoundError) as e:
      raise PrepareError(f"{spec.meta.name}: cannot prepare {tfds_name!r}: {_first_line(e)} "
                         f"{spec.source.how_to_get}", _first_line(e)) from e
    except (OSError, requests.exceptions.RequestException) as e:
      reason = f"{type(e).__name__}: {_first_line(e)}"
      raise DownloadError(
          f"{spec.meta.name}: could not download tfds dataset {tfds_name!r} into "
          f"{builder.data_dir_root} ({reason}). {spec.source.how_to_get}", reason) from e
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
  return builder


@contextlib.contextmanager
def _download_retries(retries: int):
  """Bounds tfds' per-request retries while we download (restored afterwards)."""
  from tensorflow_datasets.core.download import downloader
  previous = downloader.MAX_RETRIES
  downloader.MAX_RETRIES = retries
  try:
    yield
  finally:
    downloader.MAX_RETRIES = previous
