"""Golden batches: the input pipeline gives the same pixels, labels, boxes, objectness, tokens and
order as before its split into crops/processors/options modules (House redesign II).

Each case's fingerprint was computed by the pipeline *before* that refactor (commit 760608b,
TensorFlow 2.21.0, tensorflow-datasets 4.9.10, scikit-learn 1.9.1, NumPy 2.4.6): a SHA-256 of
the per-array SHA-256s (bytes, dtype and shape) of the first batches of each stream. Together
the cases run every crop of `crops.CROPS`, the segmentation train/eval crops (the recipe's eval
shape and label map included), the text tokeniser, the ALS options, resume and host sharding.
A change of those library versions may change float results in the last bit; the test still
compares, and its message names the versions so the change can be judged and GOLDEN re-recorded
with the pipeline of a commit you trust.
"""
import contextlib
import hashlib
import io
import itertools
import json
import tarfile

import numpy as np
import pytest
import sklearn
import tensorflow as tf
import tensorflow_datasets as tfds

from calib_jax import data

RECORDED_WITH = {"tensorflow": "2.21.0", "tensorflow_datasets": "4.9.10", "sklearn": "1.9.1",
                 "numpy": "2.4.6"}
_VERSIONS = {"tensorflow": tf.__version__, "tensorflow_datasets": tfds.__version__,
             "sklearn": sklearn.__version__, "numpy": np.__version__}

GOLDEN = {
    "digits_train": "f8e356f603be533ebe2f20ed917921e9",
    "digits_train_resume": "eac62e81a59cd0df31c49145294b2068",
    "digits_train_pad_flip": "8f9c53ec9c9ff30f0a2846c055920f54",
    "digits_train_inception12": "f1e0e13a179e21d86fd8487d13c94417",
    "digits_train_resize_crop": "d75e18a2ee6b3142bab7ea2debe5725f",
    "digits_eval": "2c46ea4d90c1c66bc58cdb5b28852f24",
    "digits_eval_host1": "a960543382de6c44eca67ae64e77343e",
    "digits_eval_img12": "1f8532e855f7779be0f10b166c6ecc4b",
    "digits_train_max64_host": "a99f08613af534e4ec7dc9b02aaecb86",
    "clutter_train_alsctx": "51730eeb32aad39b727e8223bf2c9d7d",
    "clutter_train_mask": "68a95eed2476eaf5cef531ec4bef92a4",
    "clutter_train_pad": "380e6a9d1444c9cf044944877b9f939b",
    "clutter_train_resize_crop": "a67d847f45ed58cf41a6bd3c059eb173",
    "clutter_train_none_scale": "037521ac205ed6bf52c2d6177b09d900",
    "clutter_eval_remove": "ebfc2d1cb19cd13bfd7283fd2301fcd0",
    "clutter_eval_img40": "4b6d5398e2240d00cfbcf2e8576a4615",
    "seg_train": "756e3383d9cfbd5e96ee517046bb45cb",
    "seg_train_flip_img": "e2958218ac9f40562ae931ae5ef91716",
    "seg_eval": "eb76aa92779c35cb1e476964024db663",
    "seg_eval_img24": "69f845f9fb88473fd4995b378fa1959c",
    "news_train": "db1134356e587f91bd89fe49d3dc6b97",
    "news_eval_opts": "06c1b5b6c99c2ef141d14fc372fe9d61",
    "cub_eval_mock": "93a760e6279c668643372e27347ea34a",
    "cub_train_mock": "573eac391c114bb040ec7d66da7eaa36",
    "city_eval_mock": "4012f55d101464ad0a6292b6875c0234",
    "city_train_mock": "ba351a02b36b7c31b07f952071b70272",
    "voc_eval_mock": "91f61acdbb627c0d3227184b98fbb00e",
    "voc_train_mock": "e095e7a241cd70abad1268e77a4ba911",
    "imagenet_train_mock": "672d985f48c1d265bdc39d0d6c00c6d6",
}

_TINY = dict(tfds_name="clutter_objects/tiny")
# case: (dataset, split, train, batches (None: the whole pass), make_dataset arguments, mock)
CASES = {
    "digits_train": ("digits", "train", True, 3, dict(batch_size=16, seed=3)),
    "digits_train_resume": ("digits", "train", True, 3, dict(batch_size=16, seed=3,
                                                             start_batch=79)),
    "digits_train_pad_flip": ("digits", "train", True, 2, dict(batch_size=16, seed=1, crop="pad",
                                                               flip=True)),
    "digits_train_inception12": ("digits", "train", True, 2, dict(
        batch_size=16, seed=1, crop="inception", image_size=12)),
    "digits_train_resize_crop": ("digits", "train", True, 2, dict(
        batch_size=16, seed=1, crop="resize_crop", image_size=(6, 7))),
    "digits_eval": ("digits", "test", False, None, dict(batch_size=64, return_index=True)),
    "digits_eval_host1": ("digits", "val", False, None, dict(batch_size=32, process_index=1,
                                                             process_count=3)),
    "digits_eval_img12": ("digits", "test", False, 2, dict(batch_size=64, image_size=12)),
    "digits_train_max64_host": ("digits", "train", True, 5, dict(
        batch_size=8, seed=2, max_examples=64, process_index=1, process_count=2,
        return_index=True)),
    "clutter_train_alsctx": ("clutter_objects", "train", True, 3, dict(
        batch_size=32, seed=5, objectness=True, context_rate=0.3, return_boxes=3,
        return_index=True, **_TINY)),
    "clutter_train_mask": ("clutter_objects", "train", True, 3, dict(
        batch_size=32, seed=6, mask_variant=True, return_boxes=2, **_TINY)),
    "clutter_train_pad": ("clutter_objects", "train", True, 2, dict(
        batch_size=32, seed=7, crop="pad", flip=True, objectness=True, return_boxes=2, **_TINY)),
    "clutter_train_resize_crop": ("clutter_objects", "train", True, 2, dict(
        batch_size=32, seed=8, crop="resize_crop", objectness=True, context_rate=0.5,
        mask_variant=True, return_boxes=2, **_TINY)),
    "clutter_train_none_scale": ("clutter_objects", "train", True, 2, dict(
        batch_size=32, seed=9, crop="inception", crop_scale=(0.5, 0.9), crop_ratio=(0.5, 2.0),
        image_size=24, objectness=True, **_TINY)),
    "clutter_eval_remove": ("clutter_objects", "test", False, None, dict(
        batch_size=32, remove_objects=True, objectness=True, return_boxes=2, **_TINY)),
    "clutter_eval_img40": ("clutter_objects", "val", False, None, dict(
        batch_size=32, image_size=40, objectness=True, **_TINY)),
    "seg_train": ("clutter_objects_seg", "train", True, 3, dict(batch_size=16, seed=4, **_TINY)),
    "seg_train_flip_img": ("clutter_objects_seg", "train", True, 2, dict(
        batch_size=16, seed=4, flip=True, image_size=(20, 28), **_TINY)),
    "seg_eval": ("clutter_objects_seg", "test", False, None, dict(batch_size=32,
                                                                  return_index=True, **_TINY)),
    "seg_eval_img24": ("clutter_objects_seg", "val", False, None, dict(batch_size=32,
                                                                       image_size=24, **_TINY)),
    "news_train": ("newsgroups20", "train", True, 3, dict(batch_size=16, seed=1)),
    "news_eval_opts": ("newsgroups20", "train", False, None, dict(batch_size=16, max_length=20,
                                                                   vocab_size=97)),
    "cub_eval_mock": ("cub200", "test", False, None, dict(batch_size=4, image_size=32,
                                                          objectness=True, return_boxes=1), "cub"),
    "cub_train_mock": ("cub200", "train", True, 2, dict(batch_size=4, seed=2, objectness=True,
                                                        return_boxes=1), "cub"),
    "city_eval_mock": ("cityscapes", "val", False, None, dict(batch_size=1), "city"),
    "city_train_mock": ("cityscapes", "train", True, 2, dict(batch_size=2, seed=3,
                                                             image_size=(16, 24)), "city"),
    "voc_eval_mock": ("voc2012_seg", "val", False, None, dict(batch_size=2), "voc"),
    "voc_train_mock": ("voc2012_seg", "train", True, 2, dict(batch_size=2, seed=1,
                                                             image_size=24), "voc"),
    "imagenet_train_mock": ("imagenet2012", "train", True, 2, dict(batch_size=4, seed=3,
                                                                   image_size=40), "tfds"),
}


def _news_archive(path):
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "Space", "NASA", "hockey", "god", "car", "x11"]
  with tarfile.open(path, "w:gz") as tar:
    for g in range(20):
      for i in range(5):
        body = "From: a\nSubject: s\n\n" + " ".join(rng.choice(words, 30 + 7 * i)) + f" g{g}\n"
        raw = body.encode("latin-1")
        info = tarfile.TarInfo(f"20_newsgroups/group.{chr(97 + g)}/{1000 + i}")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))


def _mock(kind):
  """tfds stand-ins: fixed random examples for catalogue datasets (as the dump that recorded
  the fingerprints used)."""
  if kind == "tfds":
    return tfds.testing.mock_data(num_examples=6)
  if kind == "cub":
    rng = np.random.default_rng(0)
    lo = rng.uniform(0, 0.5, (6, 2))
    bbox = np.concatenate([lo, lo + rng.uniform(0.1, 0.5, (6, 2))], axis=1).astype(np.float32)
    examples = {"image": rng.integers(0, 256, (6, 30, 50, 3)).astype(np.uint8),
                "label": np.arange(6) * 30, "bbox": bbox}
  elif kind == "city":
    rng = np.random.default_rng(1)
    raw = rng.choice(np.r_[np.arange(34), [255]], size=(3, 20, 40, 1)).astype(np.uint8)
    examples = {"image_left": rng.integers(0, 256, (3, 20, 40, 3)).astype(np.uint8),
                "segmentation_label": raw, "image_id": np.array([b"x"] * 3)}
  else:
    rng = np.random.default_rng(2)
    seg = rng.choice(np.r_[np.arange(21), 255], size=(3, 40, 60, 1)).astype(np.uint8)
    examples = {"image": rng.integers(0, 256, (3, 40, 60, 3)).astype(np.uint8),
                "segmentation_mask": seg, "file_name": np.array([b"x"] * 3)}

  def as_dataset(self, *args, **kwargs):
    del self, args, kwargs
    return tf.data.Dataset.from_tensor_slices(examples)
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("golden")
  (root / "manual").mkdir()
  _news_archive(str(root / "manual" / "20_newsgroups.tar.gz"))
  return {"data_dir": str(root / "tfds"), "news_dir": str(root / "news"),
          "manual": str(root / "manual")}


def _fingerprint(batches):
  per_batch = [{k: hashlib.sha256(np.ascontiguousarray(v).tobytes() + str(v.dtype).encode()
                                  + str(v.shape).encode()).hexdigest()
                for k, v in sorted(b.items())} for b in batches]
  return hashlib.sha256(json.dumps(per_batch, sort_keys=True).encode()).hexdigest()[:32]


@pytest.mark.parametrize("case", sorted(CASES))
def test_batches_are_bit_identical_to_the_recorded_pipeline(case, dirs):
  name, split, train, count, kwargs, *mock = CASES[case]
  if name == "newsgroups20":
    kwargs = dict(kwargs, data_dir=dirs["news_dir"], manual_dir=dirs["manual"])
  elif not mock:
    kwargs = dict(kwargs, data_dir=dirs["data_dir"])
  kwargs.setdefault("process_index", 0)
  kwargs.setdefault("process_count", 1)
  with _mock(mock[0]) if mock else contextlib.nullcontext():
    stream = data.make_dataset(name, split, train=train, **kwargs)
    batches = list(itertools.islice(stream, count)) if count else list(stream)
  # Always compared, whatever the library versions: a new TensorFlow/tfds/sklearn/NumPy that
  # changes a pixel is a change of the data the models see, and should be looked at.
  versions = ("" if _VERSIONS == RECORDED_WITH else
              f"; recorded with {RECORDED_WITH}, running {_VERSIONS}: if the library upgrade "
              "explains it, re-record GOLDEN with a pipeline commit you trust")
  assert _fingerprint(batches) == GOLDEN[case], f"{case}: the batches changed{versions}"
