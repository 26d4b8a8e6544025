"""Class activation maps (Grad-CAM, Grad-CAM++) and how well they point at the object.

    maps = explain.grad_cam(model, variables, images, classes)          # [B, H, W] in [0, 1]
    hits, valid = explain.pointing_game(maps, boxes)
    share, valid = explain.energy_in_boxes(maps, boxes)

**How the feature map and its gradient are read.** A Flax method interceptor
(`flax.linen.intercept_methods`) wraps the `__call__` of the chosen module (`layer`, a
'/'-joined module path such as 'features' or 'backbone/stage4_block2') and returns
`output + delta` with `delta = 0`; the gradient of the class scores with respect to `delta` is the
gradient with respect to the feature map `A`, and `A` itself comes back as an auxiliary output.
Unlike `nn.Module.perturb` or `sow`, this needs no change to the model and adds no variable
collection (so checkpoints and `init` are untouched); unlike `capture_intermediates` alone it
also gives the gradient. By default the layer is the last module (in call-completion order)
whose output is an NHWC feature map [B, h, w, K], the map the global pooling reads in every conv
classifier of the zoo (each marks it with a parameter-free `features` module so that the
map is read after its ReLU). Models without one (MLPs) or whose last feature map is followed by
token sequences (ViT's patch embedding) raise `NoFeatureMapError`.

**Maths.** With class score `S_c` (the logit, before the softmax), feature map `A^k` (channel
k, spatial position ij) and gradient `g^k_ij = dS_c / dA^k_ij`:

* Grad-CAM (Selvaraju et al., ICCV 2017, eq. 1-2): `alpha_k = mean_ij g^k_ij`,
  `L = ReLU(sum_k alpha_k A^k)`.
* Grad-CAM++ (Chattopadhay et al., WACV 2018, eq. 19 with the exponential output
  `Y = exp(S_c)`): `a^k_ij = g^2 / (2 g^2 + sum_ab A^k_ab g^3)` (0 where the denominator is 0),
  `w_k = sum_ij a^k_ij ReLU(g^k_ij)`, `L = ReLU(sum_k w_k A^k)`.

Each map is resized bilinearly to the input's H x W and min-max normalised per image to [0, 1];
a constant map (for instance all zeros after the ReLU) becomes all zeros, never NaN. The scores
of a batch are summed before differentiating, which gives each image its own gradient as long
as the model does not mix images at inference (BatchNorm in inference mode does not).

**Localisation.** `pointing_game` (Zhang et al., "Top-down neural attention by excitation
backprop", ECCV 2016; no tolerance margin here, the images are small) asks whether a map's
maximum falls inside one of the image's object boxes; `energy_in_boxes` (the "energy-based
pointing game" of Wang et al., "Score-CAM", CVPRW 2020) is the share of the map's mass inside
the union of the boxes. Both are compared with `box_area`, their value for an uninformative
(uniform) map.

Everything here is a pure function of arrays, jit-able and batched (`model` and `layer` static).
"""
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]

_EPS = 1e-12


class NoFeatureMapError(ValueError):
  """The model has no convolutional feature map to explain (e.g. an MLP or a ViT)."""


def _apply_fn(model_or_apply: nn.Module | ApplyFn) -> ApplyFn:
  """`apply(variables, images) -> logits [B, C]` in inference mode."""
  if isinstance(model_or_apply, nn.Module):
    return lambda variables, x: model_or_apply.apply(variables, x, train=False)
  if callable(model_or_apply):
    return model_or_apply
  raise TypeError(f"expected a flax Module or an apply function, got {type(model_or_apply)}")


def _path(layer: str | Sequence[str]) -> tuple[str, ...]:
  return tuple(layer.split("/")) if isinstance(layer, str) else tuple(layer)


def module_outputs(model_or_apply: nn.Module | ApplyFn, variables: Any,
                   images: Array) -> list[tuple[str, tuple[int, ...]]]:
  """`(path, output shape)` of every submodule call that returns an array, in the order the
  calls complete (abstract evaluation: nothing is computed)."""
  apply, found = _apply_fn(model_or_apply), []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "__call__" and context.module.path and hasattr(out, "shape"):
      found.append(("/".join(context.module.path), tuple(out.shape)))
    return out

  def run(v, x):
    with nn.intercept_methods(record):
      return apply(v, x)

  jax.eval_shape(run, variables, images)
  return found


def _last_feature_map(outputs: list[tuple[str, tuple[int, ...]]]) -> str:
  last = max((i for i, (_, shape) in enumerate(outputs) if len(shape) == 4), default=None)
  if last is None:
    raise NoFeatureMapError("the model has no NHWC feature map (no module returns a 4-D "
                            "array), so it has no class activation map")
  if any(len(shape) == 3 for _, shape in outputs[last + 1:]):
    raise NoFeatureMapError(f"the model's last feature map ({outputs[last][0]!r}) is followed "
                            "by token sequences (a transformer), so Grad-CAM does not apply")
  return outputs[last][0]


def feature_layer(model_or_apply: nn.Module | ApplyFn, variables: Any, images: Array) -> str:
  """The default Grad-CAM layer: the last module output shaped [B, h, w, K] (see the module
  docstring); raises `NoFeatureMapError` for models without one."""
  return _last_feature_map(module_outputs(model_or_apply, variables, images))


def class_score_gradients(model_or_apply: nn.Module | ApplyFn, variables: Any, images: Array,
                          classes: Array, *, layer: str | Sequence[str] | None = None
                          ) -> tuple[Array, Array, Array]:
  """Feature map `A` [B, h, w, K] of `layer`, its gradient `dS_c / dA` (same shape) and the
  logits [B, C], where `S_c` is each image's logit of its class in `classes` [B].

  `layer`: a '/'-joined module path (default: `feature_layer`). Raises ValueError when no
  module has that path or it is called more than once.
  """
  apply = _apply_fn(model_or_apply)
  outputs = module_outputs(apply, variables, images)
  path = _path(layer if layer is not None else _last_feature_map(outputs))
  shapes = [s for p, s in outputs if tuple(p.split("/")) == path]
  if len(shapes) != 1:
    raise ValueError(f"layer {'/'.join(path)!r} must be one module called once, got "
                     f"{len(shapes)} calls; module outputs: {sorted({p for p, _ in outputs})}")

  def scores(delta):
    box = {}

    def perturb(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if context.method_name == "__call__" and tuple(context.module.path) == path:
        out = out + delta.astype(out.dtype)
        box["features"] = out
      return out

    with nn.intercept_methods(perturb):
      logits = apply(variables, images).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, classes[:, None].astype(jnp.int32), axis=1)
    return jnp.sum(picked), (box["features"].astype(jnp.float32), logits)

  delta = jnp.zeros(shapes[0], jnp.float32)
  grads, (features, logits) = jax.grad(scores, has_aux=True)(delta)
  return features, grads, logits


def normalise_maps(maps: Array) -> Array:
  """Per-image min-max normalisation of [B, H, W] maps to [0, 1]; constant maps -> 0."""
  low = jnp.min(maps, axis=(1, 2), keepdims=True)
  span = jnp.max(maps, axis=(1, 2), keepdims=True) - low
  safe = jnp.where(span > _EPS, span, 1.0)
  return jnp.where(span > _EPS, (maps - low) / safe, 0.0)


def _finish(weights: Array, features: Array, size: tuple[int, int]) -> Array:
  """ReLU(sum_k w_k A^k), resized to `size` (bilinear) and normalised per image."""
  cam = jax.nn.relu(jnp.einsum("bk,bhwk->bhw", weights, features))
  cam = jax.image.resize(cam, (cam.shape[0],) + tuple(size), method="bilinear")
  return normalise_maps(cam)


def grad_cam_weights(features: Array, grads: Array) -> Array:
  """Grad-CAM channel weights `alpha_k = mean_ij dS_c/dA^k_ij`, [B, K]."""
  del features
  return jnp.mean(grads, axis=(1, 2))


def grad_cam_plus_plus_weights(features: Array, grads: Array) -> Array:
  """Grad-CAM++ channel weights `w_k = sum_ij a^k_ij ReLU(g^k_ij)` with
  `a = g^2 / (2 g^2 + sum_ab A^k_ab g^3)` (0 where that denominator vanishes), [B, K]."""
  g2 = grads ** 2
  denominator = 2.0 * g2 + jnp.sum(features, axis=(1, 2), keepdims=True) * g2 * grads
  ok = jnp.abs(denominator) > _EPS
  a = jnp.where(ok, g2 / jnp.where(ok, denominator, 1.0), 0.0)
  return jnp.sum(a * jax.nn.relu(grads), axis=(1, 2))


def grad_cam(model_or_apply: nn.Module | ApplyFn, variables: Any, images: Array,
             classes: Array, *, layer: str | Sequence[str] | None = None) -> Array:
  """Grad-CAM maps [B, H, W] in [0, 1] of `classes` [B] for `images` [B, H, W, C].

  Args:
    model_or_apply: a Flax module (applied with `train=False`) or `apply(variables, images)`
      returning logits [B, C] that calls Flax modules.
    variables: the model's variables.
    images: the model's input batch.
    classes: the class whose logit is explained, one per image (e.g. labels or predictions).
    layer: '/'-joined module path of the feature map (default: `feature_layer`).
  """
  features, grads, _ = class_score_gradients(model_or_apply, variables, images, classes,
                                             layer=layer)
  return _finish(grad_cam_weights(features, grads), features, images.shape[1:3])


def grad_cam_plus_plus(model_or_apply: nn.Module | ApplyFn, variables: Any, images: Array,
                       classes: Array, *, layer: str | Sequence[str] | None = None) -> Array:
  """Grad-CAM++ maps [B, H, W] in [0, 1]; arguments as `grad_cam`."""
  features, grads, _ = class_score_gradients(model_or_apply, variables, images, classes,
                                             layer=layer)
  return _finish(grad_cam_plus_plus_weights(features, grads), features, images.shape[1:3])


def both_maps(model_or_apply: nn.Module | ApplyFn, variables: Any, images: Array,
              classes: Array, *, layer: str | Sequence[str] | None = None
              ) -> tuple[Array, Array, Array]:
  """`(grad_cam, grad_cam_plus_plus, logits)` from one forward and backward pass."""
  features, grads, logits = class_score_gradients(model_or_apply, variables, images, classes,
                                                  layer=layer)
  size = images.shape[1:3]
  return (_finish(grad_cam_weights(features, grads), features, size),
          _finish(grad_cam_plus_plus_weights(features, grads), features, size), logits)


# ----------------------------------------------------------------------------- localisation


def box_masks(boxes: Array, height: int, width: int) -> Array:
  """Bool [B, H, W]: pixels whose centre lies in the union of the image's boxes.

  `boxes` [B, K, 4] are normalised `[ymin, xmin, ymax, xmax]`; rows of zero area are padding.
  Pixel (i, j) has centre `((i + 0.5) / H, (j + 0.5) / W)`; a box holds `ymin <= y < ymax`.
  """
  y = (jnp.arange(height) + 0.5) / height
  x = (jnp.arange(width) + 0.5) / width
  ymin, xmin, ymax, xmax = (boxes[..., i][:, :, None, None] for i in range(4))
  inside = ((y[:, None] >= ymin) & (y[:, None] < ymax) & (x[None, :] >= xmin)
            & (x[None, :] < xmax))
  return jnp.any(inside, axis=1)


def _has_box(boxes: Array) -> Array:
  return jnp.any((boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1]), axis=-1)


def pointing_game(maps: Array, boxes: Array) -> tuple[Array, Array]:
  """`(hits, valid)`, both bool [B]: is each map's maximum (the first one in row-major order on
  ties) inside a box; `valid` marks images with at least one box (score only those)."""
  b, h, w = maps.shape
  inside = box_masks(boxes, h, w).reshape(b, h * w)
  top = jnp.argmax(maps.reshape(b, h * w), axis=1)
  return jnp.take_along_axis(inside, top[:, None], axis=1)[:, 0], _has_box(boxes)


def energy_in_boxes(maps: Array, boxes: Array) -> tuple[Array, Array]:
  """`(share, valid)`: the share of each map's mass (maps >= 0) inside the union of its boxes,
  [B]; `valid` marks images with a box and a map that is not all zero (share 0 elsewhere)."""
  inside = box_masks(boxes, maps.shape[1], maps.shape[2])
  total = jnp.sum(maps, axis=(1, 2))
  share = jnp.sum(jnp.where(inside, maps, 0.0), axis=(1, 2)) / jnp.where(total > 0, total, 1.0)
  return share, _has_box(boxes) & (total > 0)


def box_area(boxes: Array, height: int, width: int) -> Array:
  """[B]: the fraction of the image's pixels inside its boxes: the pointing-game hit rate of a
  uniformly random point and the energy share of a uniform map (the chance level)."""
  return jnp.mean(box_masks(boxes, height, width), axis=(1, 2))


def localisation_sums(maps: Array, boxes: Array, mask: Array | None = None) -> dict[str, Array]:
  """Sums over a batch for streaming means: hits, energy shares and box areas with their
  counts (`mask` [B] drops padded examples). Divide `*_sum` by the matching count."""
  mask = jnp.ones(maps.shape[0], bool) if mask is None else mask.astype(bool)
  hits, hit_ok = pointing_game(maps, boxes)
  share, share_ok = energy_in_boxes(maps, boxes)
  area = box_area(boxes, maps.shape[1], maps.shape[2])
  hit_ok, share_ok = hit_ok & mask, share_ok & mask
  return {"pointing_game_sum": jnp.sum(jnp.where(hit_ok, hits, False)),
          "pointing_game_count": jnp.sum(hit_ok),
          "energy_in_box_sum": jnp.sum(jnp.where(share_ok, share, 0.0)),
          "energy_in_box_count": jnp.sum(share_ok),
          "box_area_sum": jnp.sum(jnp.where(hit_ok, area, 0.0))}
