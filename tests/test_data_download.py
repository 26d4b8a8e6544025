"""tfds catalogue datasets download on first use; offline that fails fast, in one line.

No test touches the network: the download is stood in for at tfds' builder, or at the socket
layer under tfds' real downloader (as a machine without network fails: name resolution).
"""
import logging
import os
import shutil
import socket
import time
import types

import numpy as np
import pytest
import requests
import tensorflow_datasets as tfds
import urllib3
from tensorflow_datasets.core.download import download_manager
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from calib_jax import data
from calib_jax.data import prepare


def _open(data_dir, **options):
  return data.make_dataset("mnist", "test", batch_size=8, train=False, data_dir=str(data_dir),
                           process_index=0, process_count=1, **options)


def test_unprepared_catalogue_dataset_takes_the_download_path(tmp_path, monkeypatch):
  calls = []

  def stand_in(self, *args, **kwargs):
    calls.append(self.name)
    raise requests.exceptions.ConnectionError("stand-in: download attempted")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", stand_in)
  with pytest.raises(FileNotFoundError, match=r"mnist: could not download tfds dataset 'mnist'"):
    _open(tmp_path)
  assert calls == ["mnist"]


def test_download_switch_off_fails_without_trying(tmp_path, monkeypatch):
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                      lambda *a, **k: pytest.fail("download attempted"))
  with pytest.raises(FileNotFoundError,
                     match=r"download is False \(config: data.options.download\)") as info:
    _open(tmp_path, download=False)
  assert "tfds build mnist" in str(info.value)


def test_offline_download_fails_within_seconds(tmp_path, monkeypatch):
  """Name resolution fails on every attempt, as on a machine without network: tfds' real
  downloader gives up after `download_retries` retries (tfds' default, 10, takes ~205 s)."""
  attempts = []

  def no_network(*args, **kwargs):
    attempts.append(args[0] if args else None)
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (stand-in)")

  monkeypatch.setattr(urllib3.util.connection, "create_connection", no_network)
  start = time.monotonic()
  with pytest.raises(FileNotFoundError) as info:
    _open(tmp_path, download_retries=2)
  elapsed = time.monotonic() - start
  message = str(info.value)
  assert elapsed < 30, elapsed
  assert "could not download tfds dataset 'mnist'" in message and "tfds build mnist" in message
  assert len(message.splitlines()) == 1
  assert 0 < len(attempts) <= 3 * 4   # (1 try + 2 retries) for each of mnist's 4 files at most


# ---------------------------------------------------------------------------------------------
# fashion_mnist: tfds' catalogue builder when it downloads, the Debian files when it cannot.


@pytest.fixture
def fashion(tmp_path, monkeypatch):
  """Tiny stand-ins for the four Fashion-MNIST idx files (12 train, 5 test examples), a Debian
  folder that is empty unless a test fills it, and a record of download attempts."""
  from calib_jax.data.builders import fashion_mnist
  from test_data_offline import _write_idx
  rng = np.random.default_rng(0)
  files = tmp_path / "idx"
  files.mkdir()
  for prefix, n in (("train", 12), ("t10k", 5)):
    _write_idx(files / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), 0x803)
    _write_idx(files / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n), 0x801)
  debian = tmp_path / "debian"
  debian.mkdir()
  monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", str(debian))
  downloads = []
  return types.SimpleNamespace(files=files, debian=debian, downloads=downloads,
                               data_dir=tmp_path / "tfds")


def _stand_in_download(monkeypatch, fashion, online):
  """tfds' download of the catalogue files: served from the idx fixtures, or failing as it does
  offline (name resolution, requests.ConnectionError)."""

  def download_and_extract(self, urls):
    fashion.downloads.append(sorted(urls))
    if not online:
      raise requests.exceptions.ConnectionError(
          "Failed to resolve 'fashion-mnist.s3-website.eu-central-1.amazonaws.com' (stand-in)")
    return {k: self.extract(str(fashion.files / url.rsplit("/", 1)[-1])) for k, url in urls.items()}

  monkeypatch.setattr(download_manager.DownloadManager, "download_and_extract",
                      download_and_extract)
  # tfds' builder states the real files' sizes instead of reading them.
  monkeypatch.setattr(tfds_mnist, "_TRAIN_EXAMPLES", 12)
  monkeypatch.setattr(tfds_mnist, "_TEST_EXAMPLES", 5)


def _test_split(fashion, **options):
  return list(data.make_dataset("fashion_mnist", "test", batch_size=8, train=False,
                                data_dir=str(fashion.data_dir), process_index=0,
                                process_count=1, **options))


def _fallback_lines(caplog):
  return [r.getMessage() for r in caplog.records if "from local files" in r.getMessage()]


def test_fashion_mnist_online_uses_the_catalogue_builder(fashion, monkeypatch, caplog):
  for name in os.listdir(fashion.files):  # The Debian files exist too: the download wins.
    shutil.copy(fashion.files / name, fashion.debian / name)
  _stand_in_download(monkeypatch, fashion, online=True)
  caplog.set_level(logging.INFO)
  batches = _test_split(fashion)
  assert len(fashion.downloads) == 1 and len(fashion.downloads[0]) == 4
  assert int(np.sum([b["mask"] for b in batches])) == 5
  assert tfds.builder("fashion_mnist", data_dir=str(fashion.data_dir)).is_prepared()
  assert not tfds.builder("fashion_mnist_debian", data_dir=str(fashion.data_dir)).is_prepared()
  assert _fallback_lines(caplog) == []
  assert prepare.prepared_tfds_name("fashion_mnist", str(fashion.data_dir)) == "fashion_mnist"


def test_fashion_mnist_offline_falls_back_to_the_debian_files(fashion, monkeypatch, caplog):
  for name in os.listdir(fashion.files):
    shutil.copy(fashion.files / name, fashion.debian / name)
  _stand_in_download(monkeypatch, fashion, online=False)
  caplog.set_level(logging.INFO)
  batches = _test_split(fashion)
  assert len(fashion.downloads) == 1
  assert int(np.sum([b["mask"] for b in batches])) == 5
  lines = _fallback_lines(caplog)
  assert len(lines) == 1 and "could not download 'fashion_mnist'" in lines[0]
  assert "'fashion_mnist_debian'" in lines[0]
  assert not tfds.builder("fashion_mnist", data_dir=str(fashion.data_dir)).is_prepared()
  assert prepare.prepared_tfds_name("fashion_mnist", str(fashion.data_dir)) == \
      "fashion_mnist_debian"
  # Next time the prepared local copy is read as it is: no download is tried.
  caplog.clear()
  assert int(np.sum([b["mask"] for b in _test_split(fashion)])) == 5
  assert len(fashion.downloads) == 1 and _fallback_lines(caplog) == []


def test_fashion_mnist_download_switched_off_prepares_the_debian_files(fashion, monkeypatch):
  for name in os.listdir(fashion.files):
    shutil.copy(fashion.files / name, fashion.debian / name)
  _stand_in_download(monkeypatch, fashion, online=True)
  assert int(np.sum([b["mask"] for b in _test_split(fashion, download=False)])) == 5
  assert fashion.downloads == []


def test_fashion_mnist_neither_way_is_one_line_naming_both(fashion, monkeypatch):
  _stand_in_download(monkeypatch, fashion, online=False)  # Offline, and the Debian folder empty.
  with pytest.raises(FileNotFoundError) as info:
    _test_split(fashion)
  message = str(info.value)
  assert len(message.splitlines()) == 1
  assert message.startswith("fashion_mnist: ") and str(fashion.data_dir) in message
  assert "network access" in message and "apt-get install -y dataset-fashion-mnist" in message
  assert "could not download 'fashion_mnist'" in message
