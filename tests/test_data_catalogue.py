"""Every registered catalogue pipeline on tfds mock data (classification, CUB boxes,
segmentation, Cityscapes label ids), and bad stored data: one line naming the dataset, the split
and the example."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from calib_jax import data
from test_data_pipeline import _assert_same, _take  # the stream helpers of the pipeline tests


# ---------------------------------------------------------------------------------------------
# Catalogue datasets on tfds mock data.


@pytest.mark.parametrize("name,size,channels,kw", [
    ("cifar10", 32, 3, {}),
    ("cifar100", 32, 3, {}),
    ("mnist", 28, 1, {}),
    ("imagenet2012", 40, 3, {"image_size": 40}),
])
def test_classification_pipelines_on_mock_data(name, size, channels, kw):
  meta = data.info(name)
  with tfds.testing.mock_data(num_examples=6):
    train = _take(data.make_dataset(name, "train", batch_size=4, train=True, seed=3, **kw), 2)
    again = _take(data.make_dataset(name, "train", batch_size=4, train=True, seed=3, **kw), 2)
    evals = list(data.make_dataset(name, "test", batch_size=4, train=False, **kw))
  _assert_same(train, again)
  for batch in train + evals:
    assert batch["image"].shape == (4, size, size, channels)
    assert batch["image"].dtype == np.float32 and batch["label"].dtype == np.int32
    assert batch["mask"].dtype == bool and batch["mask"].shape == (4,)
    labels = batch["label"][batch["mask"]]
    assert ((labels >= 0) & (labels < meta.num_classes)).all()
    lo = (0 - np.array(meta.mean)) / np.array(meta.std)
    hi = (1 - np.array(meta.mean)) / np.array(meta.std)
    valid = batch["image"][batch["mask"]]
    assert (valid >= lo - 1e-4).all() and (valid <= hi + 1e-4).all()
  assert [int(b["mask"].sum()) for b in evals] == [4, 2]


def test_cub200_boxes_give_the_objectness_of_the_eval_crop():
  rng = np.random.default_rng(0)
  lo = rng.uniform(0, 0.5, (6, 2))
  bbox = np.concatenate([lo, lo + rng.uniform(0.1, 0.5, (6, 2))], axis=1).astype(np.float32)

  def as_dataset(self, *args, **kwargs):  # tfds' random boxes are invalid (min > max)
    del self, args, kwargs
    return tf.data.Dataset.from_tensor_slices({
        "image": rng.integers(0, 256, (6, 30, 50, 3)).astype(np.uint8),
        "label": np.arange(6) * 30, "bbox": bbox})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    evals = list(data.make_dataset("cub200", "test", batch_size=4, train=False,
                                   image_size=32, objectness=True))
    train = next(data.make_dataset("cub200", "train", batch_size=4, train=True,
                                   image_size=32, objectness=True, return_boxes=1))
  resize = round(32 / 0.875)  # 37: the centre crop starts at pixel (37 - 32) // 2 = 2
  a, b = 2 / resize, (2 + 32) / resize
  got = np.concatenate([e["objectness"][e["mask"]] for e in evals])
  expected = [data.objectness(box[None], [a, a, b, b]) for box in bbox]
  np.testing.assert_allclose(got, expected, atol=1e-6)
  assert train["image"].shape == (4, 32, 32, 3)
  for o, box in zip(train["objectness"], train["boxes"]):
    assert o == pytest.approx(data.objectness(box, [0, 0, 1, 1]), abs=1e-6)


def _voc_mock(seg):
  def as_dataset(self, *args, **kwargs):
    del self, args, kwargs
    n = len(seg)
    return tf.data.Dataset.from_tensor_slices({
        "image": np.full(seg.shape[:3] + (3,), 100, np.uint8), "segmentation_mask": seg,
        "file_name": np.array([b"x"] * n)})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def test_segmentation_eval_pads_with_ignore_and_train_crops():
  rng = np.random.default_rng(0)
  seg = rng.choice(np.r_[np.arange(21), 255], size=(3, 40, 60, 1)).astype(np.uint8)
  with _voc_mock(seg):
    batches = list(data.make_dataset("voc2012_seg", "val", batch_size=2, train=False,
                                     image_size=64))
    train = next(data.make_dataset("voc2012_seg", "train", batch_size=2, train=True,
                                   image_size=24))
  assert len(batches) == 2 and batches[0]["label"].shape == (2, 64, 64)
  for i, (label, mask) in enumerate(zip(batches[0]["label"], batches[0]["mask"])):
    raw = seg[i, :, :, 0].astype(np.int32)
    expected_mask = np.zeros((64, 64), bool)
    expected_mask[:40, :60] = raw != 255
    np.testing.assert_array_equal(mask, expected_mask)
    np.testing.assert_array_equal(label[:40, :60], np.where(raw == 255, 0, raw))
    assert not label[40:].any() and not label[:, 60:].any()
  assert batches[1]["mask"][0].sum() == (seg[2] != 255).sum() and not batches[1]["mask"][1].any()
  image = batches[0]["image"][0]
  mean = np.array(data.info("voc2012_seg").mean)
  np.testing.assert_allclose(image[50, 62], 0.0, atol=1e-5)  # padding = mean pixel
  np.testing.assert_allclose(image[0, 0], (100 / 255 - mean) / np.array(data.info(
      "voc2012_seg").std), atol=1e-5)
  assert train["label"].shape == (2, 24, 24) and train["label"].max() <= 20
  assert train["image"].shape == (2, 24, 24, 3)


def test_out_of_range_segmentation_label_names_dataset_and_value():
  seg = np.zeros((2, 8, 8, 1), np.uint8)
  seg[1, 3, 3] = 30
  with _voc_mock(seg):
    with pytest.raises(ValueError, match=r"voc2012_seg: label 30 out of range \[0, 21\)"):
      list(data.make_dataset("voc2012_seg", "val", batch_size=2, train=False, image_size=8))


def test_out_of_range_classification_label_names_dataset_and_value():
  def as_dataset(self, *args, **kwargs):
    del self, args, kwargs
    return tf.data.Dataset.from_tensor_slices({
        "image": np.zeros((4, 32, 32, 3), np.uint8), "label": np.array([1, 12, 3, 4]),
        "id": np.array([b"a"] * 4)})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    with pytest.raises(ValueError, match=r"cifar10: label 12 out of range \[0, 10\)"):
      list(data.make_dataset("cifar10", "test", batch_size=4, train=False))


# Official Cityscapes labelIds -> trainIds (cityscapesScripts labels.py), restated here.
_CITYSCAPES = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
               24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}


def test_cityscapes_maps_label_ids_to_train_ids():
  raw = np.concatenate([np.arange(34), [255] * 6]).astype(np.uint8).reshape(1, 4, 10, 1)

  def as_dataset(self, *args, **kwargs):
    del self, args, kwargs
    return tf.data.Dataset.from_tensor_slices({
        "image_left": np.zeros((1, 4, 10, 3), np.uint8), "segmentation_label": raw,
        "image_id": np.array([b"x"])})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    batch = next(data.make_dataset("cityscapes", "val", batch_size=1, train=False,
                                   image_size=(4, 10)))
  expected = np.array([_CITYSCAPES.get(int(v), 255) for v in raw.ravel()]).reshape(4, 10)
  np.testing.assert_array_equal(batch["mask"][0], expected != 255)
  np.testing.assert_array_equal(batch["label"][0], np.where(expected == 255, 0, expected))


# ---------------------------------------------------------------------------------------------
# Bad data: one line naming the dataset, the split and the example.


def _cifar_examples(images, labels):
  """A stand-in for cifar10's stored examples (uint8 images of any shape)."""
  def as_dataset(self, *args, **kwargs):
    del self, args, kwargs
    return tf.data.Dataset.from_generator(
        lambda: ({"image": im, "label": lab, "id": b"x"} for im, lab in zip(images, labels)),
        output_signature={"image": tf.TensorSpec([None, None, 3], tf.uint8),
                          "label": tf.TensorSpec([], tf.int64),
                          "id": tf.TensorSpec([], tf.string)})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def test_out_of_range_label_in_training_names_split_and_example():
  labels = [1, 2, 3, 4, 5, 6, 10, 7]
  with _cifar_examples([np.zeros((32, 32, 3), np.uint8)] * 8, labels):
    stream = data.make_dataset("cifar10", "train", batch_size=8, train=True, seed=0)
    with pytest.raises(data.DataError, match=r"^cifar10: label 10 out of range \[0, 10\) at "
                       r"example 6 of cifar10 split 'train' \(1 bad value"):
      next(stream)  # The first batch holds the bad example: it is never returned.


def test_image_of_the_wrong_shape_names_split_and_example():
  images = [np.zeros((32, 32, 3), np.uint8)] * 5
  images[3] = np.zeros((31, 32, 3), np.uint8)
  with _cifar_examples(images, [0] * 5):
    with pytest.raises(data.DataError) as info:
      list(data.make_dataset("cifar10", "test", batch_size=2, train=False))
  assert str(info.value) == ("cifar10: image of shape (31, 32, 3) at example 3 of cifar10 split "
                             "'test'; the dataset's images are (32, 32, 3).")


def test_empty_split_is_one_line_before_any_batch():
  with _cifar_examples([], []):
    for train in (True, False):
      with pytest.raises(data.DataError, match=r"^cifar10 split 'test' is empty \(0 examples\)"):
        data.make_dataset("cifar10", "test", batch_size=2, train=train)
