"""Writes tests/fixtures/torch_reference_logits.npz: PyTorch logits for seeded random weights.

Needs torch, torchvision and timm (CPU is enough); not run by the test suite. For resnet18 and
resnet50 (torchvision, 10 classes, 64x64 input) and vit_s16 (timm vit_small_patch16_224, 10
classes, 224x224 input), it draws a state dict in numpy with
`calib_jax.models.torch_import.reference_state_dict` (so the test can redraw it without torch),
loads it, runs eval mode on a seeded input of batch 2 and stores the logits with the key list.

    python crosscheck/torch_reference_logits.py [--out tests/fixtures/torch_reference_logits.npz]
"""
from absl import app, flags, logging
import numpy as np
import timm
import torch
import torchvision

from calib_jax.models import torch_import

# calib_jax name -> (torch model builder, input side)
MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), 64),
    "resnet50": (lambda: torchvision.models.resnet50(num_classes=10), 64),
    "vit_s16": (lambda: timm.create_model("vit_small_patch16_224", num_classes=10), 224),
}
SEED = 0
_OUT = flags.DEFINE_string("out", "tests/fixtures/torch_reference_logits.npz",
                           "the .npz file to write")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  arrays = {"seed": np.array(SEED)}
  for name, (build, size) in MODELS.items():
    model = build().eval()
    keys = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    state = torch_import.reference_state_dict(keys, SEED)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    with torch.no_grad():
      logits = model(torch.from_numpy(torch_import.reference_input(size, SEED))).numpy()
    arrays[f"{name}/keys"] = np.array(torch_import.keys_to_json(state))
    arrays[f"{name}/size"] = np.array(size)
    arrays[f"{name}/logits"] = logits.astype(np.float32)
    print(f"{name}: {len(keys)} tensors, logits max |.| {np.abs(logits).max():.3g}")
  np.savez_compressed(_OUT.value, **arrays)


if __name__ == "__main__":
  app.run(main)
