"""Local weight files: save / load model variables and restore pretrained subtrees for fine-tuning.

Pretrained weights (e.g. an ImageNet ResNet-50 for CUB-200 or DeepLab) are files the config
names. The format is flax's msgpack serialisation of the variables dict ({'params': ...,
'batch_stats': ...}); torchvision / timm state dicts convert into it with
`calib_jax.models.torch_import.import_torch` (then `save_variables`).
"""
import os
from typing import Any, Iterable, Mapping, Sequence

from absl import logging
import flax
from flax import serialization
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

Path = str | os.PathLike
Tree = Mapping[str, Any]


def _resolve(path: Path) -> str:
  return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _to_dict(tree: Any) -> dict:
  return flax.core.unfreeze(tree) if isinstance(tree, flax.core.FrozenDict) else tree


def save_variables(path: Path, variables: Tree) -> str:
  """Writes `variables` to `path` (msgpack), creating parent folders; returns the absolute path."""
  path = _resolve(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  data = serialization.to_bytes(jax.device_get(_to_dict(variables)))
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)  # never leave a truncated file under the final name
  return path


def load_variables(path: Path, like: Tree | None = None) -> dict:
  """Reads variables written by `save_variables`.

  Args:
    path: file path, absolute or relative to the working directory.
    like: optional variables (arrays or `jax.eval_shape` structs) the file must match in tree
      structure and shapes; a mismatch raises a ValueError listing the differences.

  Returns:
    A nested dict of jax arrays.
  """
  resolved = _resolve(path)
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"no weight file at {resolved!r} (given {os.fspath(path)!r}); "
                            "pass a file written by calib_jax.models.weights.save_variables "
                            "(pretrained weights are files the config names)")
  with open(resolved, "rb") as f:
    try:
      restored = serialization.msgpack_restore(f.read())
    except Exception as e:  # msgpack raises several unrelated types on corrupt data
      raise ValueError(f"{resolved!r} is not a flax msgpack weight file: {e}") from e
  if like is not None:
    _check_same_structure(_flat(like), _flat(restored), resolved)
  return jax.tree_util.tree_map(jnp.asarray, restored)


def check_variables(variables: Tree, like: Tree, source: str) -> None:
  """Raises a ValueError listing every difference of `variables` from `like` (arrays or
  `jax.eval_shape` structs) in tree structure and shapes; `source` names where they came from."""
  _check_same_structure(_flat(like), _flat(variables), source)


def _flat(tree: Tree) -> dict[tuple[str, ...], Any]:
  return traverse_util.flatten_dict(_to_dict(tree))


def _fmt(path: Sequence[str]) -> str:
  return "/".join(str(k) for k in path)


def _check_same_structure(expected: dict, found: dict, source: str) -> None:
  problems = [f"missing {_fmt(k)}" for k in expected if k not in found]
  problems += [f"unexpected {_fmt(k)}" for k in found if k not in expected]
  problems += [f"{_fmt(k)}: file has shape {tuple(np.shape(found[k]))}, expected "
               f"{tuple(expected[k].shape)}"
               for k in expected if k in found and tuple(np.shape(found[k])) != tuple(expected[k].shape)]
  if problems:
    listing = "\n  ".join(problems[:50])
    more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
    raise ValueError(f"weights in {source!r} do not match the model:\n  {listing}{more}")


def _is_skipped(path: tuple[str, ...], skip: Iterable[str]) -> bool:
  """`skip` entries name a module anywhere in the path ('head') or a path prefix ('params/head')."""
  joined = _fmt(path)
  for entry in skip:
    if "/" in entry:
      if joined == entry or joined.startswith(entry.rstrip("/") + "/"):
        return True
      # Also match a prefix given without the collection name.
      if _fmt(path[1:]) == entry or _fmt(path[1:]).startswith(entry.rstrip("/") + "/"):
        return True
    elif entry in path:
      return True
  return False


def restore_pretrained(variables: Tree, pretrained: Tree | Path,
                       skip: Sequence[str] = ("head",)) -> dict:
  """Copies the leaves of `pretrained` into `variables` wherever their paths match.

  Every leaf of `variables` whose path (collection/module/.../name, e.g.
  `params/backbone/stage1_block0/conv1/kernel`) also exists in `pretrained` is replaced by the
  pretrained value; leaves under a skipped module keep their fresh initialisation, and so do
  leaves the pretrained tree lacks (a DeepLab's ASPP when restoring an ImageNet ResNet). All
  models name their classifier 'head', and ResNet and DeepLab share the 'backbone' subtree, so the
  default `skip=('head',)` fine-tunes a classifier with a new number of classes, or puts an
  ImageNet ResNet into a DeepLab.

  Args:
    variables: freshly initialised variables of the target model.
    pretrained: variables (or only their 'params' tree) of the source model, or a path to a file
      written by `save_variables`.
    skip: module names (any path component) or '/'-separated path prefixes not to restore.

  Returns:
    A new variables dict; `variables` is not modified.

  Raises:
    ValueError: a matching path has a different shape (all mismatches are listed), or no leaf
      matched at all (wrong file or wrong model).
  """
  if isinstance(pretrained, (str, os.PathLike)):
    pretrained = load_variables(pretrained)
  target = _flat(variables)
  source_tree = _to_dict(pretrained)
  collections = {path[0] for path in target}
  if "params" in collections and not set(source_tree) & collections:
    source_tree = {"params": source_tree}  # a bare params tree was given
  source = _flat(source_tree)

  restored, copied, mismatched, missing = dict(target), [], [], []
  for path, leaf in target.items():
    if _is_skipped(path, skip):
      continue
    if path not in source:
      missing.append(path)
      continue
    value = source[path]
    if tuple(np.shape(value)) != tuple(leaf.shape):
      mismatched.append(f"{_fmt(path)}: pretrained {tuple(np.shape(value))}, model "
                        f"{tuple(leaf.shape)}")
      continue
    restored[path] = jnp.asarray(value, dtype=leaf.dtype)
    copied.append(path)

  if mismatched:
    raise ValueError("pretrained weights have different shapes at:\n  " + "\n  ".join(mismatched)
                     + f"\n(add these modules to skip=..., currently {tuple(skip)})")
  if not copied:
    raise ValueError("no parameter of the pretrained weights matches the model's paths; "
                     f"model paths look like {_fmt(next(iter(target)))!r}, pretrained like "
                     f"{_fmt(next(iter(source))) if source else '(empty)'!r}")
  logging.info("restore_pretrained: copied %d of %d leaves; %d not in the pretrained weights "
               "(e.g. %s)", len(copied), len(target), len(missing),
               ", ".join(_fmt(p) for p in missing[:3]) or "none")
  return traverse_util.unflatten_dict(restored)


def load_embedding(path: Path) -> np.ndarray:
  """Loads a [vocab_size, embed_dim] embedding table from .npy, single-array .npz or msgpack."""
  resolved = _resolve(path)
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"no embedding file at {resolved!r} (given {os.fspath(path)!r})")
  if resolved.endswith(".npy"):
    table = np.load(resolved)
  elif resolved.endswith(".npz"):
    with np.load(resolved) as archive:
      if len(archive.files) != 1:
        raise ValueError(f"{resolved!r} holds arrays {archive.files}; expected exactly one")
      table = archive[archive.files[0]]
  else:
    leaves = jax.tree_util.tree_leaves(load_variables(resolved))
    if len(leaves) != 1:
      raise ValueError(f"{resolved!r} holds {len(leaves)} arrays; expected exactly one")
    table = np.asarray(leaves[0])
  if table.ndim != 2:
    raise ValueError(f"embedding in {resolved!r} must be 2-D [vocab_size, embed_dim], got shape "
                     f"{table.shape}")
  return table.astype(np.float32)


def load_word_vectors(path: Path, vocab: Sequence[str], *, seed: int = 0) -> np.ndarray:
  """Builds an embedding table for `vocab` from a GloVe-format text file ("word v1 ... vD").

  Row i holds the vector of `vocab[i]`; words missing from the file get N(0, s^2) rows, s the
  standard deviation of the file's vectors (seeded), so they start at the same scale.
  """
  resolved = _resolve(path)
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"no word-vector file at {resolved!r} (given {os.fspath(path)!r})")
  index = {word: i for i, word in enumerate(vocab)}
  rows: dict[int, np.ndarray] = {}
  dim = None
  with open(resolved, encoding="utf-8") as f:
    for line_number, line in enumerate(f, 1):
      word, _, rest = line.rstrip("\n").partition(" ")
      if word not in index:
        continue
      vector = np.array(rest.split(), dtype=np.float32)
      if dim is None:
        dim = vector.size
      if vector.size != dim:
        raise ValueError(f"{resolved}:{line_number}: vector of length {vector.size}, expected {dim}")
      rows[index[word]] = vector
  if not rows:
    raise ValueError(f"none of the {len(vocab)} vocabulary words occurs in {resolved!r}")
  known = np.stack(list(rows.values()))
  rng = np.random.default_rng(seed)
  table = rng.normal(0.0, float(known.std()), size=(len(vocab), dim)).astype(np.float32)
  for i, vector in rows.items():
    table[i] = vector
  return table
