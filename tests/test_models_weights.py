"""Tests of weight files: save / load round trip, restore_pretrained, embeddings from files."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import models
from calib_jax.models import weights

KEY = jax.random.key(0)


def random_variables(model, input_shape, seed=0):
  """Variables of `model` with random values, built from shapes only (no forward pass)."""
  x = jax.ShapeDtypeStruct(input_shape, jnp.float32)
  shapes = jax.eval_shape(lambda x: model.init({"params": KEY}, x), x)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: rng.standard_normal(s.shape, dtype=np.float32), shapes)


@pytest.fixture(scope="module")
def small_variables():
  model = models.get("small_cnn", 10)
  return model, jax.jit(model.init)({"params": KEY}, jnp.ones((2, 8, 8, 3)))


def test_save_load_round_trip(tmp_path, small_variables):
  model, variables = small_variables
  path = weights.save_variables(tmp_path / "sub" / "small.msgpack", variables)
  assert path == str(tmp_path / "sub" / "small.msgpack")
  for like in (None, variables):
    loaded = weights.load_variables(path, like=like)
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(variables)
    for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(variables)):
      np.testing.assert_array_equal(a, b)
  x = jnp.ones((1, 8, 8, 3))
  np.testing.assert_array_equal(model.apply(loaded, x), model.apply(variables, x))


def test_relative_paths_resolve_against_the_working_directory(tmp_path, monkeypatch,
                                                               small_variables):
  _, variables = small_variables
  monkeypatch.chdir(tmp_path)
  path = models.save_variables("w.msgpack", variables)
  assert path == str(tmp_path / "w.msgpack")
  loaded = models.load_variables("w.msgpack")
  np.testing.assert_array_equal(loaded["params"]["head"]["kernel"],
                                variables["params"]["head"]["kernel"])


def test_missing_and_corrupt_files(tmp_path, small_variables):
  with pytest.raises(FileNotFoundError, match="nope.msgpack"):
    weights.load_variables(tmp_path / "nope.msgpack")
  bad = tmp_path / "bad.msgpack"
  bad.write_bytes(b"\x00not msgpack at all\xff" * 3)
  with pytest.raises(ValueError, match="not a flax msgpack"):
    weights.load_variables(bad)


def test_load_with_like_reports_mismatches(tmp_path, small_variables):
  _, variables = small_variables
  path = weights.save_variables(tmp_path / "small.msgpack", variables)
  other = models.get("small_cnn", 3)
  like = jax.eval_shape(lambda x: other.init({"params": KEY}, x),
                        jax.ShapeDtypeStruct((1, 8, 8, 3), jnp.float32))
  with pytest.raises(ValueError, match=r"params/head/kernel: file has shape \(128, 10\), "
                                       r"expected \(128, 3\)"):
    weights.load_variables(path, like=like)


def leaves_by_path(tree):
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_restore_imagenet_resnet50_into_deeplab():
  pretrained = random_variables(models.get("resnet50", 1000), (1, 64, 64, 3), seed=1)
  deeplab = models.get("deeplabv3_resnet50", 21)
  fresh = random_variables(deeplab, (1, 64, 64, 3), seed=2)
  restored = models.restore_pretrained(fresh, pretrained)

  source, before, after = (leaves_by_path(t) for t in (pretrained, fresh, restored))
  assert set(after) == set(before)
  backbone = [p for p in after if "'backbone'" in p]
  # Every ResNet-50 leaf but the head's kernel and bias: 53 conv kernels, 53 BN x 4.
  assert set(backbone) == {p for p in source if "'head'" not in p}
  assert len(backbone) == 53 * 5
  for path in after:
    if "'backbone'" in path:
      np.testing.assert_array_equal(after[path], source[path])
    else:  # ASPP, decoder and the 21-class head keep their initialisation
      np.testing.assert_array_equal(after[path], before[path])
  assert any("batch_stats" in p and "'backbone'" in p for p in backbone)
  # The input was not modified.
  assert not np.array_equal(leaves_by_path(fresh)[backbone[0]], source[backbone[0]])


def test_restore_for_a_new_number_of_classes(tmp_path):
  model = models.get("cifar_resnet20", 10)
  pretrained = random_variables(model, (1, 32, 32, 3), seed=3)
  path = weights.save_variables(tmp_path / "r20.msgpack", pretrained)
  target = random_variables(models.get("cifar_resnet20", 200), (1, 32, 32, 3), seed=4)

  restored = models.restore_pretrained(target, path)  # from a file, default skip=('head',)
  np.testing.assert_array_equal(restored["params"]["stem_conv"]["kernel"],
                                pretrained["params"]["stem_conv"]["kernel"])
  np.testing.assert_array_equal(restored["params"]["head"]["kernel"],
                                target["params"]["head"]["kernel"])

  with pytest.raises(ValueError) as info:
    models.restore_pretrained(target, pretrained, skip=())
  message = str(info.value)
  assert "params/head/kernel: pretrained (64, 10), model (64, 200)" in message
  assert "params/head/bias: pretrained (10,), model (200,)" in message

  # A bare params tree works too; skipping by path prefix.
  restored = models.restore_pretrained(target, pretrained["params"],
                                       skip=("head", "params/stage3_block2"))
  np.testing.assert_array_equal(restored["params"]["stage3_block2"]["conv1"]["kernel"],
                                target["params"]["stage3_block2"]["conv1"]["kernel"])
  np.testing.assert_array_equal(restored["params"]["stage3_block1"]["conv1"]["kernel"],
                                pretrained["params"]["stage3_block1"]["conv1"]["kernel"])
  np.testing.assert_array_equal(restored["batch_stats"]["stem_bn"]["mean"],
                                target["batch_stats"]["stem_bn"]["mean"])


def test_restore_with_nothing_in_common_fails():
  target = random_variables(models.get("small_cnn", 10), (1, 8, 8, 3))
  other = random_variables(models.get("mlp", 10, hidden=(4,)), (1, 8, 8, 3))
  with pytest.raises(ValueError, match="no parameter of the pretrained weights matches"):
    models.restore_pretrained(target, other)


def test_load_embedding_formats(tmp_path):
  table = np.arange(12, dtype=np.float32).reshape(4, 3)
  np.save(tmp_path / "e.npy", table)
  np.savez(tmp_path / "e.npz", vectors=table)
  weights.save_variables(tmp_path / "e.msgpack", {"embedding": table})
  for name in ("e.npy", "e.npz", "e.msgpack"):
    np.testing.assert_array_equal(weights.load_embedding(tmp_path / name), table)
  np.save(tmp_path / "bad.npy", table[0])
  with pytest.raises(ValueError, match="2-D"):
    weights.load_embedding(tmp_path / "bad.npy")


def test_load_word_vectors_glove_text(tmp_path):
  glove = tmp_path / "glove.txt"
  glove.write_text("the 0.1 0.2 0.3\ncat 1.0 -1.0 0.5\nunused 9 9 9\n", encoding="utf-8")
  table = weights.load_word_vectors(glove, ["<pad>", "cat", "the", "zebra"], seed=0)
  assert table.shape == (4, 3) and table.dtype == np.float32
  np.testing.assert_allclose(table[1], [1.0, -1.0, 0.5])
  np.testing.assert_allclose(table[2], [0.1, 0.2, 0.3])
  assert not np.any(np.all(table[[0, 3]] == 9.0, axis=1))
  np.testing.assert_array_equal(
      table, weights.load_word_vectors(glove, ["<pad>", "cat", "the", "zebra"], seed=0))
  with pytest.raises(ValueError, match="none of the 2 vocabulary words"):
    weights.load_word_vectors(glove, ["dog", "fish"])
