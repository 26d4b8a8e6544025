"""PyTorch / safetensors files used directly: `config.pretrained=FILE.safetensors` (a ResNet
fine-tune, a DeepLab backbone) and `eval.py --weights=FILE`, with the one-line errors of a
missing file, a model without a converter and a file of another layout.

The state dicts are seeded numpy arrays in torchvision's layout (no torch needed);
tests/test_models_torch_import.py checks that the conversion gives PyTorch's logits.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from calib_jax import config as config_lib
from calib_jax import data, experiment, models
from calib_jax.config import variants
from calib_jax.experiment import weights
from calib_jax.models import torch_import
from calib_jax.run import loop
from test_cli_train import ROOT, eval_program, parse  # noqa: F401
from test_run_loop import quick_rng_compilation  # noqa: F401

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "torch_reference_logits.npz")


def _fixture_keys(name: str) -> list[tuple[str, list[int]]]:
  with np.load(FIXTURE) as f:
    return json.loads(str(f[f"{name}/keys"]))


def _resnet34_keys() -> list[tuple[str, list[int]]]:
  """torchvision's resnet34 state-dict layout (basic blocks 3-4-6-3, 1000 classes)."""
  bn = lambda name, c: [(f"{name}.{k}", [c]) for k in
                        ("weight", "bias", "running_mean", "running_var")]
  keys = [("conv1.weight", [64, 3, 7, 7])] + bn("bn1", 64)
  inputs = 64
  for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), 1):
    for i in range(blocks):
      prefix = f"layer{stage}.{i}"
      keys += [(f"{prefix}.conv1.weight", [width, inputs, 3, 3])] + bn(f"{prefix}.bn1", width)
      keys += [(f"{prefix}.conv2.weight", [width, width, 3, 3])] + bn(f"{prefix}.bn2", width)
      if i == 0 and stage > 1:
        keys += [(f"{prefix}.downsample.0.weight", [width, inputs, 1, 1])]
        keys += bn(f"{prefix}.downsample.1", width)
      inputs = width
  return keys + [("fc.weight", [1000, 512]), ("fc.bias", [1000])]


def _grayscale_resnet18(num_classes: int, seed: int) -> dict[str, np.ndarray]:
  """A torchvision-layout ResNet-18 state dict for 1-channel images (sklearn digits)."""
  keys = [(k, [64, 1, 7, 7] if k == "conv1.weight" else s) for k, s in _fixture_keys("resnet18")]
  keys = [(k, [num_classes] + s[1:] if k.startswith("fc.") else s) for k, s in keys]
  return torch_import.reference_state_dict(keys, seed=seed)


def _save(state: dict[str, np.ndarray], path) -> str:
  safetensors_numpy.save_file(state, str(path))
  return str(path)


def _digits_resnet18(**overrides):
  config = config_lib.base_config()
  variants.override(config, {
      "data.name": "digits", "model": "resnet18", "data.batch_size": 8,
      "data.eval_batch_size": 256, "num_train_steps": 2, "optimizer.learning_rate": 0.01,
      "schedule.warmup_epochs": 0.0, "checkpoint_every_steps": 2, "keep_checkpoints": 0,
      "log_every_steps": 2, "eval_every_steps": 0, "progress_bar": False, "tensorboard": False})
  return variants.override(config, overrides)


def _recipe(config):
  """The config's model recipe, without checking the rest of the config."""
  return weights.model_recipe(config.model, config.model_kwargs, config.dtype,
                              data.info(config.data.name))


def test_pretrained_safetensors_initialises_and_trains_a_resnet(tmp_path, monkeypatch):
  """A 7-class file for a 10-class model: every backbone leaf comes from the file, the head is
  fresh (pretrained_skip=('head',)), and the run trains from there."""
  state = _grayscale_resnet18(num_classes=7, seed=1)
  config = _digits_resnet18(pretrained=_save(state, tmp_path / "r18.safetensors"),
                            pretrained_skip=("head",))
  # The run's own `Experiment.initial_variables`, recorded as it starts (a copy: the state may
  # take the buffers), instead of building and initialising the ResNet-18 a second time here.
  initialised = []
  initial_variables = experiment.Experiment.initial_variables

  def record(self, key):
    variables = initial_variables(self, key)
    initialised.append(jax.tree.map(np.array, variables))
    return variables

  monkeypatch.setattr(experiment.Experiment, "initial_variables", record)
  out = loop.train_and_evaluate(config, str(tmp_path / "work"), devices=jax.devices()[:1])
  (variables,) = initialised
  np.testing.assert_array_equal(variables["params"]["backbone"]["stem_conv"]["kernel"],
                                state["conv1.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(
      variables["batch_stats"]["backbone"]["stage4_block1"]["bn2"]["var"],
      state["layer4.1.bn2.running_var"])
  assert variables["params"]["head"]["kernel"].shape == (512, 10)
  assert int(jax.device_get(out.step)) == 2
  trained = jax.device_get(out.params)["backbone"]["stem_conv"]["kernel"]
  assert np.all(np.isfinite(trained))
  assert not np.array_equal(trained, variables["params"]["backbone"]["stem_conv"]["kernel"])


@pytest.mark.parametrize("config_file,keys", [
    ("voc2012_deeplabv3_resnet50.py", lambda: _fixture_keys("resnet50")),
    ("voc2012_deeplabv3_resnet34.py", _resnet34_keys),
])
def test_imagenet_resnet_file_lands_in_the_deeplab_backbone(tmp_path, config_file, keys):
  state = torch_import.reference_state_dict(keys(), seed=3)
  config = config_lib.load_config_file(os.path.join(ROOT, "configs", config_file))
  config.pretrained = _save(state, tmp_path / "resnet_imagenet.safetensors")
  model = _recipe(config).build()
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False),
                          jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32))
  fresh = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  restored = weights.restore_pretrained_file(_recipe(config), config.pretrained,
                                             tuple(config.pretrained_skip), fresh)
  backbone = restored["params"]["backbone"]
  np.testing.assert_array_equal(backbone["stage3_block2"]["conv2"]["kernel"],
                                state["layer3.2.conv2.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(backbone["stage4_block0"]["downsample_conv"]["kernel"],
                                state["layer4.0.downsample.0.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(restored["batch_stats"]["backbone"]["stem_bn"]["mean"],
                                state["bn1.running_mean"])
  # ASPP, decoder and head are not in an ImageNet ResNet: they keep their fresh values.
  for module in ("aspp", "decoder_conv1", "head"):
    assert all(not np.any(leaf) for leaf in jax.tree.leaves(restored["params"][module]))


def test_pretrained_errors_are_one_line(tmp_path):
  missing = str(tmp_path / "nowhere" / "r18.pth")
  config = _digits_resnet18(pretrained=missing)
  with pytest.raises(FileNotFoundError) as e:
    weights.read_weight_file(_recipe(config), missing, "config.pretrained")
  assert str(e.value).startswith(f"config.pretrained={missing!r}: no such file")

  path = _save(_grayscale_resnet18(10, seed=2), tmp_path / "r18.safetensors")
  small = _digits_resnet18(model="small_cnn", pretrained=path)
  with pytest.raises(experiment.WeightFileError) as e:
    weights.read_weight_file(_recipe(small), path, "config.pretrained")
  assert "no PyTorch converter for model 'small_cnn'" in str(e.value)
  assert "resnet50" in str(e.value) and "deeplabv3_resnet50" in str(e.value)
  assert "\n" not in str(e.value)
  with pytest.raises(config_lib.ConfigError, match="'small_cnn' has no PyTorch converter"):
    experiment.build(small, devices=jax.devices()[:1])

  wrong_depth = _digits_resnet18(model="resnet34", pretrained=path)
  with pytest.raises(experiment.WeightFileError) as e:
    weights.read_weight_file(_recipe(wrong_depth), path, "config.pretrained")
  assert "does not match 'resnet34'" in str(e.value) and "missing" in str(e.value)
  assert "\n" not in str(e.value)


_EVAL_CONFIG = """
from calib_jax.config import base_config

def get_config():
  config = base_config()
  config.data.name = "digits"
  config.model = "resnet18"
  # The first 64 test (and validation) images, one batch: a ResNet-18 forward pass costs ~30 ms
  # of CPU per image with the suite's unoptimised XLA; 64 images tell the file's weights from
  # any other weights by their NLL (checked below) as well as 300 do.
  config.data.eval_batch_size = 64
  config.eval.max_examples = 64
  config.eval.pnorm_candidates = (2,)
  # The weights' report, not the whole of it: no post-hoc toolkit (test_evaluation_toolkit.py) and no
  # ResNet-18 Grad-CAM grid (test_explain.py, test_evaluation_maps.py), each seconds of compiling.
  config.eval.toolkit = False
  config.eval.cam_images = 0
  return config
"""


def _eval_args(tmp_path, weights, model="resnet18"):
  """eval.py's command line for a digits / `model` config (default.py sets small_cnn options)."""
  config_file = tmp_path / "digits_config.py"
  config_file.write_text(_EVAL_CONFIG)
  return [f"--config={config_file}", f"--workdir={tmp_path / 'eval_only'}",
          f"--config.model={model}", f"--weights={weights}"]


def test_eval_weights_file_without_a_training_run(tmp_path, parse, capsys):
  state = _grayscale_resnet18(num_classes=10, seed=4)
  path = _save(state, tmp_path / "r18.safetensors")
  workdir = tmp_path / "eval_only"
  parse(*_eval_args(tmp_path, path))
  eval_program.main(["eval.py"])
  assert f"weights {path}" in capsys.readouterr().out
  assert not os.path.exists(workdir / "checkpoints")
  with open(workdir / "eval_test" / "metrics.json") as f:
    results = json.load(f)
  assert results["weights"] == path and results["step"] is None
  # The reported accuracy and NLL are those of the file's weights, applied here without the
  # eval code, on the same 64 test images.
  model = models.get("resnet18", 10)
  variables = models.import_torch("resnet18", state)
  apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
  correct, nll = [], []
  for batch in data.make_dataset("digits", "test", batch_size=64, train=False, max_examples=64):
    logits = np.asarray(apply(variables, batch["image"]), np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)
    mask = batch["mask"]
    correct.append((logits.argmax(-1) == batch["label"])[mask])
    nll.append(-np.take_along_axis(log_probs, batch["label"][:, None], -1)[mask, 0])
  correct, nll = np.concatenate(correct), np.concatenate(nll)
  assert results["pre_temperature"]["num_samples"] == correct.size == 64
  assert results["pre_temperature"]["accuracy"] == pytest.approx(correct.mean(), abs=1e-6)
  assert results["pre_temperature"]["nll"] == pytest.approx(nll.mean(), rel=1e-5)


def test_eval_weights_errors_are_one_line_and_exit_non_zero(tmp_path, parse):
  missing = str(tmp_path / "missing.safetensors")
  parse(*_eval_args(tmp_path, missing))
  with pytest.raises(SystemExit) as e:
    eval_program.main(["eval.py"])
  assert e.value.code == f"eval.py: weights={missing!r}: no such file ({missing})"

  path = _save(_grayscale_resnet18(num_classes=10, seed=5), tmp_path / "r18.safetensors")
  parse(*_eval_args(tmp_path, path, model="small_cnn"))
  with pytest.raises(SystemExit) as e:
    eval_program.main(["eval.py"])
  assert e.value.code.startswith(f"eval.py: weights={path!r}: no PyTorch converter for model "
                                 "'small_cnn'; import_torch supports resnet18")
  assert "\n" not in e.value.code

  seven = _save(_grayscale_resnet18(num_classes=7, seed=5), tmp_path / "r18_7.safetensors")
  parse(*_eval_args(tmp_path, seven))
  with pytest.raises(SystemExit) as e:
    eval_program.main(["eval.py"])
  assert "missing params/head/kernel" in e.value.code and "\n" not in e.value.code


def test_pretrained_pth_goes_through_torch_load(tmp_path, monkeypatch):
  """A .pth `pretrained` is read with torch.load (stood in for: the suite has no torch) and
  converted like the .safetensors file of the same tensors."""
  import sys
  import types
  state = _grayscale_resnet18(num_classes=10, seed=6)
  calls = []
  monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
      load=lambda path, **kw: calls.append(path) or dict(state)))
  pth = tmp_path / "resnet18-f37072fd.pth"
  pth.write_bytes(b"")
  config = _digits_resnet18(pretrained=str(pth))
  from_pth = weights.read_weight_file(_recipe(config), str(pth), "config.pretrained")
  assert calls == [str(pth)]
  from_safetensors = weights.read_weight_file(
      _recipe(config), _save(state, tmp_path / "r18.safetensors"), "config.pretrained")
  jax.tree.map(np.testing.assert_array_equal, from_pth, from_safetensors)
