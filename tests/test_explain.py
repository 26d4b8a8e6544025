"""Grad-CAM / Grad-CAM++ on models with known answers, and the localisation scores."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import explain, models
from calib_jax.models import cifar_resnet, densenet, layers
from test_models import drawn_variables
from test_run_loop import quick_rng_compilation  # noqa: F401  (fast model init)


class TwoBlobNet(nn.Module):
  """Features = ReLU of the first two input channels (pooled by `pool`); logit 0 is the mean of
  feature channel 0, logit 1 that of channel 1, logit 2 minus that of channel 0."""
  num_classes: int = 3
  pool: int = 1

  @nn.compact
  def __call__(self, x, train=False):
    a = nn.relu(x[..., :2])
    if self.pool > 1:
      a = nn.avg_pool(a, (self.pool, self.pool), strides=(self.pool, self.pool))
    a = layers.FeatureMap(name="features")(a)
    m = jnp.mean(a, axis=(1, 2))
    return jnp.stack([m[:, 0], m[:, 1], -m[:, 0]], axis=-1)


def _blob_images(size=16):
  """Channel 0 lit in the top-left quarter, channel 1 in the bottom-right quarter."""
  x = np.zeros((2, size, size, 3), np.float32)
  q = size // 2
  x[:, :q, :q, 0] = 1.0
  x[:, q:, q:, 1] = 1.0
  x[1] *= 3.0  # Another scale: the normalised maps must not change.
  return jnp.asarray(x), q


@pytest.mark.parametrize("method", [explain.grad_cam, explain.grad_cam_plus_plus])
def test_each_class_map_lights_up_its_own_blob(method):
  x, q = _blob_images()
  model = TwoBlobNet()
  variables = model.init(jax.random.key(0), x)
  blobs = np.zeros((2, 16, 16))
  blobs[0, :q, :q] = 1.0
  blobs[1, q:, q:] = 1.0
  for cls, expected in enumerate(blobs):
    maps = np.asarray(method(model, variables, x, jnp.full((2,), cls)))
    np.testing.assert_allclose(maps, np.broadcast_to(expected, maps.shape), atol=1e-6)
  # A class whose score falls as the features grow: ReLU leaves nothing, and the map is 0, not NaN.
  maps = np.asarray(method(model, variables, x, jnp.full((2,), 2)))
  assert np.all(maps == 0.0)


@pytest.mark.parametrize("method", [explain.grad_cam, explain.grad_cam_plus_plus])
def test_coarse_maps_are_upsampled_and_peak_on_the_blob(method):
  x, q = _blob_images(32)
  model = TwoBlobNet(pool=4)  # an 8x8 feature map for 32x32 inputs
  variables = model.init(jax.random.key(0), x)
  maps = np.asarray(method(model, variables, x, jnp.array([0, 1])))
  assert maps.shape == (2, 32, 32)
  assert maps.min() == 0.0 and maps.max() == pytest.approx(1.0)
  peak0 = np.unravel_index(maps[0].argmax(), (32, 32))
  peak1 = np.unravel_index(maps[1].argmax(), (32, 32))
  assert max(peak0) < q and min(peak1) >= q
  assert maps[0][:q, :q].mean() > 5 * maps[0][q:, q:].mean()


@pytest.fixture(scope="module")
def small_cnn():
  model = models.get("small_cnn", 10, widths=(4, 8))
  x = np.random.default_rng(0).standard_normal((4, 16, 16, 3), np.float32)
  # Init's tree with values drawn as init draws them: no assertion below depends on init's own
  # values, and init op by op compiles each of its random-number operations.
  _, variables = drawn_variables(model, x)
  # Non-trivial BatchNorm statistics, so that inference mode matters.
  variables = {**variables, "batch_stats": jax.tree_util.tree_map(
      lambda v: v + 0.3, variables["batch_stats"])}
  return model, variables, x


def test_grad_cam_matches_the_closed_form_of_a_pooled_linear_head(small_cnn):
  """SmallCNN ends in global average pooling and a Dense head, so dS_c/dA^k_ij = W[k, c] / (h w)
  and Grad-CAM is ReLU(sum_k W[k, c] A^k) up to scale."""
  model, variables, x = small_cnn
  classes = jnp.array([0, 3, 7, 9])
  features, grads, logits = explain.class_score_gradients(model, variables, x, classes)
  _, state = model.apply(variables, x, capture_intermediates=True)
  a = state["intermediates"]["features"]["__call__"][0]
  np.testing.assert_allclose(features, a, rtol=1e-6, atol=1e-6)
  w = variables["params"]["head"]["kernel"][:, classes].T  # [B, K]
  h, wd = a.shape[1:3]
  np.testing.assert_allclose(grads, np.broadcast_to(w[:, None, None, :] / (h * wd), a.shape),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(logits, model.apply(variables, x), rtol=1e-6)
  expected = jax.nn.relu(jnp.einsum("bk,bhwk->bhw", w, a))
  expected = explain.normalise_maps(jax.image.resize(expected, (4, 16, 16), "bilinear"))
  np.testing.assert_allclose(explain.grad_cam(model, variables, x, classes), expected,
                             atol=1e-5)


def test_maps_are_per_image_in_range_and_jit_the_same(small_cnn):
  model, variables, x = small_cnn
  classes = jnp.array([1, 2, 3, 4])
  for method in (explain.grad_cam, explain.grad_cam_plus_plus):
    maps = np.asarray(method(model, variables, x, classes))
    assert maps.shape == (4, 16, 16) and np.isfinite(maps).all()
    assert maps.min() >= 0.0 and maps.max() <= 1.0
    jitted = jax.jit(functools.partial(method, model))
    np.testing.assert_allclose(jitted(variables, x, classes), maps, atol=1e-5)
    # Each image's map does not depend on the rest of the batch.
    np.testing.assert_allclose(jitted(variables, x[2:], classes[2:]), maps[2:], atol=1e-5)
  gc, gcpp, logits = explain.both_maps(model, variables, x, classes)
  np.testing.assert_allclose(gc, explain.grad_cam(model, variables, x, classes), atol=1e-6)
  np.testing.assert_allclose(gcpp, explain.grad_cam_plus_plus(model, variables, x, classes),
                             atol=1e-6)
  assert logits.shape == (4, 10)


def test_an_apply_function_and_an_explicit_layer_work(small_cnn):
  model, variables, x = small_cnn
  classes = jnp.array([0, 1, 2, 3])
  apply = lambda v, images: model.apply(v, images, train=False)
  np.testing.assert_allclose(explain.grad_cam(apply, variables, x, classes, layer="features"),
                             explain.grad_cam(model, variables, x, classes), atol=1e-6)
  # An earlier layer gives another (finer) map.
  earlier = explain.grad_cam(model, variables, x, classes, layer="bn0")
  assert earlier.shape == (4, 16, 16)
  with pytest.raises(ValueError, match="layer 'nope' must be one module.*'features'"):
    explain.grad_cam(model, variables, x, classes, layer="nope")


def test_models_without_a_feature_map_are_refused():
  x = jnp.zeros((1, 32, 32, 3))
  for name in ("mlp", "vit_ti4"):
    model = models.get(name, 10)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    with pytest.raises(explain.NoFeatureMapError):
      explain.feature_layer(model, variables, x)
  resnet = models.get("cifar_resnet20", 10)
  variables = jax.eval_shape(resnet.init, jax.random.key(0), x)
  assert explain.feature_layer(resnet, variables, x) == "features"  # its marker


def test_box_masks_use_pixel_centres_and_ignore_padding():
  boxes = jnp.array([[[0.0, 0.0, 0.5, 0.25], [0.0, 0.0, 0.0, 0.0]]])
  mask = np.asarray(explain.box_masks(boxes, 4, 4))[0]
  np.testing.assert_array_equal(mask, [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_allclose(explain.box_area(boxes, 4, 4), [2 / 16])


def test_pointing_game_and_energy_in_box_known_answers():
  maps = np.zeros((4, 8, 8), np.float32)
  maps[0, 1, 1] = 1.0                      # peak inside the top-left box
  maps[1, 6, 6] = 1.0                      # peak outside it
  maps[1, 1, 1] = 0.5
  maps[2] = 1.0                            # uniform: energy share = the box's area
  maps[3, 1, 1] = 1.0                      # image without a box
  top_left = [0.0, 0.0, 0.5, 0.5]
  boxes = np.zeros((4, 2, 4), np.float32)
  boxes[:3, 0] = top_left
  boxes[2, 1] = [0.5, 0.5, 0.75, 0.75]    # a second box of the same image counts too
  hits, valid = explain.pointing_game(jnp.asarray(maps), jnp.asarray(boxes))
  np.testing.assert_array_equal(hits[:3], [True, False, True])
  np.testing.assert_array_equal(valid, [True, True, True, False])
  share, valid = explain.energy_in_boxes(jnp.asarray(maps), jnp.asarray(boxes))
  np.testing.assert_allclose(share[:3], [1.0, 0.5 / 1.5, (16 + 4) / 64], rtol=1e-6)
  np.testing.assert_array_equal(valid, [True, True, True, False])
  # An all-zero map has no energy to share: not scored, and no NaN.
  share, valid = explain.energy_in_boxes(jnp.zeros((1, 8, 8)), jnp.asarray(boxes[:1]))
  assert not bool(valid[0]) and float(share[0]) == 0.0
  sums = explain.localisation_sums(jnp.asarray(maps), jnp.asarray(boxes),
                                   mask=jnp.array([True, True, False, True]))
  assert int(sums["pointing_game_count"]) == 2 and int(sums["pointing_game_sum"]) == 1
  assert float(sums["energy_in_box_sum"]) == pytest.approx(1.0 + 1 / 3)
  assert float(sums["box_area_sum"]) == pytest.approx(2 * 16 / 64)


@pytest.mark.parametrize("name,kwargs,shape", [
    ("resnet18", {"stem": "cifar"}, (1, 16, 16, 3)),
    ("cifar_resnet20", {}, (1, 16, 16, 3)),
    ("cifar_resnet56_v2", {}, (1, 16, 16, 3)),
    ("vgg16", {}, (1, 32, 32, 3)),
    ("densenet", {}, (1, 16, 16, 3)),
])
def test_every_conv_classifier_marks_the_map_after_its_last_relu(name, kwargs, shape):
  """The zoo's CNNs expose 'features' (non-negative: after the ReLU), which Grad-CAM reads by
  default, and the marker adds no variables."""
  if name == "densenet":  # DenseNet-BC-100 takes ~50 s to trace; depth 10 has the same layout.
    model = densenet.DenseNetBC(num_classes=5, depth=10, growth_rate=4)
  elif name == "cifar_resnet56_v2":  # The registered class at depth 11: one unit per stage, not 6.
    model = cifar_resnet.CifarPreActResNet(num_classes=5, depth=11)
  else:
    model = models.get(name, num_classes=5, **kwargs)
  # Init's tree, traced only (the marker must add none), with values drawn as init draws them
  # (`drawn_variables`: signed kernels, so non-negative features are those after a ReLU).
  x = np.ones(shape, np.float32)
  abstract, variables = drawn_variables(model, x)
  assert "features" not in abstract["params"]
  # One program (the forward pass, Grad-CAM): op by op, their hundreds of operations compiled
  # one by one took 6.1 / 4.2 / 3.4 CPU-s for resnet18 / vgg16 / densenet against 4.0 / 3.8 /
  # 1.5 in one with init (2026-11-28, loaded machine). (Depth 56's 27 alike blocks compiled in
  # one program took 6.8 against 3.0 op by op: hence depth 11 above.)
  @jax.jit
  def features_and_map(variables, x):
    _, state = model.apply(variables, x, train=False, capture_intermediates=True,
                           mutable=["intermediates"])
    maps = explain.grad_cam(model, variables, x, jnp.zeros((1,), jnp.int32))
    return state["intermediates"]["features"]["__call__"][0], maps

  features, maps = features_and_map(variables, x)
  assert features.ndim == 4 and float(features.min()) >= 0.0
  assert float(features.max()) > 0.0
  assert maps.shape == shape[:3]
