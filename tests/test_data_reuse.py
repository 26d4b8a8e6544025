"""What the input pipeline builds once per process (`data.reuse`): an evaluation split's pipeline
and a split's count are built again only when their arguments or the prepared files change."""
import glob
import os

import numpy as np
import pytest

from calib_jax import data
from calib_jax.data import pipeline, reuse


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def _prepared_files(data_dir):
  """The folder of the digits' prepared files (dataset_info.json and the records)."""
  (info,) = glob.glob(os.path.join(data_dir, "*", "*", "dataset_info.json"))
  return os.path.dirname(info)


def _counting_reads(monkeypatch):
  reads = []
  read_split = pipeline.read_split

  def spy(*args, **kwargs):
    reads.append(args[1])
    return read_split(*args, **kwargs)

  monkeypatch.setattr(pipeline, "read_split", spy)
  return reads


def test_an_evaluation_split_is_built_once_and_read_again_by_each_pass(data_dir):
  first = data.eval_pipeline("digits", "val", batch_size=16, data_dir=data_dir)
  assert data.eval_pipeline("digits", "val", batch_size=16, data_dir=data_dir) is first
  # Every argument is part of what was built.
  for other in (dict(batch_size=8), dict(batch_size=16, max_examples=10),
                dict(batch_size=16, process_index=1, process_count=2)):
    assert data.eval_pipeline("digits", "val", data_dir=data_dir, **other) is not first
  assert data.eval_pipeline("digits", "test", batch_size=16, data_dir=data_dir) is not first
  # Each pass reads the whole split from its start, as a pipeline built afresh does.
  passes = [list(first.batches()) for _ in range(2)]
  fresh = list(data.make_dataset("digits", "val", batch_size=16, train=False,
                                 data_dir=data_dir))
  assert len(fresh) == first.batches().num_batches
  for batches in passes:
    assert len(batches) == len(fresh)
    for batch, expected in zip(batches, fresh):
      assert batch.keys() == expected.keys()
      for key in batch:
        np.testing.assert_array_equal(batch[key], expected[key])


def test_a_dataset_whose_files_changed_is_read_afresh(data_dir, monkeypatch):
  before = data.eval_pipeline("digits", "val", batch_size=4, data_dir=data_dir)
  reads = _counting_reads(monkeypatch)
  count = data.num_examples("digits", "val", data_dir=data_dir)
  assert data.num_examples("digits", "val", data_dir=data_dir) == count
  assert data.eval_pipeline("digits", "val", batch_size=4, data_dir=data_dir) is before
  assert len(reads) == 1  # the count, once
  # A file of the prepared dataset rewritten (as preparing it again would): built afresh.
  info = os.path.join(_prepared_files(data_dir), "dataset_info.json")
  stat = os.stat(info)
  os.utime(info, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
  after = data.eval_pipeline("digits", "val", batch_size=4, data_dir=data_dir)
  assert after is not before
  assert data.num_examples("digits", "val", data_dir=data_dir) == count
  assert len(reads) == 3  # the new pipeline's and the count's
  assert after.batches().num_examples == count


def test_reused_keeps_the_most_recent_values_and_never_stores_an_unchecked_key(tmp_path):
  built = []

  def build(value):
    return lambda: built.append(value) or value

  store = reuse.Reused(capacity=2)
  for key in ("a", "b", "a", "c", "a", "b"):  # "b" is the least recently used when "c" comes
    assert store.get(key, build(key)) == key
  assert built == ["a", "b", "c", "b"] and len(store) == 2
  for _ in range(2):
    store.get(None, build("unchecked"))
  assert built[-2:] == ["unchecked", "unchecked"] and len(store) == 2
  # A part of a key by identity: equal values are other keys, the same object the same key.
  spec, equal = {"name": "digits"}, {"name": "digits"}
  assert reuse.ByIdentity(spec) == reuse.ByIdentity(spec) != reuse.ByIdentity(equal)
  assert store.get(("files", reuse.ByIdentity(spec)), build("spec")) == "spec"
  assert store.get(("files", reuse.ByIdentity(equal)), build("equal")) == "equal"
  assert store.get(("files", reuse.ByIdentity(spec)), build("again")) == "spec"
  # What says the files are the same: names, sizes and times of a local folder's entries.
  assert reuse.local_files("gs://a-bucket/digits/1.0.0") is None
  assert reuse.local_files(str(tmp_path / "missing")) is None
  empty = reuse.local_files(str(tmp_path))
  (tmp_path / "shard").write_bytes(b"1")
  assert reuse.local_files(str(tmp_path)) not in (empty, None)
