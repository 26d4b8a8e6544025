"""Local tfds builders; importing this package registers them with tfds.

| tfds name | source | network |
|---|---|---|
| `sklearn_digits` | scikit-learn's digits | none |
| `clutter_objects` | generated from a seed (configs `default`, `tiny`) | none |
| `fashion_mnist_debian` | Debian `dataset-fashion-mnist` idx files | none |
| `tiny_imagenet` | `tiny-imagenet-200.zip` in the manual dir | none |
| `newsgroups20` | `20_newsgroups.tar.gz` / `20news-bydate.tar.gz` in the manual dir | none |
| `voc2012_segmentation` | `VOCtrainval_11-May-2012.tar` in the manual dir | none |
| `imagenet2012_boxes` | ImageNet tars + ILSVRC box XMLs in the manual dir | none |
"""
from calib_jax.data.builders.clutter_objects import ClutterObjects
from calib_jax.data.builders.digits import SklearnDigits
from calib_jax.data.builders.fashion_mnist import FashionMnistDebian
from calib_jax.data.builders.imagenet_boxes import Imagenet2012Boxes
from calib_jax.data.builders.newsgroups20 import Newsgroups20
from calib_jax.data.builders.tiny_imagenet import TinyImagenet
from calib_jax.data.builders.voc2012_segmentation import Voc2012Segmentation

__all__ = ["ClutterObjects", "SklearnDigits", "FashionMnistDebian", "Imagenet2012Boxes",
           "Newsgroups20", "TinyImagenet", "Voc2012Segmentation"]
