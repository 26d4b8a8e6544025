"""tfds catalogue datasets download on first use; offline that fails fast, in one line.

No test touches the network: the download is stood in for at tfds' builder, or at the socket
layer under tfds' real downloader (as a machine without network fails: name resolution).
"""
import socket
import time

import pytest
import requests
import tensorflow_datasets as tfds
import urllib3

from calib_jax import data


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
