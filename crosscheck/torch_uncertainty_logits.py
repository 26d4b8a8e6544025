"""torch-uncertainty's ResNets (the LS-SC paper's ImageNet models) against calib_jax's.

Writes tests/fixtures/torch_uncertainty_logits.npz: for torch-uncertainty's `resnet(arch=18|50)`
(`torch_uncertainty.models.classification.resnet`, 10 classes, ImageNet style, 64x64 input), the
state-dict keys and the PyTorch logits on seeded weights drawn in numpy with
`calib_jax.models.torch_import.reference_state_dict` (random BatchNorm statistics included), so
that tests/test_models_torch_import.py redraws the weights without torch. Then, at full size
(ResNet-50, 1000 classes, 224x224, batch 2), it wraps the model in torch-uncertainty's
`ClassificationRoutine`, saves a Lightning checkpoint with a Lightning `Trainer` (the form of the
LS-SC authors' `last.ckpt`: weights under 'state_dict' with the 'model.' prefix), imports that
file with `models.import_torch` and prints the largest logit difference.

Needs torch, torch-uncertainty and lightning beside calib_jax (CPU is enough); not run by the
test suite:

    python crosscheck/torch_uncertainty_logits.py [--out tests/fixtures/torch_uncertainty_logits.npz]

torchvision: torch-uncertainty imports it at package import but its ResNet and routine do not
use it. pip's torchvision wheels are built against CUDA torch; with a CPU-only torch (and no
torchvision) the script stands in an empty torchvision module (`--stub_torchvision`, the
default when `import torchvision` fails).
"""
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types

from absl import app, flags, logging
import jax
import numpy as np

from calib_jax import models
from calib_jax.models import torch_import

SMALL = {"resnet18": 18, "resnet50": 50}  # calib_jax name -> torch-uncertainty arch
SMALL_SIZE, SMALL_CLASSES, FULL_SIZE, FULL_CLASSES = 64, 10, 224, 1000
SEED = 0
_OUT = flags.DEFINE_string("out", "tests/fixtures/torch_uncertainty_logits.npz",
                           "the .npz file to write")


class _EmptyModule(types.ModuleType):
  """A module whose every attribute is a callable placeholder (never called here)."""

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _Placeholder()


class _Placeholder:
  def __call__(self, *args, **kwargs):
    return _Placeholder()

  def __getattr__(self, name):
    return _Placeholder()

  def __mro_entries__(self, bases):  # used as a base class
    return (object,)

  def __or__(self, other):  # used in a type annotation `A | B`
    return object

  __ror__ = __or__

  def __getitem__(self, key):  # used in a type annotation `A[B]`
    return object


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def find_spec(self, name, path, target=None):
    if name == "torchvision" or name.startswith("torchvision."):
      return importlib.machinery.ModuleSpec(name, self, is_package=True)
    return None

  def create_module(self, spec):
    return _EmptyModule(spec.name)

  def exec_module(self, module):
    module.__path__ = []


def _import_torch_uncertainty():
  try:
    import torchvision  # noqa: F401
  except Exception:  # pylint: disable=broad-except
    logging.warning("torchvision not importable; standing in an empty module for it")
    sys.meta_path.insert(0, _TorchvisionStandIn())
  from torch_uncertainty.models.classification.resnet import resnet
  from torch_uncertainty.routines.classification import ClassificationRoutine
  return resnet, ClassificationRoutine


def _seeded(model, torch):
  """Loads seeded numpy weights into the torch model; returns the state dict's key list."""
  keys = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
  state = torch_import.reference_state_dict(keys, SEED)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
  return keys


@functools.cache
def _apply(name: str, num_classes: int):
  model = models.get(name, num_classes)
  return jax.jit(lambda v, x: model.apply(v, x, train=False))


def _ours(name: str, variables, x_nchw: np.ndarray, num_classes: int) -> np.ndarray:
  return np.asarray(_apply(name, num_classes)(variables, x_nchw.transpose(0, 2, 3, 1)))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  import lightning
  import torch
  resnet, ClassificationRoutine = _import_torch_uncertainty()

  arrays = {"seed": np.array(SEED)}
  for name, arch in SMALL.items():
    model = resnet(in_channels=3, num_classes=SMALL_CLASSES, arch=arch, style="imagenet").eval()
    keys = _seeded(model, torch)
    x = torch_import.reference_input(SMALL_SIZE, SEED)
    with torch.no_grad():
      logits = model(torch.from_numpy(x)).numpy()
    arrays[f"{name}/keys"] = np.array(json.dumps([(k, list(s)) for k, s in keys]))
    arrays[f"{name}/size"] = np.array(SMALL_SIZE)
    arrays[f"{name}/logits"] = logits.astype(np.float32)
    ours = _ours(name, models.import_torch(name, {k: v for k, v in model.state_dict().items()}),
                 x, SMALL_CLASSES)
    print(f"{name} (torch-uncertainty, {SMALL_CLASSES} classes, {SMALL_SIZE} px): {len(keys)} "
          f"tensors, max |torch| {np.abs(logits).max():.3g}, max |ours - torch| "
          f"{np.abs(ours - logits).max():.3g}")
  np.savez_compressed(_OUT.value, **arrays)
  print(f"wrote {_OUT.value} ({os.path.getsize(_OUT.value)} bytes)")

  # Full size, through a Lightning checkpoint of torch-uncertainty's routine.
  model = resnet(in_channels=3, num_classes=FULL_CLASSES, arch=50, style="imagenet")
  _seeded(model, torch)
  routine = ClassificationRoutine(model=model, num_classes=FULL_CLASSES,
                                  loss=torch.nn.CrossEntropyLoss(label_smoothing=0.2))
  trainer = lightning.pytorch.Trainer(max_epochs=0, logger=False, enable_checkpointing=False,
                                      accelerator="cpu", enable_progress_bar=False,
                                      enable_model_summary=False)
  images = torch.zeros(2, 3, 32, 32)
  loader = torch.utils.data.DataLoader(
      torch.utils.data.TensorDataset(images, torch.zeros(2, dtype=torch.long)), batch_size=2)
  trainer.fit(routine, train_dataloaders=loader)  # max_epochs=0: attaches, trains nothing
  x = torch_import.reference_input(FULL_SIZE, SEED)
  # The seeded weights let activations grow block by block (logits ~1e4); trained ResNets keep
  # them O(1) with small last-BatchNorm scales, so the second check shrinks bn3's 10x.
  for label, bn3_factor in (("seeded weights", 1.0), ("bn3 scales x0.1", 0.1)):
    with torch.no_grad():
      for key, tensor in model.state_dict().items():
        if key.endswith(".bn3.weight"):
          tensor.mul_(bn3_factor)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "last.ckpt")
      trainer.save_checkpoint(path)
      checkpoint = torch.load(path, map_location="cpu", weights_only=True)
      variables = models.import_torch("resnet50", path)
    model.eval()
    with torch.no_grad():
      reference = model(torch.from_numpy(x)).numpy()
    ours = _ours("resnet50", variables, x, FULL_CLASSES)
    error = np.abs(ours - reference).max()
    print(f"resnet50 full size ({label}; torch-uncertainty, {FULL_CLASSES} classes, {FULL_SIZE} "
          f"px, batch 2, float32, imported from the Lightning .ckpt): max |torch| "
          f"{np.abs(reference).max():.4g}, max |ours - torch| {error:.3g} "
          f"({error / np.abs(reference).max():.2g} of max |torch|), same argmax: "
          f"{bool((ours.argmax(-1) == reference.argmax(-1)).all())}")
  print(f"Lightning checkpoint keys: {sorted(checkpoint)}; state_dict: "
        f"{len(checkpoint['state_dict'])} tensors, e.g. {next(iter(checkpoint['state_dict']))}")


if __name__ == "__main__":
  app.run(main)
