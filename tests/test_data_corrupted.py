"""The pre-computed corrupted sets (tfds cifar10_corrupted, imagenet2012_corrupted): their names
against tfds' and calib_jax.shift's, their streams in the clean test stream's form (on tfds mock
data), and one-line errors for bad names, a set of another dataset, and missing data (no test
touches the network)."""
import numpy as np
import pytest
import requests
import tensorflow as tf
import tensorflow_datasets as tfds
import urllib3

from calib_jax import config as config_lib
from calib_jax import data, shift
from calib_jax.data import corrupted
from calib_jax.experiment import problems
from calib_jax.experiment.data import DataRecipe
from calib_jax.training import parallel


def _mock(images, labels, read=None):
  """tfds mock data serving `images` / `labels` as every split of every builder; the names of
  the builders read go to `read`."""
  def as_dataset(self, *args, **kwargs):
    del args
    if read is not None:
      read.append((self.name, self.builder_config and self.builder_config.name, kwargs["split"]))
    return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def _images(n, size, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, (n, size, size, 3)).astype(np.uint8), rng.integers(0, 10, n)


@pytest.mark.parametrize("dataset", corrupted.names())
def test_every_corruption_and_severity_names_a_tfds_config(dataset):
  """The 19 names are calib_jax.shift's, and map onto all 95 of tfds' configs."""
  assert corrupted.corruption_names(dataset) == shift.corruption_names()
  configs = {c.name for c in tfds.builder_cls(dataset).BUILDER_CONFIGS}
  ours = {corrupted.tfds_name(dataset, c, s)
          for c in corrupted.corruption_names(dataset) for s in corrupted.SEVERITIES}
  assert ours == {f"{dataset}/{name}" for name in configs} and len(ours) == 95
  assert corrupted.tfds_name("cifar10_corrupted", "glass_blur", 2) == (
      "cifar10_corrupted/frosted_glass_blur_2")


@pytest.mark.parametrize("dataset", corrupted.names())
def test_registered_with_the_clean_datasets_classes_size_and_statistics(dataset):
  meta, clean = data.info(dataset), data.info(corrupted.clean_of(dataset))
  assert dataset in data.names()
  assert (meta.num_classes, meta.input_shape, meta.mean, meta.std, meta.task) == (
      clean.num_classes, clean.input_shape, clean.mean, clean.std, clean.task)
  assert meta.eval_splits["test"] == clean.eval_splits["test"]  # 'test', ImageNet 'validation'


def test_cifar10_c_stream_equals_the_clean_test_stream_of_the_same_images():
  """CIFAR-10-C images go through CIFAR-10's own test processing: the same stored pixels give
  the same batches, padding and masks included, and the right tfds config is read."""
  images, labels = _images(6, 32)
  read = []
  options = {"normalize": "center", "max_examples": 5}
  with _mock(images, labels, read):
    clean = list(data.make_dataset("cifar10", "test", batch_size=4, train=False,
                                   process_index=0, process_count=1, **options))
    shifted = list(corrupted.corrupted_eval_stream(
        "cifar10_corrupted", "glass_blur", 4, clean_dataset="cifar10", batch_size=4,
        process_index=0, process_count=1, **options))
  assert read == [("cifar10", None, "test"),
                  ("cifar10_corrupted", "frosted_glass_blur_4", "test")]
  assert len(clean) == len(shifted) == 2
  for a, b in zip(clean, shifted):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert [int(b["mask"].sum()) for b in shifted] == [4, 1]


def test_imagenet_c_stream_has_the_clean_form_at_the_asked_size():
  images, labels = _images(3, 224)
  read = []
  with _mock(images, labels, read):
    batches = list(corrupted.corrupted_eval_stream(
        "imagenet2012_corrupted", "elastic_transform", 5, clean_dataset="imagenet2012_boxes",
        batch_size=2, process_index=0, process_count=1, image_size=40,
        objectness=True))  # a clean option the corrupted set cannot serve: left out
  assert read == [("imagenet2012_corrupted", "elastic_transform_5", "validation")]
  assert [b["image"].shape for b in batches] == [(2, 40, 40, 3)] * 2
  assert set(batches[0]) == {"image", "label", "mask"}
  meta = data.info("imagenet2012")
  valid = np.concatenate([b["image"][b["mask"]] for b in batches])
  low, high = (0 - np.array(meta.mean)) / meta.std, (1 - np.array(meta.mean)) / meta.std
  assert (valid >= low - 1e-4).all() and (valid <= high + 1e-4).all()
  assert valid.std() > 0.5


@pytest.mark.parametrize("args,message", [
    (("cifar100_corrupted", "fog", 1, "cifar10"),
     "unknown corrupted dataset 'cifar100_corrupted'; valid names: cifar10_corrupted, "
     "imagenet2012_corrupted."),
    (("cifar10_corrupted", "fog", 1, "mnist"),
     "cifar10_corrupted corrupts cifar10's test images; the model's dataset is 'mnist', which "
     "has no corrupted set."),
    (("cifar10_corrupted", "fog", 1, "imagenet2012_boxes"),
     "cifar10_corrupted corrupts cifar10's test images; the model's dataset is "
     r"'imagenet2012_boxes' \(its corrupted set: imagenet2012_corrupted\)."),
    (("cifar10_corrupted", "rain", 1, "cifar10"),
     "cifar10_corrupted: unknown corruption 'rain'; valid names: gaussian_noise, shot_noise"),
    (("imagenet2012_corrupted", "fog", 6, "imagenet2012"),
     r"imagenet2012_corrupted: severity must be one of \(1, 2, 3, 4, 5\), got 6."),
    (("imagenet2012_corrupted", "fog", True, "imagenet2012"), "got True"),
])
def test_bad_names_and_sets_of_another_dataset_are_one_line(args, message):
  with pytest.raises(ValueError, match=message) as info:
    corrupted.eval_options(*args, {})
  assert len(str(info.value).splitlines()) == 1


@pytest.fixture
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("a test tried to reach the network")
  monkeypatch.setattr(urllib3.util.connection, "create_connection", refuse)


def _cifar10_c(data_dir, **options):
  return corrupted.corrupted_eval_stream(
      "cifar10_corrupted", "glass_blur", 3, clean_dataset="cifar10", batch_size=4,
      data_dir=str(data_dir), process_index=0, process_count=1, **options)


def test_offline_with_download_off_fails_at_once_in_one_line(tmp_path, no_network):
  with pytest.raises(FileNotFoundError) as info:
    _cifar10_c(tmp_path, download=False)
  message = str(info.value)
  assert message.startswith("cifar10_corrupted: tfds dataset "
                            "'cifar10_corrupted/frosted_glass_blur_3' is not prepared in ")
  assert "download is False" in message and "tfds build cifar10_corrupted" in message
  assert len(message.splitlines()) == 1


def test_a_failed_download_is_the_catalogues_one_line(tmp_path, monkeypatch, no_network):
  tried = []

  def stand_in(self, *args, **kwargs):
    tried.append((self.name, self.builder_config.name))
    raise requests.exceptions.ConnectionError("Failed to resolve 'zenodo.org' (stand-in)")
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", stand_in)
  with pytest.raises(FileNotFoundError, match=(
      r"^cifar10_corrupted: could not download tfds dataset "
      r"'cifar10_corrupted/frosted_glass_blur_3' into .*\(ConnectionError: Failed to resolve")
  ) as info:
    _cifar10_c(tmp_path)
  assert tried == [("cifar10_corrupted", "frosted_glass_blur_3")]
  assert len(str(info.value).splitlines()) == 1


def test_imagenet_c_without_the_archive_says_where_to_put_it(tmp_path, no_network):
  """tfds' own builder, run for real on an empty manual dir: no archive, one line."""
  (tmp_path / "manual").mkdir()
  with pytest.raises(FileNotFoundError) as info:
    list(corrupted.corrupted_eval_stream(
        "imagenet2012_corrupted", "fog", 3, clean_dataset="imagenet2012", batch_size=2,
        data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual"),
        process_index=0, process_count=1))
  message = str(info.value)
  assert message.startswith("imagenet2012_corrupted: cannot prepare 'imagenet2012_corrupted/fog_3'")
  assert "Put ILSVRC2012_img_val.tar into manual_dir" in message
  assert len(message.splitlines()) == 1


def _recipe(name, eval_batch_size=8):
  config = config_lib.base_config()
  config.data.name = name
  config.data.eval_batch_size = eval_batch_size
  return DataRecipe(config.data, data.info(name))


def test_the_experiments_corrupted_stream_is_its_test_stream_in_form():
  """`DataRecipe.corrupted_stream`: global batches sharded as `eval_stream('test')`'s, with the
  raw uint8 images the shifted eval step normalises on the device."""
  images, labels = _images(11, 32, seed=1)
  recipe, mesh = _recipe("cifar10"), parallel.make_mesh()
  with _mock(images, labels):
    clean = list(recipe.eval_stream("test", mesh, raw_images=True))
    shifted = list(recipe.corrupted_stream("cifar10_corrupted", "fog", 2, mesh))
  assert shifted[0]["image"].dtype == np.uint8
  assert len(clean) == len(shifted) == 2
  for a, b in zip(clean, shifted):
    assert a.keys() == b.keys()
    for key in a:
      assert a[key].sharding == b[key].sharding
      np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
  with pytest.raises(ValueError, match="cifar10_corrupted corrupts cifar10's test images"):
    _recipe("mnist").corrupted_stream("cifar10_corrupted", "fog", 2, mesh)  # at the call


def test_a_config_cannot_train_on_a_corrupted_set():
  config = config_lib.base_config()
  config.data.name = "cifar10_corrupted"
  found = problems.task_problems(config, data.info("cifar10_corrupted"))
  assert found == ["dataset 'cifar10_corrupted' holds corrupted copies of cifar10's test split "
                   "only: train on that, and evaluate with eval.py "
                   "--shift=dataset:cifar10_corrupted"]


def test_an_ood_set_cannot_be_a_corrupted_set():
  assert problems.ood_problems("cifar10_corrupted:test", data.info("cifar10")) == [
      "eval.ood='cifar10_corrupted:test': cifar10_corrupted holds one corrupted copy of a test "
      "split per corruption and severity; evaluate it with eval.py "
      "--shift=dataset:cifar10_corrupted"]
  assert problems.ood_problems("cifar100:test", data.info("cifar10")) == []
