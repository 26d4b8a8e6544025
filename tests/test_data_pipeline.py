"""make_dataset: determinism, exact resume, per-host sharding, eval padding, the stream's
example count, the crop and processor tables, ALS masks and context samples (the catalogue on
tfds mock data and bad stored data: test_data_catalogue.py)."""
import dataclasses
import itertools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from calib_jax import data
from calib_jax.data import crops, pipeline, processors, registry

REQUIRED = ["cifar10", "cifar100", "mnist", "fashion_mnist", "tiny_imagenet", "imagenet2012",
            "cub200", "voc2012_seg", "cityscapes", "newsgroups20", "digits", "clutter_objects",
            "clutter_objects_seg"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def _take(it, n):
  return list(itertools.islice(it, n))


def _keys(batches, key="image"):
  return [x.tobytes() for b in batches for x, m in zip(b[key], b["mask"]) if m.all()]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


# ---------------------------------------------------------------------------------------------
# Registry and argument validation.


def test_registry_has_required_names_and_consistent_meta():
  assert set(REQUIRED) <= set(data.names())
  for name in data.names():
    meta = data.info(name)
    assert meta.name == name and meta.num_classes > 1
    assert set(meta.eval_splits) == {"val", "test"}
    assert meta.task in ("classification", "segmentation", "text")
    assert (meta.ignore_label == 255) == (meta.task == "segmentation")
    if meta.task != "text":
      assert len(meta.mean) == len(meta.std) == meta.input_shape[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
      meta.num_classes = 3
  assert data.info("clutter_objects").has_boxes and not data.info("cifar10").has_boxes


def test_unknown_dataset_lists_valid_names():
  with pytest.raises(ValueError, match="cifar10.*clutter_objects"):
    data.info("imagenet")
  with pytest.raises(ValueError, match="valid names"):
    data.make_dataset("nope", "train", batch_size=2, train=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="digits", colour=True), "valid options"),
    (dict(name="cifar10", objectness=True), "no object boxes"),
    (dict(name="digits", context_rate=0.2), "no object boxes"),
    (dict(name="clutter_objects", context_rate=1.5), "context_rate"),
    (dict(name="clutter_objects", crop="random"), "crop must be one of"),
    (dict(name="clutter_objects", crop_scale=(0.5, 2.0)), "crop_scale"),
    (dict(name="digits", batch_size=0), "batch_size"),
    (dict(name="digits", process_index=2, process_count=2), "process_index"),
    (dict(name="digits", max_examples=0), "max_examples"),
    (dict(name="newsgroups20", image_size=32), "max_length"),
    (dict(name="digits", normalize="minmax"), "normalize must be one of"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
  kwargs = {"batch_size": 2, **kwargs}
  name = kwargs.pop("name")
  with pytest.raises(ValueError, match=match):
    data.make_dataset(name, "train", train=True, **kwargs)


def test_crop_names_live_in_crops_table_only():
  """Every recipe names crops of `crops.CROPS`; an unknown crop lists them; segmentation and
  text recipes need no crop; a segmentation eval shape and label map are recipe/source fields."""
  for name in data.names():
    spec = registry.spec(name)
    assert spec.recipe.train_crop in crops.CROPS and spec.recipe.eval_crop in crops.CROPS
    assert spec.meta is data.info(name)
  assert data.CROPS is crops.CROPS
  assert set(crops.CROPS) == {"pad", "inception", "resize_crop", "none", "center"}
  with pytest.raises(ValueError, match=r"crop must be one of \('pad', 'inception', "
                     r"'resize_crop', 'none', 'center'\)"):
    data.make_dataset("digits", "train", batch_size=2, train=True, crop="random")
  city = registry.spec("cityscapes")
  assert city.recipe.eval_shape == (1024, 2048)
  assert city.source.label_map == registry.CITYSCAPES_LABEL_TO_TRAIN_ID
  assert registry.spec("voc2012_seg").recipe.eval_shape is None  # the input size
  assert not hasattr(registry, "_SEG_EVAL_SHAPE")


def test_meta_input_shape_is_honest_for_text():
  news = data.info("newsgroups20")
  assert news.max_length == 1000 and news.input_shape == (1000,)
  assert news.image_shape == news.input_shape  # the older name, an alias
  for name in data.names():
    meta = data.info(name)
    if meta.task != "text":
      assert meta.max_length is None and len(meta.input_shape) == 3
      assert meta.image_shape == meta.input_shape


def test_one_processor_per_task_with_only_its_attributes():
  assert set(processors.PROCESSORS) == {"classification", "segmentation", "text"}
  opts = {name: pipeline.PipelineOptions.create(data.info(name), {})
          for name in ("clutter_objects", "clutter_objects_seg", "newsgroups20")}
  classify = processors.make_processor(registry.spec("clutter_objects"),
                                       opts["clutter_objects"], train=True)
  segment = processors.make_processor(registry.spec("clutter_objects_seg"),
                                      opts["clutter_objects_seg"], train=False)
  text = processors.make_processor(registry.spec("newsgroups20"), opts["newsgroups20"],
                                   train=True)
  assert isinstance(classify, processors.ClassificationProcessor)
  assert classify.crop is crops.inception and classify.scale == (0.25, 1.0)
  assert isinstance(segment, processors.SegmentationProcessor) and segment.eval_shape == (32, 32)
  assert isinstance(text, processors.TextProcessor) and (text.length, text.vocab) == (1000, 20000)
  assert not hasattr(text, "size") and not hasattr(text, "crop") and not hasattr(text, "mean")
  assert not hasattr(segment, "crop") and not hasattr(classify, "seg_scale")


def test_missing_catalogue_data_fails_fast_with_instructions(tmp_path):
  with pytest.raises(FileNotFoundError, match="tfds build cifar10"):
    data.make_dataset("cifar10", "train", batch_size=2, train=True, data_dir=str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Stream semantics on real (digits) and generated (clutter_objects/tiny) data.


def _digits(data_dir, split="train", **kw):
  kw = {"batch_size": 16, "train": True, "data_dir": data_dir, **kw}
  return data.make_dataset("digits", split, **kw)


def test_train_stream_is_deterministic_and_seed_dependent(data_dir):
  a = _take(_digits(data_dir, seed=1), 3)
  b = _take(_digits(data_dir, seed=1), 3)
  c = _take(_digits(data_dir, seed=2), 3)
  _assert_same(a, b)
  assert _keys(a) != _keys(c)
  assert all(batch["mask"].all() for batch in a)


def test_epochs_are_reshuffled_permutations_of_the_split(data_dir):
  batches = _take(_digits(data_dir, max_examples=64, seed=0), 8)  # 4 batches per epoch
  epoch0, epoch1 = _keys(batches[:4]), _keys(batches[4:])
  assert len(set(epoch0)) == 64 and sorted(epoch0) == sorted(epoch1)
  assert epoch0 != epoch1
  eval_keys = _keys(list(_digits(data_dir, max_examples=64, train=False)))
  assert sorted(eval_keys) == sorted(epoch0)


def test_return_index_gives_each_examples_position_in_the_split(data_dir):
  batches = _take(_digits(data_dir, max_examples=64, seed=0, return_index=True), 4)  # one epoch
  index = np.concatenate([b["index"] for b in batches])
  assert sorted(index.tolist()) == list(range(64))
  eval_batches = list(_digits(data_dir, max_examples=64, train=False, return_index=True))
  by_index = {int(i): x.tobytes() for b in eval_batches for i, x in zip(b["index"], b["image"])}
  # Digits are not augmented: a training example is the eval example at the same index.
  for b in batches:
    for i, x in zip(b["index"], b["image"]):
      assert by_index[int(i)] == x.tobytes()
  hosts = [np.concatenate([b["index"][b["mask"]] for b in _digits(
      data_dir, max_examples=37, train=False, batch_size=8, return_index=True,
      process_index=h, process_count=2)]) for h in range(2)]
  assert sorted(np.concatenate(hosts).tolist()) == list(range(37))


def test_resume_is_exact_with_augmentation(data_dir):
  kw = dict(batch_size=24, train=True, seed=5, data_dir=data_dir, max_examples=100,
            tfds_name="clutter_objects/tiny", objectness=True, context_rate=0.3,
            return_boxes=2)  # 4 batches per epoch
  full = _take(data.make_dataset("clutter_objects", "train", **kw), 10)
  for start in (3, 4, 9):
    resumed = _take(data.make_dataset("clutter_objects", "train", start_batch=start, **kw),
                    10 - start)
    _assert_same(resumed, full[start:])


def test_hosts_get_disjoint_shards_and_equal_eval_batch_counts(data_dir):
  hosts = [list(_digits(data_dir, train=False, batch_size=8, max_examples=37,
                        process_index=i, process_count=2)) for i in range(2)]
  assert len(hosts[0]) == len(hosts[1]) == 3  # ceil(ceil(37/2)/8)
  k0, k1 = _keys(hosts[0]), _keys(hosts[1])
  assert len(k0) == 19 and len(k1) == 18 and not set(k0) & set(k1)
  whole = _keys(list(_digits(data_dir, train=False, batch_size=8, max_examples=37)))
  assert sorted(k0 + k1) == sorted(whole)
  for batch in hosts[0] + hosts[1]:
    assert batch["image"].shape == (8, 8, 8, 1) and batch["mask"].shape == (8,)
    assert not batch["image"][~batch["mask"]].any()  # padding examples are zeros
  train = [_take(_digits(data_dir, max_examples=64, process_index=i, process_count=2), 2)
           for i in range(2)]  # one epoch per host: 32 examples, 2 batches
  assert not set(_keys(train[0])) & set(_keys(train[1]))


def test_streams_report_their_example_count(data_dir):
  """`make_dataset` returns a `Batches` iterator that knows the split's size (after
  max_examples, before host sharding); `data.num_examples` gives the same count."""
  train = _digits(data_dir, batch_size=16)
  assert isinstance(train, data.Batches) and iter(train) is train
  assert (train.num_examples, train.num_batches, train.batches_per_epoch) == (1297, None, 81)
  assert next(train)["image"].shape == (16, 8, 8, 1)
  assert data.num_examples("digits", "train", data_dir=data_dir) == 1297
  host = _digits(data_dir, train=False, batch_size=8, max_examples=37, process_index=1,
                 process_count=2)
  assert (host.num_examples, host.num_batches, host.batches_per_epoch) == (37, 3, 3)
  assert len(list(host)) == 3
  sharded = _digits(data_dir, batch_size=8, max_examples=37, process_index=0, process_count=2)
  assert (sharded.num_examples, sharded.batches_per_epoch) == (37, 2)  # 18 per host
  assert data.num_examples("digits", "val", data_dir=data_dir) == 200
  assert data.num_examples("digits", "train[:10]", data_dir=data_dir, objectness=False) == 10
  assert data.num_examples("digits", "test", data_dir=data_dir, max_examples=5000) == 300
  with pytest.raises(ValueError, match="valid options"):
    data.num_examples("digits", "train", data_dir=data_dir, colour=True)


def test_center_normalization_only_subtracts_the_mean(data_dir):
  """normalize='center' (the label-relaxation code's Keras preprocessing) gives x/255 - mean:
  the standardised pixels times the dataset's std."""
  meta = data.info("digits")
  standard = next(_digits(data_dir, train=False, batch_size=16))["image"]
  centred = next(_digits(data_dir, train=False, batch_size=16, normalize="center"))["image"]
  np.testing.assert_allclose(centred, standard * np.float32(meta.std[0]), atol=1e-6)
  assert not np.allclose(centred, standard)


def test_eval_pass_is_deterministic_and_unaugmented(data_dir):
  a = list(_digits(data_dir, "val", train=False, batch_size=64))
  b = list(_digits(data_dir, "val", train=False, batch_size=64))
  _assert_same(a, b)
  assert sum(int(x["mask"].sum()) for x in a) == 200  # validation split of digits
  assert len(a) == 4 and a[-1]["mask"].sum() == 200 - 3 * 64


# ---------------------------------------------------------------------------------------------
# Adaptive-label-smoothing options on a hand-made example.


def _clutter_processor(**options):
  spec = registry.spec("clutter_objects")
  opts = pipeline.PipelineOptions.create(spec.meta, {"crop": "none", **options})
  return processors.make_processor(spec, opts, train=True)


_BOXES = np.array([[0.0, 0.0, 0.25, 0.5], [0.5, 0.5, 1.0, 1.0]], np.float32)


def _example():
  image = np.random.default_rng(0).integers(0, 256, (32, 32, 3)).astype(np.uint8)
  return image, {"image": tf.constant(image), "label": tf.constant(3, tf.int64),
                 "objects": {"bbox": tf.constant(_BOXES)}}


def _process_one(processor, ex, seed):
  """Runs the per-example processor and the batch-level step on a batch of one."""
  out = processor(ex, tf.constant(seed, tf.int64))
  out = processors.finish_batch({k: v[None] for k, v in out.items()})
  return {k: v.numpy()[0] for k, v in out.items()}


def _is_mean(out, rows, cols):
  return np.allclose(out["image"][rows, cols], 0.0, atol=1e-5)  # mean pixel normalises to 0


def test_mask_variant_keeps_one_object_and_fills_the_other():
  processor = _clutter_processor(mask_variant=True, return_boxes=2)
  _, ex = _example()
  kept_first = 0
  for s in range(12):
    out = _process_one(processor, ex, [0, s])
    first_kept = out["boxes"][0].any()
    kept_first += first_kept
    assert out["boxes"][0].any() != out["boxes"][1].any()  # exactly one box kept
    assert out["objectness"] == pytest.approx(0.125 if first_kept else 0.25)
    first_region, second_region = (slice(0, 8), slice(0, 16)), (slice(16, 32), slice(16, 32))
    assert _is_mean(out, *second_region) == first_kept
    assert _is_mean(out, *first_region) != first_kept
  assert 0 < kept_first < 12  # both objects get picked over seeds


def test_context_samples_fill_every_object_and_get_objectness_minus_one():
  processor = _clutter_processor(context_rate=1.0)
  image, ex = _example()
  out = _process_one(processor, ex, [0, 1])
  assert out["objectness"] == -1.0
  assert _is_mean(out, slice(0, 8), slice(0, 16)) and _is_mean(out, slice(16, 32), slice(16, 32))
  meta = data.info("clutter_objects")
  expected = (image[8:16] / 255.0 - np.array(meta.mean)) / np.array(meta.std)
  np.testing.assert_allclose(out["image"][8:16], expected, atol=1e-5)  # background untouched
  plain = _process_one(_clutter_processor(objectness=True), ex, [0, 1])
  assert float(plain["objectness"]) == pytest.approx(0.125 + 0.25)


def test_context_rate_sets_the_fraction_of_context_samples(data_dir):
  batch = next(data.make_dataset("clutter_objects", "train", batch_size=256, train=True,
                                 data_dir=data_dir, tfds_name="clutter_objects/tiny",
                                 context_rate=0.25))
  frac = float((batch["objectness"] == -1).mean())
  assert 0.15 < frac < 0.35
  real = batch["objectness"][batch["objectness"] >= 0]
  assert (real <= 1).all() and real.std() > 0.05
