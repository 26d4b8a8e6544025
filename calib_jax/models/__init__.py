"""Model zoo: Flax (linen) networks of the calibration papers behind a name registry.

    model = calib_jax.models.get("resnet50", num_classes=200, stem="cifar", dtype=jnp.bfloat16)
    variables = model.init({"params": key}, x, train=False)
    logits = model.apply(variables, x, train=False)
    logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"],
                                  rngs={"dropout": key})

Every model takes `dtype` (computation dtype; parameters and logits stay float32) and
`axis_name` (BatchNorm cross-device statistics under pmap / shard_map; unused by models without
BatchNorm). Classifiers return float32 logits [B, num_classes] and name their last layer 'head';
DeepLab returns [B, H, W, num_classes] at input resolution.
"""
from calib_jax.models import cifar_resnet
from calib_jax.models import deeplab
from calib_jax.models import densenet
from calib_jax.models import layers
from calib_jax.models import mlp
from calib_jax.models import registry
from calib_jax.models import resnet
from calib_jax.models import small_cnn
from calib_jax.models import text_cnn
from calib_jax.models import torch_import
from calib_jax.models import vgg
from calib_jax.models import vit
from calib_jax.models import weights
from calib_jax.models.layers import param_count
from calib_jax.models.registry import get
from calib_jax.models.registry import ModelConfigError
from calib_jax.models.registry import names
from calib_jax.models.registry import register
from calib_jax.models.registry import unregister
from calib_jax.models.registry import valid_kwargs
from calib_jax.models.torch_import import import_torch
from calib_jax.models.weights import load_variables
from calib_jax.models.weights import restore_pretrained
from calib_jax.models.weights import save_variables

__all__ = ["get", "names", "register", "unregister", "valid_kwargs", "param_count",
           "save_variables", "load_variables", "restore_pretrained", "import_torch"]
