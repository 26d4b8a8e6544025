"""import_torch: torchvision / torch-uncertainty / timm state dicts give the PyTorch logits in our
models.

The reference logits in fixtures/torch_reference_logits.npz come from
crosscheck/torch_reference_logits.py (real torch, torchvision, timm), those in
fixtures/torch_uncertainty_logits.npz from crosscheck/torch_uncertainty_logits.py (torch-uncertainty's
ResNets, the LS-SC paper's layout), on seeded numpy weights; here the same weights are redrawn from
the seed, so no torch is needed.
"""
import functools
import json
import os
import pickle
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import models
from calib_jax.models import torch_import
from calib_jax.run import loop
from calib_jax import config as config_lib
from calib_jax.config import variants

@pytest.fixture(autouse=True, scope="module")
def quick_rng_compilation():
  """Non-partitionable threefry: XLA:CPU compiles the partitionable variant's random-number
  kernels much more slowly (the fine-tune initialises a ResNet-18)."""
  previous = jax.config.jax_threefry_partitionable
  jax.config.update("jax_threefry_partitionable", False)
  yield
  jax.config.update("jax_threefry_partitionable", previous)


FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "torch_reference_logits.npz")
TU_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "torch_uncertainty_logits.npz")


def _reference(name: str, fixture: str = FIXTURE
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
  """(state dict, NHWC input, torch logits) of one fixture model; the dict is the caller's."""
  state, x, logits = _draw(name, fixture)
  return dict(state), x, logits


@functools.cache
def _draw(name: str, fixture: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
  with np.load(fixture) as f:
    keys, size = json.loads(str(f[f"{name}/keys"])), int(f[f"{name}/size"])
    logits, seed = f[f"{name}/logits"], int(f["seed"])
  state = torch_import.reference_state_dict(keys, seed)
  x = torch_import.reference_input(size, seed).transpose(0, 2, 3, 1)
  return state, x, logits


@functools.cache
def _apply(name: str):
  """One compiled forward per model (10 classes), shared by the torchvision and torch-uncertainty
  checks: their variables have the same tree and shapes."""
  model = models.get(name, num_classes=10)
  return jax.jit(lambda v, x: model.apply(v, x, train=False))


def _assert_same_logits(name: str, variables: dict, x: np.ndarray, reference: np.ndarray):
  ours = np.asarray(_apply(name)(variables, x))
  error = np.abs(ours - reference).max()
  print(f"{name}: max |ours - torch| = {error:.3g}, max |torch| = {np.abs(reference).max():.3g}")
  assert error <= 1e-3 * np.abs(reference).max()


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "vit_s16"])
def test_logits_equal_pytorch(name):
  state, x, reference = _reference(name)
  _assert_same_logits(name, models.import_torch(name, state), x, reference)


@pytest.mark.parametrize("name,wrapped", [("resnet18", False), ("resnet50", True)])
def test_torch_uncertainty_resnet_logits_equal_pytorch(name, wrapped):
  """torch-uncertainty's ResNet layout (`shortcut`, `linear`), as a bare state dict and as the
  LS-SC authors' Lightning checkpoints hold it ({'state_dict': {'model.conv1.weight': ...}, ...})."""
  state, x, reference = _reference(name, TU_FIXTURE)
  assert "linear.weight" in state and any(".shortcut." in k for k in state)
  assert torch_import.resnet_layout(state) == "torch-uncertainty"
  if wrapped:
    state = {"epoch": 119, "global_step": 150_000, "pytorch-lightning_version": "2.2.0",
             "state_dict": {f"model.{k}": v for k, v in state.items()},
             "loops": {}, "callbacks": {}, "optimizer_states": [], "lr_schedulers": []}
  _assert_same_logits(name, models.import_torch(name, state), x, reference)


def test_wrapper_prefixes_are_removed_and_layer_keys_are_not_taken_for_one():
  state = _reference("resnet18", TU_FIXTURE)[0]
  for prefix in ("model.", "module.", "_orig_mod.", "model.module."):
    stripped, found = torch_import.strip_wrapper_prefix({prefix + k: v for k, v in state.items()})
    assert found == prefix and stripped.keys() == state.keys()
  without_stem = {k: v for k, v in state.items() if k != "conv1.weight"}
  assert torch_import.strip_wrapper_prefix(without_stem) == (without_stem, "")


def test_torch_uncertainty_checkpoint_errors_are_one_line_naming_the_keys():
  state = _reference("resnet50", TU_FIXTURE)[0]
  checkpoint = {"state_dict": {f"model.{k}": v for k, v in state.items()
                               if not k.startswith("layer4.2.bn3.")}}
  checkpoint["state_dict"]["model.layer5.0.conv1.weight"] = np.zeros((1, 1, 1, 1), np.float32)
  checkpoint["state_dict"]["loss.weight"] = np.ones(10, np.float32)
  checkpoint["state_dict"]["model.layer1.0.shortcut.1.running_var"] = np.ones(5, np.float32)
  with pytest.raises(ValueError) as e:
    models.import_torch("resnet50", checkpoint)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith("the state dict (torch-uncertainty layout, prefix 'model.' removed) "
                            "does not match 'resnet50': missing (4): ")
  assert "layer4.2.bn3.bias -> params/backbone/stage4_block2/bn3/bias" in message
  assert "layer4.2.bn3.running_var -> batch_stats/backbone/stage4_block2/bn3/var" in message
  assert "; unused (2): layer5.0.conv1.weight, loss.weight; " in message
  assert ("shape mismatch (1): layer1.0.shortcut.1.running_var -> "
          "batch_stats/backbone/stage1_block0/downsample_bn/var: file (5,), model (256,)") in message


def test_long_lists_are_counted_and_cut():
  state = _reference("resnet50", TU_FIXTURE)[0]
  state = {k: v for k, v in state.items() if not k.startswith("layer3.")}
  with pytest.raises(ValueError) as e:
    models.import_torch("resnet50", state)
  message = str(e.value)
  # layer3: 6 blocks of 3 convolutions (1 tensor) and 3 BatchNorms (4), and block 0's shortcut
  assert "missing (95): layer3.0." in message and "... and 90 more" in message
  assert "unused" not in message and "\n" not in message


def test_cifar_style_file_gets_a_hint():
  state = _reference("resnet18", TU_FIXTURE)[0]
  state["conv1.weight"] = np.zeros((64, 3, 3, 3), np.float32)
  with pytest.raises(ValueError, match=r"file \(3, 3, 3, 64\), model \(7, 7, 3, 64\).*"
                                       r"model_kwargs=\{'stem': 'cifar'\}"):
    models.import_torch("resnet18", state)
  variables = models.import_torch("resnet18", state, model_kwargs={"stem": "cifar"})
  assert variables["params"]["backbone"]["stem_conv"]["kernel"].shape == (3, 3, 3, 64)


def _resnet18_state() -> dict[str, np.ndarray]:
  return _reference("resnet18")[0]


def test_missing_unused_and_mismatched_keys_are_named():
  state = _resnet18_state()
  del state["layer2.1.conv2.weight"]
  state["layer9.0.conv1.weight"] = np.zeros((1, 1, 1, 1), np.float32)
  state["layer1.0.bn1.running_var"] = np.ones(5, np.float32)
  with pytest.raises(ValueError) as e:
    models.import_torch("resnet18", state)
  message = str(e.value)
  assert "backbone/stage2_block1/conv2/kernel" in message
  assert "layer9.0.conv1.weight" in message
  assert ("layer1.0.bn1.running_var -> batch_stats/backbone/stage1_block0/bn1/var: file (5,), "
          "model (64,)") in message


def test_unsupported_model_and_missing_file():
  with pytest.raises(ValueError, match="supports resnet18"):
    models.import_torch("densenet_bc100_12", {})
  with pytest.raises(FileNotFoundError):
    models.import_torch("resnet18", "/nonexistent/r18.safetensors")


def test_safetensors_round_trip(tmp_path):
  from safetensors import numpy as safetensors_numpy
  state = _resnet18_state()
  path = str(tmp_path / "r18.safetensors")
  safetensors_numpy.save_file(state, path)
  from_file = models.import_torch("resnet18", path)
  from_dict = models.import_torch("resnet18", state)
  jax.tree.map(np.testing.assert_array_equal, from_file, from_dict)


def test_pth_file_without_torch_says_what_to_do(tmp_path, monkeypatch):
  path = tmp_path / "r18.pth"
  path.write_bytes(b"")
  monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
  with pytest.raises(ImportError, match="needs torch.*safetensors"):
    models.import_torch("resnet18", path)


class _FakeTensor:
  """What the reader uses of a torch tensor (detach/cpu/is_floating_point/float/numpy)."""

  def __init__(self, array):
    self._array = array

  def detach(self):
    return self

  def cpu(self):
    return self

  def is_floating_point(self):
    return self._array.dtype.kind == "f"

  def float(self):
    return _FakeTensor(self._array.astype(np.float32))

  def numpy(self):
    return self._array


def test_pth_files_are_read_with_torch_load(tmp_path, monkeypatch):
  """A .pth goes through `torch.load(path, map_location='cpu', weights_only=True)`, training
  checkpoints' {'state_dict': ...} wrapper is unwrapped and tensors become numpy arrays. torch
  is stood in for (the suite does not install it); crosscheck/torch_reference_logits.py runs the
  real one."""
  import types
  state = _resnet18_state()
  calls = []

  def load(path, **kwargs):
    calls.append((path, kwargs))
    return {"state_dict": {k: _FakeTensor(v.astype(np.float16)) for k, v in state.items()}}

  monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
  path = str(tmp_path / "r18.pth")
  open(path, "wb").close()  # the reader checks the file exists before torch.load opens it
  from_file = models.import_torch("resnet18", path)
  assert calls == [(path, {"map_location": "cpu", "weights_only": True})]
  expected = models.import_torch("resnet18", {k: v.astype(np.float16).astype(np.float32)
                                              for k, v in state.items()})
  jax.tree.map(np.testing.assert_array_equal, from_file, expected)


def test_head_of_another_class_count_is_dropped_and_restored_fresh():
  state = _resnet18_state()
  variables = models.import_torch("resnet18", state, num_classes=200)
  assert "head" not in variables["params"]
  np.testing.assert_array_equal(variables["params"]["backbone"]["stem_conv"]["kernel"],
                                state["conv1.weight"].transpose(2, 3, 1, 0))
  model = models.get("resnet18", num_classes=200)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False),
                          jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32))
  fresh = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  restored = models.restore_pretrained(fresh, variables)
  assert restored["params"]["head"]["kernel"].shape == (512, 200)
  np.testing.assert_array_equal(restored["batch_stats"]["backbone"]["stem_bn"]["var"],
                                state["bn1.running_var"])


def test_fine_tune_from_an_imported_file(tmp_path):
  """A grayscale torchvision-layout ResNet-18 (10 classes) -> msgpack -> train on digits."""
  with np.load(FIXTURE) as f:
    keys = json.loads(str(f["resnet18/keys"]))
  keys = [(k, [64, 1, 7, 7] if k == "conv1.weight" else s) for k, s in keys]
  keys = [(k, [7] + s[1:] if k.startswith("fc.") else s) for k, s in keys]
  state = torch_import.reference_state_dict(keys, seed=1)
  path = models.save_variables(tmp_path / "r18.msgpack",
                               models.import_torch("resnet18", state))
  config = config_lib.base_config()
  variants.override(config, {
      "data.name": "digits", "model": "resnet18", "pretrained": path,
      "pretrained_skip": ("head",), "data.batch_size": 8, "data.eval_batch_size": 256,
      "num_train_steps": 2, "optimizer.learning_rate": 0.01, "schedule.warmup_epochs": 0.0,
      "checkpoint_every_steps": 2, "keep_checkpoints": 0, "log_every_steps": 2,
      "eval_every_steps": 0, "progress_bar": False, "tensorboard": False})
  # digits' own 8x8 images and test_models_torch_weights.py's fine-tune config: the same
  # training programs, compiled once for both tests (the suite's compilation cache).
  state_out = loop.train_and_evaluate(config, str(tmp_path / "work"), devices=jax.devices()[:1])
  params = jax.device_get(state_out.params)
  assert params["head"]["kernel"].shape == (512, 10)
  assert int(jax.device_get(state_out.step)) == 2


def test_lightning_ckpt_file_is_read_with_torch_load(tmp_path, monkeypatch):
  """A Lightning .ckpt (the LS-SC authors' last.ckpt) goes through torch.load like a .pth, its
  'state_dict' unwrapped and the 'model.' prefix removed; torch is stood in for."""
  import types
  state, x, reference = _reference("resnet18", TU_FIXTURE)
  checkpoint = {"epoch": 119, "state_dict": {f"model.{k}": _FakeTensor(v) for k, v in state.items()},
                "optimizer_states": [{}]}
  calls = []
  monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
      load=lambda path, **kwargs: calls.append(kwargs) or checkpoint))
  path = tmp_path / "last.ckpt"
  path.write_bytes(b"")
  assert torch_import.is_torch_file(path)
  variables = models.import_torch("resnet18", path)
  assert calls == [{"map_location": "cpu", "weights_only": True}]
  _assert_same_logits("resnet18", variables, x, reference)


def test_checkpoint_pickling_objects_gets_one_line_with_the_way_out(tmp_path, monkeypatch):
  """torch.load(weights_only=True) refuses a checkpoint that pickles objects (a Lightning
  module's hyper-parameters holding a loss module); the message names the object and says how
  to keep the weights alone, without running the pickle."""
  import types

  def load(path, **kwargs):
    raise pickle.UnpicklingError(
        "Weights only load failed. This file can still be loaded, to do so you have two options"
        "\n(1) ...\nWeightsUnpickler error: Unsupported global: GLOBAL "
        "torch.nn.modules.loss.CrossEntropyLoss was not an allowed global by default.")

  monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
  path = tmp_path / "last.ckpt"
  path.write_bytes(b"")
  with pytest.raises(ValueError) as e:
    models.import_torch("resnet50", path)
  message = str(e.value)
  assert "\n" not in message
  assert "(torch.nn.modules.loss.CrossEntropyLoss)" in message
  assert (f"torch.load({str(path)!r}, weights_only=False); "
          "torch.save(c.get('state_dict', c), 'weights.pth')") in message
