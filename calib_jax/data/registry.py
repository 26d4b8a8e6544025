"""Registry of datasets: what each one is and how it is read and augmented, in one place.

Each registered dataset is a `DatasetSpec` of three parts:

* `DatasetMeta`: the public description the training code sizes models and metrics from;
* `Source`: where its features live in the tfds examples (and how stored labels map to
  training labels);
* `Recipe`: how the input pipeline crops, flips and sizes its examples.

`info(name)` gives the `DatasetMeta`, `spec(name)` the whole `DatasetSpec`.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, Mapping

__all__ = ["DatasetMeta", "DatasetSpec", "Recipe", "Source", "info", "names", "spec",
           "CITYSCAPES_LABEL_TO_TRAIN_ID"]

Task = Literal["classification", "segmentation", "text"]

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class DatasetMeta:
  """Static description of a registered dataset.

  Attributes:
    name: registry key.
    num_classes: number of classes (segmentation: including background; text: topics).
    input_shape: shape of one model input produced by the training pipeline: ``(H, W, C)``
      images, ``(max_length,)`` token ids for text.
    task: 'classification', 'segmentation' or 'text'.
    has_boxes: whether per-example object boxes exist, so that ``objectness``,
      ``context_rate``, ``mask_variant`` and ``remove_objects`` are available.
    train_split: tfds split string used for ``split='train'``.
    eval_splits: ``{'val': ..., 'test': ...}`` tfds split strings.
    ignore_label: label value that marks pixels to ignore (segmentation), else None.
    mean: per-channel mean in [0, 1] units; images are ``(x/255 - mean)/std`` (text: None).
    std: per-channel std in [0, 1] units (text: None).
    tfds_name: the tfds dataset (``name/config``) read.
    vocab_size: token id range for text datasets (0 is padding), else None.
    max_length: text: tokens per document (the ``max_length`` option's default), else None.
  """
  name: str
  num_classes: int
  input_shape: tuple[int, ...]
  task: Task
  has_boxes: bool
  train_split: str
  eval_splits: Mapping[str, str]
  ignore_label: int | None
  mean: tuple[float, ...] | None
  std: tuple[float, ...] | None
  tfds_name: str
  vocab_size: int | None = None
  max_length: int | None = None

  @property
  def image_shape(self) -> tuple[int, ...]:
    """Older name of `input_shape`, kept for callers that size a model input from it (for a
    text dataset it is the token shape ``(max_length,)``, not an image's)."""
    return self.input_shape


@dataclasses.dataclass(frozen=True)
class Source:
  """Where a dataset's features live in its tfds examples.

  Attributes:
    image_key: the image feature (None for text).
    label_key: the class label feature (classification, text).
    boxes_key: 'objects/bbox' ([K,4] per example) or 'bbox' ([4]); None without boxes.
    seg_key: the segmentation mask feature (segmentation).
    text_key: the document feature (text).
    label_map: segmentation: stored mask value -> training label (e.g. Cityscapes labelIds ->
      trainIds); stored values it does not list become the ignore label. None: as stored.
    kind: 'catalog': in the tfds catalogue, downloaded and prepared on first use; 'offline':
      our builder, prepared locally from installed files or a seed; 'manual': prepared
      locally from archives in a manual dir.
    how_to_get: one sentence telling the user how to get the data (in error messages).
    fallback: a local builder of the same examples, used when the catalogue one cannot be
      downloaded.
  """
  image_key: str | None = "image"
  label_key: str = "label"
  boxes_key: str | None = None
  seg_key: str | None = None
  text_key: str | None = None
  label_map: Mapping[int, int] | None = None
  kind: Literal["catalog", "offline", "manual"] = "catalog"
  how_to_get: str = ""
  fallback: str | None = None


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How the input pipeline crops, flips and sizes a dataset's examples.

  Attributes:
    train_crop: classification: the training crop, a name of `calib_jax.data.crops.CROPS`
      (the one list of crop names; the ``crop`` option overrides it).
    eval_crop: classification: the evaluation crop, a name of `crops.CROPS` ('none' or
      'center').
    flip: random horizontal flips in training (the ``flip`` option overrides it).
    pad: 'pad' crop: pixels of zero padding on each side.
    resize: 'resize_crop' / 'center' crops: side the image is resized to before cropping
      (None: ``max(image size) / crops.EVAL_RESIZE_RATIO``; also when the ``image_size``
      option is given).
    scale: 'inception' crop: (min, max) area fraction (the ``crop_scale`` option overrides it).
    ratio: 'inception' crop: (min, max) aspect ratio (the ``crop_ratio`` option).
    seg_scale: segmentation training: (min, max) random scale before padding and cropping to
      the input size (`crops.scale_pad_crop`).
    eval_shape: segmentation evaluation: (H, W) every image is fitted into and padded to
      (`crops.fit_and_pad`); None: the input size. Cityscapes is evaluated at full resolution
      so that mIoU is exact. The ``image_size`` option overrides it.

  Segmentation always scales, pads and crops in training and fits and pads in evaluation, so
  its recipes name no crop; text datasets are not augmented.
  """
  train_crop: str = "none"
  eval_crop: str = "none"
  flip: bool = False
  pad: int = 4
  resize: int | None = None
  scale: tuple[float, float] = (0.08, 1.0)
  ratio: tuple[float, float] = (3 / 4, 4 / 3)
  seg_scale: tuple[float, float] = (0.5, 2.0)
  eval_shape: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """Everything the input pipeline needs to know about a registered dataset."""
  meta: DatasetMeta
  source: Source
  recipe: Recipe


def _meta(name, num_classes, input_shape, task, tfds_name, *, has_boxes=False,
          train="train", val="validation", test="test", ignore_label=None,
          mean=_IMAGENET_MEAN, std=_IMAGENET_STD, vocab_size=None, max_length=None
          ) -> DatasetMeta:
  return DatasetMeta(name=name, num_classes=num_classes, input_shape=tuple(input_shape),
                     task=task, has_boxes=has_boxes, train_split=train,
                     eval_splits={"val": val, "test": test}, ignore_label=ignore_label,
                     mean=mean, std=std, tfds_name=tfds_name, vocab_size=vocab_size,
                     max_length=max_length)


# Cityscapes labelIds (0..33, -1 stored as 255) -> 19 trainIds; everything else -> 255.
CITYSCAPES_LABEL_TO_TRAIN_ID = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11,
    25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18,
}

_CATALOG_HINT = ("It is in the tfds catalogue and is downloaded on first use; on a machine "
                 "without network access, prepare it where there is one (`tfds build {tfds} "
                 "--data_dir=DIR`) and copy DIR's {tfds}/ folder into data_dir.")

# Mean/std of the generated and sklearn datasets were measured on their train splits
# (tests/test_data_offline.py re-measures them).
_DATASETS: dict[str, DatasetSpec] = {}


def _register(meta: DatasetMeta, source: Source, recipe: Recipe) -> None:
  _DATASETS[meta.name] = DatasetSpec(meta, source, recipe)


_register(
    _meta("cifar10", 10, (32, 32, 3), "classification", "cifar10",
          train="train[:45000]", val="train[45000:]", test="test",
          mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)),
    Source(how_to_get=_CATALOG_HINT.format(tfds="cifar10")),
    Recipe(train_crop="pad", flip=True))
_register(
    _meta("cifar100", 100, (32, 32, 3), "classification", "cifar100",
          train="train[:45000]", val="train[45000:]", test="test",
          mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762)),
    Source(how_to_get=_CATALOG_HINT.format(tfds="cifar100")),
    Recipe(train_crop="pad", flip=True))
_register(
    _meta("mnist", 10, (28, 28, 1), "classification", "mnist",
          train="train[:55000]", val="train[55000:]", test="test",
          mean=(0.1307,), std=(0.3081,)),
    Source(how_to_get=_CATALOG_HINT.format(tfds="mnist")),
    Recipe())
_register(
    _meta("fashion_mnist", 10, (28, 28, 1), "classification", "fashion_mnist",
          train="train[:55000]", val="train[55000:]", test="test",
          mean=(0.2860,), std=(0.3530,)),
    Source(fallback="fashion_mnist_debian", how_to_get=(
        "Get it either way: with network access (tfds downloads 'fashion_mnist' on first use), "
        "or `apt-get install -y dataset-fashion-mnist` (files in "
        "/usr/share/datasets/fashion-mnist; manual_dir= may name another folder with the four "
        "idx .gz files), prepared locally as 'fashion_mnist_debian'.")),
    Recipe())
_register(
    _meta("digits", 10, (8, 8, 1), "classification", "sklearn_digits",
          mean=(0.3065,), std=(0.3765,)),
    Source(kind="offline", how_to_get="Ships with scikit-learn (sklearn.datasets.load_digits)."),
    Recipe())
_register(
    _meta("clutter_objects", 10, (32, 32, 3), "classification", "clutter_objects",
          has_boxes=True, mean=(0.4991, 0.5012, 0.4984), std=(0.2063, 0.2061, 0.2068)),
    Source(boxes_key="objects/bbox", kind="offline",
           how_to_get="Generated from a seed by calib_jax.data.builders.clutter_objects."),
    Recipe(train_crop="inception", scale=(0.25, 1.0)))
_register(
    _meta("clutter_objects_seg", 11, (32, 32, 3), "segmentation", "clutter_objects",
          ignore_label=255, mean=(0.4991, 0.5012, 0.4984), std=(0.2063, 0.2061, 0.2068)),
    Source(seg_key="segmentation_mask", kind="offline",
           how_to_get="Generated from a seed by calib_jax.data.builders.clutter_objects."),
    Recipe(seg_scale=(0.75, 1.5)))
_register(
    _meta("tiny_imagenet", 200, (64, 64, 3), "classification", "tiny_imagenet",
          has_boxes=True, mean=(0.4802, 0.4481, 0.3975), std=(0.2770, 0.2691, 0.2821)),
    Source(boxes_key="objects/bbox", kind="manual", how_to_get=(
        "Put tiny-imagenet-200.zip (or its extracted tiny-imagenet-200/ folder) into "
        "manual_dir (default <data_dir>/downloads/manual).")),
    Recipe(train_crop="pad", flip=True, pad=8))
_register(
    _meta("imagenet2012", 1000, (224, 224, 3), "classification", "imagenet2012",
          train="train[:99%]", val="train[99%:]", test="validation"),
    Source(kind="manual", how_to_get=(
        "Put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar into manual_dir. For boxes "
        "(adaptive label smoothing) use 'imagenet2012_boxes'.")),
    Recipe(train_crop="inception", eval_crop="center", flip=True, resize=256))
_register(
    _meta("imagenet2012_boxes", 1000, (224, 224, 3), "classification", "imagenet2012_boxes",
          has_boxes=True, train="train[:99%]", val="train[99%:]", test="validation"),
    Source(boxes_key="objects/bbox", kind="manual", how_to_get=(
        "Put ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and the ILSVRC box XMLs "
        "(ILSVRC2012_bbox_train_v2.tar.gz, ILSVRC2012_bbox_val_v3.tgz, or extracted "
        "bbox_train/ and bbox_val/ folders) into manual_dir.")),
    Recipe(train_crop="inception", eval_crop="center", flip=True, resize=256))
_register(
    _meta("cub200", 200, (224, 224, 3), "classification", "caltech_birds2011",
          has_boxes=True, train="train[:90%]", val="train[90%:]", test="test"),
    Source(boxes_key="bbox", how_to_get=_CATALOG_HINT.format(tfds="caltech_birds2011")),
    Recipe(train_crop="resize_crop", eval_crop="center", flip=True, resize=256))
_register(
    _meta("voc2012_seg", 21, (512, 512, 3), "segmentation", "voc2012_segmentation",
          val="validation", test="validation", ignore_label=255),
    Source(seg_key="segmentation_mask", kind="manual", how_to_get=(
        "Put VOCtrainval_11-May-2012.tar (or its extracted VOCdevkit/ folder) into "
        "manual_dir.")),
    Recipe(flip=True))
_register(
    _meta("cityscapes", 19, (512, 1024, 3), "segmentation", "cityscapes/semantic_segmentation",
          val="validation", test="validation", ignore_label=255),
    Source(image_key="image_left", seg_key="segmentation_label",
           label_map=CITYSCAPES_LABEL_TO_TRAIN_ID, kind="manual", how_to_get=(
               "Put leftImg8bit_trainvaltest.zip and gtFine_trainvaltest.zip into manual_dir.")),
    Recipe(flip=True, eval_shape=(1024, 2048)))
_register(
    _meta("newsgroups20", 20, (1000,), "text", "newsgroups20", mean=None, std=None,
          vocab_size=20000, max_length=1000),
    Source(image_key=None, text_key="text", kind="manual", how_to_get=(
        "Put 20_newsgroups.tar.gz (19,997 documents) or 20news-bydate.tar.gz into manual_dir.")),
    Recipe())

# Corrupted copies of a clean test split (CIFAR-10-C, ImageNet-C; `calib_jax.data.corrupted`):
# test split only, one tfds config per corruption and severity ('cifar10_corrupted/fog_3'), read
# with the `tfds_name` option; the clean dataset's classes, size and statistics.
_CIFAR10 = _DATASETS["cifar10"].meta
_register(
    _meta("cifar10_corrupted", 10, (32, 32, 3), "classification", "cifar10_corrupted",
          val="test", mean=_CIFAR10.mean, std=_CIFAR10.std),
    Source(how_to_get=(
        "It is in the tfds catalogue (CIFAR-10-C, one 2.9 GB archive for its 95 configs) and is "
        "downloaded on first use; on a machine without network access, prepare it where there "
        "is one (`tfds build cifar10_corrupted --data_dir=DIR`: every config, or "
        "`--config=gaussian_noise_3` for one) and copy DIR's cifar10_corrupted/ folder into "
        "data_dir.")),
    Recipe())
_register(
    _meta("imagenet2012_corrupted", 1000, (224, 224, 3), "classification",
          "imagenet2012_corrupted", val="validation", test="validation"),
    Source(kind="manual", how_to_get=(
        "Put ILSVRC2012_img_val.tar into manual_dir: tfds corrupts the 50,000 validation images "
        "of each config (e.g. imagenet2012_corrupted/fog_3) with its own ImageNet-C code "
        "(OpenCV, scikit-image, ImageMagick's `convert`, and network access once for the frost "
        "pictures), or build it elsewhere (`tfds build imagenet2012_corrupted --config=fog_3 "
        "--manual_dir=DIR --data_dir=DIR2`) and copy DIR2's imagenet2012_corrupted/ folder into "
        "data_dir.")),
    # Stored as tfds' 224/256 centre crops at 224 px: the clean recipe's field of view already,
    # so no second crop, only a resize when `image_size` asks for another size.
    Recipe())


def names() -> list[str]:
  """Sorted registry keys."""
  return sorted(_DATASETS)


def spec(name: str) -> DatasetSpec:
  """The `DatasetSpec` of ``name``; unknown names raise ValueError listing valid ones."""
  if name not in _DATASETS:
    raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(names())}")
  return _DATASETS[name]


def info(name: str) -> DatasetMeta:
  """`DatasetMeta` of a registered dataset; unknown names raise ValueError listing names."""
  return spec(name).meta
