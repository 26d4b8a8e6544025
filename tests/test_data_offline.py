"""Local tfds builders (offline data and manual-dir datasets) built from tiny fixtures."""
import gzip
import io
import struct
import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from calib_jax import data
from calib_jax.data.builders import clutter_objects, digits, newsgroups20


def _batches(name, split, data_dir, batch_size=8, **kw):
  return list(data.make_dataset(name, split, batch_size=batch_size, train=False,
                                data_dir=data_dir, process_index=0, process_count=1, **kw))


def _jpeg(array) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(array).save(buf, format="JPEG", quality=95)
  return buf.getvalue()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


# ---------------------------------------------------------------------------------------------
# scikit-learn digits.


def test_digits_splits_are_disjoint_real_digits(data_dir):
  from sklearn.datasets import load_digits
  ref = load_digits()
  ref_images = np.round(ref.images / 16.0 * 255.0).astype(np.uint8)
  builder = tfds.builder("sklearn_digits", data_dir=data_dir)
  builder.download_and_prepare()
  seen = {}
  for split, size in (("train", 1297), ("validation", 200), ("test", 300)):
    examples = list(tfds.as_numpy(builder.as_dataset(split=split)))
    assert len(examples) == size
    for ex in examples:
      key = ex["image"].tobytes()
      matches = np.nonzero((ref_images == ex["image"][:, :, 0]).all(axis=(1, 2)))[0]
      assert len(matches) >= 1 and ex["label"] in ref.target[matches]
      seen.setdefault(key, set()).add(split)
  assert sum(len(v) > 1 for v in seen.values()) <= 5  # sklearn has a few duplicate images


def test_digits_pipeline_normalisation_matches_train_statistics(data_dir):
  from sklearn.datasets import load_digits
  train = np.round(load_digits().images[digits.split_indices()["train"]] / 16.0 * 255) / 255
  meta = data.info("digits")
  assert meta.mean[0] == pytest.approx(train.mean(), abs=2e-3)
  assert meta.std[0] == pytest.approx(train.std(), abs=2e-3)
  batches = _batches("digits", "train[:100%]", data_dir, batch_size=1297)
  images = batches[0]["image"]
  assert images.shape == (1297, 8, 8, 1) and images.dtype == np.float32
  assert abs(images.mean()) < 0.01 and images.std() == pytest.approx(1.0, abs=0.01)


# ---------------------------------------------------------------------------------------------
# clutter_objects (generated).


def test_clutter_generation_is_reproducible_and_seed_dependent():
  a = list(clutter_objects.generate_split("validation", 6, seed=3))
  b = list(clutter_objects.generate_split("validation", 6, seed=3))
  c = list(clutter_objects.generate_split("validation", 6, seed=4))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x["image"], y["image"])
    np.testing.assert_array_equal(x["boxes"], y["boxes"])
  assert any(not np.array_equal(x["image"], z["image"]) for x, z in zip(a, c))


def test_clutter_boxes_are_tight_around_the_object_mask():
  for ex in clutter_objects.generate_split("train", 60, seed=0):
    seg = ex["segmentation_mask"][:, :, 0]
    assert set(np.unique(seg)) <= {0, 255, ex["label"] + 1}
    assert (seg == ex["label"] + 1).any()
    if len(ex["boxes"]) == 1:  # Single object: its box is the bounding box of its pixels.
      rows, cols = np.nonzero(seg.any(axis=1))[0], np.nonzero(seg.any(axis=0))[0]
      expected = [rows[0] / 32, cols[0] / 32, (rows[-1] + 1) / 32, (cols[-1] + 1) / 32]
      np.testing.assert_allclose(ex["boxes"][0], expected, atol=1e-6)
    inside = np.zeros_like(seg, bool)
    for y0, x0, y1, x1 in np.round(ex["boxes"] * 32).astype(int):
      inside[y0:y1, x0:x1] = True
    assert not (seg[~inside] != 0).any()


def test_clutter_normalisation_matches_generated_statistics():
  images = np.stack([ex["image"] for ex in clutter_objects.generate_split("train", 400, seed=0)])
  images = images.astype(np.float64) / 255.0
  meta = data.info("clutter_objects")
  np.testing.assert_allclose(meta.mean, images.mean(axis=(0, 1, 2)), atol=0.025)
  np.testing.assert_allclose(meta.std, images.std(axis=(0, 1, 2)), atol=0.01)


def test_clutter_glyphs_never_cross_splits():
  idx = digits.split_indices()
  assert not set(idx["train"]) & set(idx["test"])
  assert not set(idx["train"]) & set(idx["validation"])


def test_clutter_pipeline_classification_and_segmentation(data_dir):
  batches = _batches("clutter_objects", "test", data_dir, batch_size=32,
                     tfds_name="clutter_objects/tiny", objectness=True, return_boxes=2)
  assert len(batches) == 2
  b = batches[0]
  assert b["image"].shape == (32, 32, 32, 3) and b["label"].dtype == np.int32
  obj = np.concatenate([x["objectness"] for x in batches])
  # Objects range from a few pixels to most of the image: objectness must vary widely.
  assert obj.min() < 0.05 and obj.max() > 0.4 and (obj <= 1).all()
  for o, bx in zip(b["objectness"], b["boxes"]):
    assert o == pytest.approx(data.objectness(bx, [0, 0, 1, 1]), abs=1e-6)

  removed = _batches("clutter_objects", "test", data_dir, batch_size=32,
                     tfds_name="clutter_objects/tiny", remove_objects=True, objectness=True)
  assert (removed[0]["objectness"] == -1).all()
  mean = (0.0 - np.array(data.info("clutter_objects").mean)) / np.array(
      data.info("clutter_objects").std)
  # Inside the boxes every pixel is the mean pixel, i.e. 0 after normalisation.
  for image, bx in zip(removed[0]["image"], b["boxes"]):
    y0, x0, y1, x1 = np.round(bx[0] * 32).astype(int)
    np.testing.assert_allclose(image[y0:y1, x0:x1], 0.0, atol=1e-5)
    assert not np.allclose(image, mean)

  seg = _batches("clutter_objects_seg", "test", data_dir, batch_size=32,
                 tfds_name="clutter_objects/tiny")[0]
  assert seg["label"].shape == (32, 32, 32) and seg["mask"].shape == (32, 32, 32)
  assert seg["label"].max() <= 10 and seg["label"].min() >= 0
  assert (seg["label"][~seg["mask"]] == 0).all() and (~seg["mask"]).any()
  # Foreground pixels carry the image's class + 1.
  for lab, img_label in zip(seg["label"], b["label"]):
    assert set(np.unique(lab)) <= {0, img_label + 1}

  train = next(data.make_dataset("clutter_objects_seg", "train", batch_size=8, train=True,
                                 data_dir=data_dir, tfds_name="clutter_objects/tiny"))
  assert train["label"].shape == (8, 32, 32) and train["image"].shape == (8, 32, 32, 3)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST from local idx files.


def _write_idx(path, array, magic):
  with gzip.open(path, "wb") as f:
    f.write(struct.pack(">I", magic))
    for dim in array.shape:
      f.write(struct.pack(">I", dim))
    f.write(array.astype(np.uint8).tobytes())


def test_fashion_mnist_builder_reads_local_idx_files(tmp_path):
  rng = np.random.default_rng(0)
  manual = tmp_path / "manual"
  manual.mkdir()
  images = {"train": rng.integers(0, 256, (12, 28, 28)), "t10k": rng.integers(0, 256, (5, 28, 28))}
  labels = {"train": rng.integers(0, 10, 12), "t10k": rng.integers(0, 10, 5)}
  for prefix in ("train", "t10k"):
    _write_idx(manual / f"{prefix}-images-idx3-ubyte.gz", images[prefix], 0x803)
    _write_idx(manual / f"{prefix}-labels-idx1-ubyte.gz", labels[prefix], 0x801)
  batches = _batches("fashion_mnist", "test", str(tmp_path / "tfds"), batch_size=4,
                     manual_dir=str(manual), download=False)
  assert len(batches) == 2 and batches[1]["mask"].tolist() == [True, False, False, False]
  got = np.concatenate([b["image"] for b in batches])[:5, :, :, 0]
  got_labels = np.concatenate([b["label"] for b in batches])[:5]
  expected = (images["t10k"] / 255.0 - 0.2860) / 0.3530
  # tfds stores examples in hashed-key order: match each output image to its source.
  order = [int(np.argmin(np.abs(expected - g).sum(axis=(1, 2)))) for g in got]
  assert sorted(order) == list(range(5))
  np.testing.assert_allclose(got, expected[order], atol=1e-5)
  np.testing.assert_array_equal(got_labels, labels["t10k"][order])


def test_fashion_mnist_missing_files_give_a_clear_error(tmp_path, monkeypatch):
  from calib_jax.data.builders import fashion_mnist
  monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", str(tmp_path / "nowhere"))
  (tmp_path / "empty_manual").mkdir()
  with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
    _batches("fashion_mnist", "test", str(tmp_path / "tfds"),
             manual_dir=str(tmp_path / "empty_manual"), download=False)


# ---------------------------------------------------------------------------------------------
# Manual-dir builders.


def test_tiny_imagenet_builder_splits_labels_and_boxes(tmp_path):
  root = tmp_path / "manual" / "tiny-imagenet-200"
  wnids = [f"n{i:08d}" for i in range(200)]
  (root / "val" / "images").mkdir(parents=True)
  (root / "wnids.txt").write_text("\n".join(reversed(wnids)) + "\n")  # sorted by the builder
  jpg = _jpeg(np.full((64, 64, 3), 128, np.uint8))
  for wnid in wnids:
    (root / "train" / wnid / "images").mkdir(parents=True)
    lines = []
    for k in (0, 450):  # k >= 450 is held out for validation
      (root / "train" / wnid / "images" / f"{wnid}_{k}.JPEG").write_bytes(jpg)
      lines.append(f"{wnid}_{k}.JPEG\t0\t16\t63\t63")  # x0 y0 x1 y1
    (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("\n".join(lines) + "\n")
  (root / "val" / "images" / "val_0.JPEG").write_bytes(jpg)
  (root / "val" / "val_annotations.txt").write_text(f"val_0.JPEG\t{wnids[7]}\t0\t0\t63\t31\n")
  data_dir = str(tmp_path / "tfds")
  builder = tfds.builder("tiny_imagenet", data_dir=data_dir)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(tmp_path / "manual")))
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {
      "train": 200, "validation": 200, "test": 1}
  test = _batches("tiny_imagenet", "test", data_dir, batch_size=2, objectness=True)
  assert test[0]["label"][0] == 7
  assert test[0]["objectness"][0] == pytest.approx(0.5)  # x 0..63, y 0..31
  train = next(data.make_dataset("tiny_imagenet", "train", batch_size=16, train=True,
                                 data_dir=data_dir, objectness=True, crop="none"))
  assert train["image"].shape == (16, 64, 64, 3)
  np.testing.assert_allclose(train["objectness"], 0.75)  # rows 16..63 (48/64), all columns


def _news_archive(path, groups):
  with tarfile.open(path, "w:gz") as tar:
    for g in groups:
      for i in range(3):
        body = f"From: someone\nSubject: header words\n\n{g} message number {i} ALPHA-beta\n"
        raw = body.encode("latin-1")
        info = tarfile.TarInfo(f"20_newsgroups/{g}/{1000 + i}")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))


def test_newsgroups_builder_and_text_pipeline(tmp_path):
  groups = [f"group.{chr(97 + i)}" for i in range(20)]
  manual = tmp_path / "manual"
  manual.mkdir()
  _news_archive(manual / "20_newsgroups.tar.gz", groups)
  data_dir = str(tmp_path / "tfds")
  builder = tfds.builder("newsgroups20", data_dir=data_dir)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  sizes = {k: v.num_examples for k, v in builder.info.splits.items()}
  assert sum(sizes.values()) == 60 and sizes["validation"] == round(60 * 900 / 19997)
  texts = list(tfds.as_numpy(builder.as_dataset(split="train")))
  for ex in texts:
    text = ex["text"].decode()
    assert "Subject" not in text and groups[ex["label"]] in text  # header stripped, right label
  assert newsgroups20.strip_header("a: b\n\nbody") == "body"
  batch = _batches("newsgroups20", "train", data_dir, batch_size=64, max_length=12,
                   vocab_size=50)[0]
  n = sizes["train"]
  tokens, mask = batch["tokens"], batch["mask"]
  assert tokens.shape == (64, 12) and tokens.dtype == np.int32 and mask.sum() == n
  # "<g> message number <i> alpha beta" -> 7 words, then zero padding.
  assert (tokens[:n, :7] > 0).all() and (tokens[:n, 7:] == 0).all() and tokens.max() < 50
  # Same words -> same ids: 'message' and 'number' are shared by every post.
  assert len(set(tokens[:n, 2])) == 1 and len(set(tokens[:n, 3])) == 1
  assert data.num_examples("newsgroups20", "train", data_dir=data_dir) == n
  assert data.info("newsgroups20").max_length == 1000  # the max_length default, not an image


def _voc_fixture(root):
  voc = root / "VOCdevkit" / "VOC2012"
  for sub in ("JPEGImages", "SegmentationClass", "Annotations", "ImageSets/Segmentation"):
    (voc / sub).mkdir(parents=True)
  ids = ["2007_000001", "2007_000002", "2007_000003"]
  for i, image_id in enumerate(ids):
    h, w = 20 + i, 30
    image = Image.fromarray(np.full((h, w, 3), 60 * i, np.uint8))
    image.save(voc / "JPEGImages" / f"{image_id}.jpg")
    mask = np.zeros((h, w), np.uint8)
    mask[2:10, 3:12] = 15  # person
    mask[2:10, 12] = 255  # border
    png = Image.fromarray(mask, mode="P")
    png.putpalette([0, 0, 0] * 256)
    png.save(voc / "SegmentationClass" / f"{image_id}.png")
    (voc / "Annotations" / f"{image_id}.xml").write_text(
        f"<annotation><size><width>{w}</width><height>{h}</height></size><object><name>person"
        "</name><bndbox><xmin>4</xmin><ymin>3</ymin><xmax>12</xmax><ymax>10</ymax></bndbox>"
        "</object></annotation>")
  (voc / "ImageSets/Segmentation/train.txt").write_text("\n".join(ids[:2]) + "\n")
  (voc / "ImageSets/Segmentation/val.txt").write_text(ids[2] + "\n")


def test_voc_segmentation_builder_and_eval_padding(tmp_path):
  _voc_fixture(tmp_path / "manual")
  data_dir = str(tmp_path / "tfds")
  builder = tfds.builder("voc2012_segmentation", data_dir=data_dir)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(tmp_path / "manual")))
  ex = next(iter(tfds.as_numpy(builder.as_dataset(split="validation"))))
  np.testing.assert_allclose(ex["objects"]["bbox"][0], [2 / 22, 3 / 30, 10 / 22, 12 / 30])
  assert ex["objects"]["label"][0] == 15
  batch = _batches("voc2012_seg", "val", data_dir, batch_size=2, image_size=32)[0]
  assert batch["label"].shape == (2, 32, 32)
  label, mask = batch["label"][0], batch["mask"][0]
  expected_mask = np.zeros((32, 32), bool)
  expected_mask[:22, :30] = True  # the 22x30 image; padding is ignored
  expected_mask[2:10, 12] = False  # border pixels are ignored
  np.testing.assert_array_equal(mask, expected_mask)
  assert (label[2:10, 3:12] == 15).all() and label[~mask].max() == 0
  assert not batch["mask"][1].any()  # padding example
  train = next(data.make_dataset("voc2012_seg", "train", batch_size=2, train=True,
                                 data_dir=data_dir, image_size=16))
  assert train["label"].shape == (2, 16, 16) and set(np.unique(train["label"])) <= {0, 15}


def _tar_bytes(members):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tar:
    for name, raw in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(raw)
      tar.addfile(info, io.BytesIO(raw))
  return buf.getvalue()


def _box_xml(stem, w, h, boxes):
  objs = "".join(
      f"<object><name>x</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
      f"<ymax>{y1}</ymax></bndbox></object>" for x0, y0, x1, y1 in boxes)
  return (f"<annotation><filename>{stem}</filename><size><width>{w}</width><height>{h}"
          f"</height></size>{objs}</annotation>")


def test_imagenet_boxes_builder_and_eval_objectness(tmp_path):
  manual = tmp_path / "manual"
  (manual / "bbox_train").mkdir(parents=True)
  (manual / "bbox_val").mkdir()
  img = _jpeg(np.full((40, 50, 3), 90, np.uint8))
  inner = {"n01440764": _tar_bytes({"n01440764_1.JPEG": img, "n01440764_2.JPEG": img}),
           "n01443537": _tar_bytes({"n01443537_5.JPEG": img})}
  (manual / "ILSVRC2012_img_train.tar").write_bytes(
      _tar_bytes({f"{k}.tar": v for k, v in inner.items()}))
  (manual / "ILSVRC2012_img_val.tar").write_bytes(_tar_bytes(
      {"ILSVRC2012_val_00000001.JPEG": img,
       "ILSVRC2012_val_00000002.JPEG": _jpeg(np.full((40, 50, 3), 200, np.uint8))}))
  (manual / "bbox_train" / "n01440764_1.xml").write_text(
      _box_xml("n01440764_1", 50, 40, [(0, 0, 25, 40)]))
  (manual / "bbox_train" / "n01443537_5.xml").write_text(
      _box_xml("n01443537_5", 50, 40, [(0, 0, 50, 20), (0, 0, 25, 40)]))
  (manual / "bbox_val" / "ILSVRC2012_val_00000001.xml").write_text(
      _box_xml("ILSVRC2012_val_00000001", 50, 40, [(10, 8, 40, 32)]))
  data_dir = str(tmp_path / "tfds")
  builder = tfds.builder("imagenet2012_boxes", data_dir=data_dir)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  train = {ex["file_name"].decode(): ex for ex in tfds.as_numpy(builder.as_dataset(split="train"))}
  assert sorted(train) == ["n01440764_1.JPEG", "n01443537_5.JPEG"]  # the box-less image is dropped
  np.testing.assert_allclose(train["n01443537_5.JPEG"]["objects"]["bbox"],
                             [[0, 0, 0.5, 1], [0, 0, 1, 0.5]])
  batch = _batches("imagenet2012_boxes", "test", data_dir, batch_size=2, image_size=28,
                   objectness=True)[0]
  labels = (tfds.core.tfds_path("datasets/imagenet2012/validation_labels.txt")
            .read_text().split()[:2])
  names = tfds.builder("imagenet2012_boxes", data_dir=data_dir).info.features["label"].names
  # Examples are stored in hashed-key order; tell the two apart by their grey level.
  grey = batch["image"][:, :, :, 0].mean(axis=(1, 2)) * 0.229 + 0.485
  first, second = (0, 1) if grey[0] < grey[1] else (1, 0)
  assert [names[batch["label"][first]], names[batch["label"][second]]] == labels
  resize = round(28 / 0.875)
  lo, hi = (resize - 28) / 2 / resize, (resize + 28) / 2 / resize
  expected = data.objectness([[0.2, 0.2, 0.8, 0.8]], [lo, lo, hi, hi])
  assert batch["objectness"][first] == pytest.approx(expected, abs=1e-6)
  assert batch["objectness"][second] == 0.0  # no XML: no boxes


# Imports the data package (TensorFlow: most of a start) once, then forks two processes that
# both find the dataset unprepared and read it at the same time; prints each one's exit status
# and the examples it read, or its traceback.
_PREPARE_AND_READ = """
import json, os, sys, traceback
from calib_jax import data

def read():
  batches = list(data.make_dataset("digits", "test", batch_size=64, train=False,
                                   data_dir=sys.argv[1], process_index=0, process_count=1))
  return str(sum(int(b["mask"].sum()) for b in batches))

children = []
for _ in range(2):
  out, into = os.pipe()
  pid = os.fork()
  if pid == 0:
    status = 1
    try:
      os.close(out)
      text, status = read(), 0
    except BaseException:
      text = traceback.format_exc()
    os.write(into, text.encode())
    os._exit(status)
  os.close(into)
  children.append((pid, out))
results = []
for pid, out in children:
  with os.fdopen(out) as pipe:
    text = pipe.read()
  results.append((os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text))
print(json.dumps(results))
"""


def test_concurrent_processes_prepare_a_local_dataset_once(tmp_path):
  """Two processes that find the same dataset unprepared both read it (one prepares, one waits)."""
  import json
  import subprocess
  import sys
  done = subprocess.run([sys.executable, "-c", _PREPARE_AND_READ, str(tmp_path)],
                        capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  results = json.loads(done.stdout.strip().splitlines()[-1])
  assert len(results) == 2
  for status, text in results:
    assert status == 0, text[-2000:]
  counts = {text for _, text in results}
  assert len(counts) == 1 and int(counts.pop()) > 0
