"""The training stream's in-memory caches (`data.caching`): every cache gives the batches of the
uncached stream bit for bit (across epochs, on resume, over hosts), the automatic choice, and
one-line errors for a cache that cannot apply."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from calib_jax import data
from calib_jax.data import caching, options, pipeline, processors, registry
from test_data_pipeline import _assert_same, _take  # the stream helpers of the pipeline tests


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def _chosen(monkeypatch):
  """Records the cache each stream gets."""
  seen = []
  choose = caching.choose

  def spy(*args, **kwargs):
    seen.append(choose(*args, **kwargs))
    return seen[-1]

  monkeypatch.setattr(caching, "choose", spy)
  return seen


@pytest.mark.parametrize("cache", ["processed", None])
def test_processed_cache_gives_the_uncached_batches(data_dir, monkeypatch, cache):
  # digits: no crop, no flip: the training processing draws nothing at random.
  seen = _chosen(monkeypatch)
  kw = dict(batch_size=16, train=True, seed=3, data_dir=data_dir, max_examples=100,
            return_index=True)  # 6 batches per epoch, 4 records left out of each
  plain = _take(data.make_dataset("digits", "train", cache="none", **kw), 14)
  cached = _take(data.make_dataset("digits", "train", cache=cache, **kw), 14)
  _assert_same(cached, plain)
  for start in (5, 13):  # resumed inside an epoch's last batch and in the third epoch
    _assert_same(_take(data.make_dataset("digits", "train", cache=cache, start_batch=start,
                                         **kw), 14 - start), plain[start:])
  assert seen == ["none"] + ["processed"] * 3


def test_decoded_cache_gives_the_uncached_batches_with_augmentation(data_dir, monkeypatch):
  seen = _chosen(monkeypatch)
  kw = dict(batch_size=24, train=True, seed=5, data_dir=data_dir, max_examples=100,
            tfds_name="clutter_objects/tiny", objectness=True, context_rate=0.3,
            return_boxes=2, crop="pad", flip=True)  # random crop, flip and context samples
  plain = _take(data.make_dataset("clutter_objects", "train", cache="none", **kw), 10)
  auto = _take(data.make_dataset("clutter_objects", "train", **kw), 10)
  _assert_same(auto, plain)
  _assert_same(_take(data.make_dataset("clutter_objects", "train", start_batch=6, **kw), 4),
               plain[6:])
  assert seen == ["none", "decoded", "decoded"]
  # The recipe's inception crop decodes only its window of a JPEG: not cached automatically.
  del kw["crop"]
  _take(data.make_dataset("clutter_objects", "train", **kw), 1)
  assert seen[-1] == "none"


def test_each_host_caches_its_own_shard(data_dir):
  kw = dict(batch_size=8, train=True, seed=1, data_dir=data_dir, max_examples=70,
            process_count=2, return_index=True)
  for host in range(2):
    plain = _take(data.make_dataset("digits", "train", process_index=host, cache="none", **kw),
                  9)
    cached = _take(data.make_dataset("digits", "train", process_index=host, **kw), 9)
    _assert_same(cached, plain)
    assert set(np.concatenate([b["index"] for b in cached]) % 2) == {host}


def test_text_is_cached_after_tokenizing(monkeypatch):
  docs = [f"Document {i}: words, more words and number {i * 7}!".encode() for i in range(40)]

  def as_dataset(self, *args, **kwargs):
    del self, args, kwargs
    return tf.data.Dataset.from_tensor_slices({"text": docs, "label": np.arange(40) % 20})

  seen = _chosen(monkeypatch)
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    kw = dict(batch_size=8, train=True, seed=2, max_length=12, vocab_size=50)
    plain = _take(data.make_dataset("newsgroups20", "train", cache="none", **kw), 12)
    cached = _take(data.make_dataset("newsgroups20", "train", **kw), 12)
  _assert_same(cached, plain)
  assert seen == ["none", "processed"]


# ---------------------------------------------------------------------------------------------
# The choice and its errors.


def _choose(requested=None, **overrides):
  kw = dict(name="ds", has_images=True, random_processing=False, window_decoding=False,
            decoded_bytes=784, processed_bytes=3136, records=60000, records_left_out=32,
            shuffle_buffer=50000)
  kw.update(overrides)
  return caching.choose(requested, **kw)


def test_automatic_choice():
  assert _choose() == "processed"
  assert _choose(random_processing=True) == "decoded"
  assert _choose(random_processing=True, window_decoding=True) == "none"
  assert _choose(random_processing=True, decoded_bytes=None) == "none"  # shapes vary
  assert _choose(processed_bytes=None) == "decoded"
  # Over the memory budget: 1.2 GB of processed examples, then of decoded ones.
  big = caching.CACHE_MAX_BYTES // 60000 + 1
  assert _choose(processed_bytes=big) == "decoded"
  assert _choose(processed_bytes=big, decoded_bytes=big) == "none"
  assert _choose(has_images=False, processed_bytes=None) == "none"
  # An epoch that stops before the shard's end would drop the cache every epoch.
  assert _choose(shuffle_buffer=10, records_left_out=32) == "none"


def test_requested_caches_apply_or_say_why_not():
  assert _choose("none") == "none"
  assert _choose("decoded", window_decoding=True) == "decoded"  # asked for: the user's call
  assert _choose("processed", processed_bytes=10**9) == "processed"
  with pytest.raises(ValueError, match=r"ds: cache='processed' needs a training processing "
                                       r"without randomness .*use cache='decoded'"):
    _choose("processed", random_processing=True)
  with pytest.raises(ValueError, match=r"ds: cache='decoded' needs images"):
    _choose("decoded", has_images=False)
  with pytest.raises(ValueError, match=r"shuffle_buffer \(10\) must exceed the 32 records"):
    _choose("decoded", shuffle_buffer=10)


def test_bad_cache_option_lists_the_choices(data_dir):
  with pytest.raises(ValueError, match=r"digits: cache must be one of \('processed', "
                                       r"'decoded', 'none'\) or None"):
    data.make_dataset("digits", "train", batch_size=4, train=True, data_dir=data_dir,
                      cache="yes")
  with pytest.raises(ValueError, match="cache='processed' needs a training processing"):
    data.make_dataset("clutter_objects", "train", batch_size=4, train=True, data_dir=data_dir,
                      tfds_name="clutter_objects/tiny", cache="processed")
  assert options.CACHE_MODES == caching.CACHE_MODES


def test_processors_say_what_caching_may_keep():
  def processor(name, **opts):
    spec = registry.spec(name)
    return processors.make_processor(
        spec, options.PipelineOptions.create(spec.meta, opts), train=True)

  assert not caching.processing_is_random(processor("digits"))
  assert not caching.processing_is_random(processor("digits", crop="center"))
  assert caching.processing_is_random(processor("digits", flip=True))
  assert caching.processing_is_random(processor("digits", crop="pad"))
  assert caching.processing_is_random(processor("cifar10"))  # pad crop + flip
  assert caching.processing_is_random(processor("clutter_objects", crop="none", flip=False,
                                                context_rate=0.1))
  assert caching.processing_is_random(processor("voc2012_seg"))
  assert not caching.processing_is_random(processor("newsgroups20"))
  # Decoding only a window of each JPEG: the inception crop, and a processor that does not say.
  assert caching.decodes_window(processor("clutter_objects"))  # its recipe's inception crop
  assert not caching.decodes_window(processor("clutter_objects", crop="pad"))
  assert not caching.decodes_window(processor("cifar10"))
  assert not caching.decodes_window(processor("voc2012_seg"))
  assert not caching.decodes_window(processor("newsgroups20"))
  assert caching.decodes_window(object()) and caching.processing_is_random(object())


def test_element_bytes():
  spec = {"image": tf.TensorSpec([28, 28, 1], tf.float32), "label": tf.TensorSpec([], tf.int32)}
  assert caching.element_bytes(spec) == 28 * 28 * 4 + 4
  assert caching.element_bytes({"image": tf.TensorSpec([None, 28, 1], tf.uint8)}) is None
  assert caching.decoded_bytes((32, 32, 3)) == 3072 and caching.decoded_bytes(None) is None
  assert pipeline.caching is caching
