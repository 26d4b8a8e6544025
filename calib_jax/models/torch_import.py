"""PyTorch state dicts (torchvision / torch-uncertainty ResNets, timm ViTs) as calib_jax variables.

    variables = calib_jax.models.import_torch("resnet50", "resnet50.pth")
    calib_jax.models.save_variables("resnet50.msgpack", variables)  # then config.pretrained=...

Supported layouts:
* resnet18 / 34 / 50 / 101 / 152: torchvision's `resnet*` state dict (`conv1`, `bn1`,
  `layer{1..4}.{i}.{conv,bn}{1..3}`, `downsample.{0,1}`, `fc`). Convolutions OIHW -> HWIO,
  BatchNorm weight/bias -> params scale/bias and running_mean/var -> batch_stats mean/var
  (`num_batches_tracked` is ignored), `fc` -> 'head' transposed.
* the same ResNets in torch-uncertainty's layout (`torch_uncertainty.models.classification.resnet`,
  the LS-SC paper's ImageNet models): `shortcut.{0,1}` for `downsample.{0,1}` and `linear` for
  `fc`, recognised from the keys (`resnet_layout`).
* vit_ti16 / vit_s16 / vit_b16: timm's `vit_{tiny,small,base}_patch16_224` (`patch_embed.proj`,
  `cls_token`, `pos_embed`, `blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}`,
  `norm`, `head`); `attn.qkv` is split into query/key/value and heads.
* deeplabv3_resnet* / deeplabv3plus_resnet*: torchvision's ImageNet `resnet*` file of the same
  depth gives the DeepLab's 'backbone' subtree (the ResNet and DeepLab share it); the ImageNet
  classifier is dropped, and ASPP / decoder / head stay for `restore_pretrained` to keep fresh.
  torchvision's DeepLab heads are not converted.

Training checkpoints are unwrapped: a Lightning `.ckpt` ({'state_dict': ..., 'epoch': ...}) or
{'model': state_dict}, and a prefix every weight carries (Lightning's 'model.', DataParallel's
'module.', torch.compile's '_orig_mod.') is removed.

`config.pretrained` (and `eval.py --weights`) take such files directly: a path ending in one of
`TORCH_SUFFIXES` is converted for the config's model with `import_torch`.
"""
import json
import os
import pickle
import re
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np
from flax import traverse_util

from calib_jax.models import registry

Path = str | os.PathLike
StateDict = Mapping[str, Any]
_MAX_LISTED = 5
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")
RESNET_LAYOUTS = ("torchvision", "torch-uncertainty")


def is_torch_file(path: Path) -> bool:
  """Whether `path` names a PyTorch or safetensors weight file (judged by its suffix)."""
  return os.fspath(path).lower().endswith(TORCH_SUFFIXES)


def torch_layout(name: str) -> str | None:
  """The torchvision / timm model whose state dict `import_torch` reads for our model `name`
  (a DeepLab reads its backbone's ImageNet ResNet), or None where there is no converter."""
  deeplab = re.fullmatch(r"deeplabv3(?:plus)?_(resnet\d+)", name)
  if deeplab:
    return deeplab[1]
  return name if re.fullmatch(r"resnet\d+|vit_(ti|s|b)16", name) else None


def torch_models() -> list[str]:
  """Registered models `import_torch` converts to: ResNets, patch-16 ViTs, DeepLabs."""
  kinds = ("resnet", "vit_", "deeplabv3_", "deeplabv3plus_")
  supported = [n for n in registry.names() if torch_layout(n)]
  return sorted(supported, key=lambda n: (next(i for i, k in enumerate(kinds) if n.startswith(k)),
                                          int(re.sub(r"\D", "", n) or 0), n))


def _read_state_dict(source: Path | StateDict) -> dict[str, np.ndarray]:
  """Reads a .safetensors or .pth/.pt/.bin/.ckpt file, or takes a mapping; returns name -> numpy
  array, a training checkpoint's wrapper removed."""
  if isinstance(source, Mapping):
    state = dict(source)
  else:
    path = os.path.abspath(os.path.expanduser(os.fspath(source)))
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no PyTorch weight file at {path!r}")
    if path.endswith(".safetensors"):
      from safetensors import numpy as safetensors_numpy  # deferred: optional dependency
      state = safetensors_numpy.load_file(path)
    elif path.endswith((".pth", ".pt", ".bin", ".ckpt")):
      try:
        import torch  # deferred: torch is heavy and optional
      except ImportError:
        raise ImportError(f"reading {path!r} needs torch; install it, or convert the file to "
                          ".safetensors (safetensors.torch.save_file) on a machine with torch")
      state = _torch_load(torch, path)
    else:
      raise ValueError(f"{path!r}: expected a .safetensors, .pth, .pt, .bin or .ckpt file")
  if isinstance(state.get("state_dict"), Mapping):  # Lightning: weights beside loops, optimiser
    state = dict(state["state_dict"])
  elif set(state) == {"model"} and isinstance(state["model"], Mapping):
    state = dict(state["model"])
  return {k: _to_numpy(v) for k, v in state.items()}


def _torch_load(torch: Any, path: str) -> Mapping[str, Any]:
  """`torch.load` of tensors and plain containers only (no code runs); a file that pickles other
  objects gets a one-line ValueError saying how to keep its weights alone."""
  try:
    return torch.load(path, map_location="cpu", weights_only=True)
  except pickle.UnpicklingError as e:
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    what = found[1] if found else (str(e).strip().splitlines() or ["?"])[0]
    raise ValueError(
        f"{path!r} pickles Python objects beside its tensors ({what}), which torch.load("
        "weights_only=True) refuses to run; if you trust the file, save its weights alone: "
        f"python -c \"import torch; c = torch.load({path!r}, weights_only=False); "
        "torch.save(c.get('state_dict', c), 'weights.pth')\"") from e


def _to_numpy(value: Any) -> np.ndarray:
  if hasattr(value, "detach"):  # a torch tensor; bfloat16 has no numpy dtype
    value = value.detach().cpu()
    if value.is_floating_point():
      value = value.float()
    return value.numpy()
  return np.asarray(value)


def _resnet_rules(shortcut: str, head: str) -> list[tuple[str, Callable[[re.Match], str]]]:
  """Each rule maps a torch module prefix (regex) to our module path."""
  return [
      (r"conv1", lambda m: "backbone/stem_conv"),
      (r"bn1", lambda m: "backbone/stem_bn"),
      (r"layer(\d)\.(\d+)\.(conv\d|bn\d)",
       lambda m: f"backbone/stage{m[1]}_block{m[2]}/{m[3]}"),
      (rf"layer(\d)\.(\d+)\.{shortcut}\.([01])",
       lambda m: f"backbone/stage{m[1]}_block{m[2]}/downsample_{('conv', 'bn')[int(m[3])]}"),
      (head, lambda m: "head"),
  ]


# layout -> (the projection shortcut's module, the classifier's module)
_RESNET_NAMES = {"torchvision": ("downsample", "fc"), "torch-uncertainty": ("shortcut", "linear")}
_LEAF_NAMES = {"kernel": "weight", "scale": "weight", "bias": "bias", "mean": "running_mean",
               "var": "running_var"}

_VIT_MODULES: list[tuple[str, Callable[[re.Match], str]]] = [
    (r"patch_embed\.proj", lambda m: "patch_embedding"),
    (r"blocks\.(\d+)\.(norm1|norm2)", lambda m: f"encoderblock_{m[1]}/{m[2]}"),
    (r"blocks\.(\d+)\.attn\.qkv", lambda m: f"encoderblock_{m[1]}/attention/qkv"),
    (r"blocks\.(\d+)\.attn\.proj", lambda m: f"encoderblock_{m[1]}/attention/out"),
    (r"blocks\.(\d+)\.mlp\.(fc1|fc2)", lambda m: f"encoderblock_{m[1]}/mlp/{m[2]}"),
    (r"norm", lambda m: "encoder_norm"),
    (r"head", lambda m: "head"),
]


def _convert_leaf(module: str, kind: str, value: np.ndarray) -> dict[str, np.ndarray] | None:
  """Our ('collection/module/name' -> array) entries for one torch tensor; None if unknown."""
  if kind == "weight" and value.ndim == 4:
    return {f"params/{module}/kernel": value.transpose(2, 3, 1, 0)}  # OIHW -> HWIO
  if kind == "weight" and value.ndim == 2:
    return {f"params/{module}/kernel": value.T}
  if kind == "weight" and value.ndim == 1:
    return {f"params/{module}/scale": value}
  if kind == "bias":
    return {f"params/{module}/bias": value}
  if kind == "running_mean":
    return {f"batch_stats/{module}/mean": value}
  if kind == "running_var":
    return {f"batch_stats/{module}/var": value}
  return None


def _split_attention(entries: dict[str, np.ndarray], origin: dict[str, str],
                     num_heads: int) -> dict[str, np.ndarray]:
  """timm's fused qkv [3D, D] and proj [D, D] -> query/key/value [D, H, D/H], out [H, D/H, D]."""
  out = {}
  for path, value in entries.items():
    if "/attention/qkv/" in path:
      for part, chunk in zip(("query", "key", "value"), np.split(value, 3, axis=-1)):
        name = path.replace("/qkv/", f"/{part}/")
        origin[name] = origin[path]
        out[name] = chunk.reshape(chunk.shape[:-1] + (num_heads, -1))
    elif "/attention/out/kernel" in path:
      out[path] = value.reshape(num_heads, -1, value.shape[-1])
    else:
      out[path] = value
  return out


def _convert(state: dict[str, np.ndarray], rules: list,
             origin: dict[str, str]) -> tuple[dict[str, np.ndarray], list]:
  """Our path -> array for every recognised tensor (`origin`: our path -> torch key), and the
  torch keys no rule recognises."""
  converted, unused = {}, []
  for key, value in state.items():
    if key.endswith("num_batches_tracked"):
      continue
    if key in ("cls_token", "pos_embed"):
      path = {"cls_token": "params/cls_token", "pos_embed": "params/pos_embedding"}[key]
      converted[path], origin[path] = value, key
      continue
    prefix, _, kind = key.rpartition(".")
    for pattern, target in rules:
      match = re.fullmatch(pattern, prefix)
      if match:
        leaves = _convert_leaf(target(match), kind, value)
        if leaves is not None:
          converted.update(leaves)
          origin.update(dict.fromkeys(leaves, key))
          break
    else:
      unused.append(key)
  return converted, unused


def _listing(items: list[str]) -> str:
  more = f", ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
  return ", ".join(items[:_MAX_LISTED]) + more


def strip_wrapper_prefix(state: Mapping[str, Any],
                         anchor: str = "conv1.weight") -> tuple[dict[str, Any], str]:
  """`state` without the prefix its model's weights carry (a Lightning module's 'model.',
  DataParallel's 'module.', torch.compile's '_orig_mod.'), and that prefix ('' if none).

  The prefix is what stands before `anchor` (the stem convolution's key) in the shortest key
  ending with it; keys without the prefix are kept as they are (`import_torch` names them).
  """
  if anchor in state:
    return dict(state), ""
  prefixes = [k[:-len(anchor)] for k in state if k.endswith("." + anchor)]
  # Module names without digits: 'layer1.0.' is a block of the model, not a wrapper.
  prefixes = [p for p in prefixes if re.fullmatch(r"([A-Za-z_]+\.)+", p)]
  if not prefixes:
    return dict(state), ""
  prefix = min(prefixes, key=len)
  return {k.removeprefix(prefix): v for k, v in state.items()}, prefix


def resnet_layout(keys: Iterable[str]) -> str:
  """'torch-uncertainty' where the keys name torch-uncertainty's ResNet modules (`linear`,
  `shortcut`), else 'torchvision' (`fc`, `downsample`)."""
  keys = list(keys)
  if any(k.startswith("linear.") or ".shortcut." in k for k in keys):
    return "torch-uncertainty"
  return "torchvision"


def _resnet_torch_key(path: str, layout: str) -> str:
  """The torch key of our ResNet variable `path` ('params/backbone/stage2_block1/conv2/kernel'
  -> 'layer2.1.conv2.weight'), for naming missing tensors."""
  shortcut, head = _RESNET_NAMES[layout]
  *modules, leaf = path.split("/")[1:]
  if modules == ["head"]:
    module = head
  elif modules[-1] in ("stem_conv", "stem_bn"):
    module = {"stem_conv": "conv1", "stem_bn": "bn1"}[modules[-1]]
  else:
    stage, block = re.fullmatch(r"stage(\d)_block(\d+)", modules[-2]).groups()
    sub = {"downsample_conv": f"{shortcut}.0", "downsample_bn": f"{shortcut}.1"}.get(
        modules[-1], modules[-1])
    module = f"layer{stage}.{block}.{sub}"
  return f"{module}.{_LEAF_NAMES[leaf]}"


def import_torch(name: str, path_or_state_dict: Path | StateDict, *,
                 num_classes: int | None = None,
                 model_kwargs: Mapping[str, Any] | None = None) -> dict:
  """Converts a torchvision / torch-uncertainty ResNet or timm ViT state dict into variables of
  model `name`.

  Args:
    name: one of `torch_models()`: resnet18/34/50/101/152, vit_ti16/vit_s16/vit_b16, or a
      deeplabv3(plus)_resnet* (then the file is the ImageNet ResNet of that depth and only its
      'backbone' subtree is returned; num_classes and model_kwargs are not used).
    path_or_state_dict: a .safetensors file, a .pth/.pt/.bin/.ckpt file (needs torch), or a
      mapping of tensor name -> array. A ResNet's layout, torchvision's or torch-uncertainty's,
      is recognised from the keys; a Lightning checkpoint's 'state_dict' (and its 'model.'
      prefix) is unwrapped.
    num_classes: classes of the model the variables are for; None takes the file's head. With
      another count the head is dropped from the result, so `restore_pretrained(fresh, result)`
      (config.pretrained with pretrained_skip=('head',)) keeps the fresh head for fine-tuning.
    model_kwargs: other `models.get` options of the target model (e.g. image_size for a ViT,
      stem='cifar' for a ResNet whose conv1 is 3x3).

  Returns:
    {'params': ..., 'batch_stats': ...} (ResNets, DeepLabs) or {'params': ...} (ViTs), numpy
    float32 leaves, with the 'head' subtree absent when num_classes differs from the file's
    (always, for a DeepLab).

  Raises:
    ValueError: an unsupported model, or the state dict does not match the model: one line
      counting and naming (the first few of) the missing tensors, the unused ones and the shape
      mismatches.
  """
  layout = torch_layout(name)
  if layout is None:
    raise ValueError(f"no PyTorch converter for model {name!r}; import_torch supports "
                     f"{', '.join(torch_models())}")
  if layout != name:  # a DeepLab: the ImageNet ResNet's backbone
    resnet = import_torch(layout, path_or_state_dict)
    return {collection: {"backbone": tree["backbone"]} for collection, tree in resnet.items()}
  is_resnet = layout.startswith("resnet")
  state, prefix = strip_wrapper_prefix(_read_state_dict(path_or_state_dict),
                                       "conv1.weight" if is_resnet else "patch_embed.proj.weight")
  if is_resnet:
    file_layout = resnet_layout(state)
    rules = _resnet_rules(*_RESNET_NAMES[file_layout])
    head_key = _RESNET_NAMES[file_layout][1] + ".weight"
  else:
    file_layout, rules, head_key = "timm", _VIT_MODULES, "head.weight"
  file_classes = state[head_key].shape[0] if head_key in state else None
  keep_head = num_classes is None or num_classes == file_classes
  model_kwargs = dict(model_kwargs or {})
  model = registry.get(name, num_classes or file_classes or 1, **model_kwargs)
  image_size = getattr(model, "image_size", 64)  # a ResNet's tree is the same at any size
  num_heads = getattr(model, "num_heads", None)
  first_conv = state.get("conv1.weight", state.get("patch_embed.proj.weight"))
  channels = first_conv.shape[1] if first_conv is not None and first_conv.ndim == 4 else 3
  x = jax.ShapeDtypeStruct((1, image_size, image_size, channels), np.float32)
  expected = {"/".join(k): v for k, v in traverse_util.flatten_dict(
      jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)).items()}

  origin: dict[str, str] = {}
  converted, unused = _convert(state, rules, origin)
  if num_heads:
    converted = _split_attention(converted, origin, num_heads)
  if not keep_head:
    converted = {k: v for k, v in converted.items() if not k.startswith("params/head/")}
    expected = {k: v for k, v in expected.items() if not k.startswith("params/head/")}
  missing = sorted(k for k in expected if k not in converted)
  if is_resnet:
    missing = [f"{_resnet_torch_key(k, file_layout)} -> {k}" for k in missing]
  unused = sorted(set(unused) | {origin[k] for k in converted if k not in expected})
  mismatched = [f"{origin[k]} -> {k}: file {tuple(v.shape)}, model {tuple(expected[k].shape)}"
                for k, v in converted.items()
                if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
  problems = [f"{label} ({len(items)}): {_listing(items)}"
              for label, items in (("missing", missing), ("unused", unused),
                                   ("shape mismatch", mismatched)) if items]
  if any(m.startswith("conv1.weight ") for m in mismatched) and first_conv.shape[-2:] == (3, 3):
    problems.append("a 3x3 conv1 is the CIFAR stem: pass model_kwargs={'stem': 'cifar'}")
  if problems:
    source = ("the state dict" if isinstance(path_or_state_dict, Mapping)
              else repr(os.fspath(path_or_state_dict)))
    wrapper = f", prefix {prefix!r} removed" if prefix else ""
    raise ValueError(f"{source} ({file_layout} layout{wrapper}) does not match {name!r}: "
                     + "; ".join(problems))
  flat = {tuple(k.split("/")): np.asarray(v, np.float32) for k, v in converted.items()}
  return traverse_util.unflatten_dict(flat)


def reference_state_dict(keys_and_shapes: list[tuple[str, tuple[int, ...]]],
                         seed: int) -> dict[str, np.ndarray]:
  """Seeded random weights for a torch layout, drawn in key order (for equivalence tests).

  Scales keep activations O(1): He-normal convolutions, 1/sqrt(fan_in) linear layers, norm
  scales near 1, small biases and means, positive running variances near 1.
  """
  rng = np.random.default_rng(seed)
  state = {}
  for key, shape in keys_and_shapes:
    shape = tuple(shape)
    kind = key.rpartition(".")[2]
    if kind == "num_batches_tracked":
      state[key] = np.zeros(shape, np.int64)
      continue
    if kind == "running_var":
      value = rng.uniform(0.5, 1.5, shape)
    elif kind == "running_mean" or kind == "bias":
      value = rng.normal(0.0, 0.1, shape)
    elif kind == "weight" and len(shape) == 1:
      value = 1.0 + rng.normal(0.0, 0.1, shape)
    elif kind == "weight":
      fan_in = int(np.prod(shape[1:]))
      value = rng.normal(0.0, np.sqrt((2.0 if len(shape) == 4 else 1.0) / fan_in), shape)
    else:  # cls_token, pos_embed
      value = rng.normal(0.0, 0.5, shape)
    state[key] = value.astype(np.float32)
  return state


def reference_input(size: int, seed: int) -> np.ndarray:
  """A seeded NCHW float32 input batch [2, 3, size, size] of N(0, 1) pixels."""
  return np.random.default_rng(seed + 1).normal(0.0, 1.0, (2, 3, size, size)).astype(np.float32)


def keys_to_json(state: StateDict) -> str:
  """The [(key, shape), ...] list of a state dict as JSON (what `reference_state_dict` takes)."""
  return json.dumps([(k, list(np.shape(v))) for k, v in state.items()])
