"""Corrupting on the accelerator against the model's forward pass (not a test): the price of
`eval.py --shift` on a chip.

For each setting, on the default JAX device:
* `forward`: the eval step's forward pass, jitted: uint8 images -> float (scaled to [0, 1]) ->
  `model.apply(..., train=False)` (BatchNorm statistics, no dropout) at `--dtype`;
* each corruption of `calib_jax.shift` at severity 3 alone, uint8 -> uint8 (`shift.corrupt`);
* `fused`: the corruption and the forward pass in one program (what a shifted eval step runs).
Median of `--repeats` calls with `block_until_ready` after a warm-up call (compilation,
reported apart). A corruption "costs less than the forward pass" when its column < 1.

Settings: the CIFAR-10-C table at 32 px (ResNet-50 with the CIFAR stem, `--batch32` images)
and the ImageNet-C table at 224 px (ResNet-50, `--batch224` images). frost needs
imagecorruptions' textures (skipped without them); jpeg_compression runs on the host.

  python bench/corruption_device.py --json=/tmp/out/corruption_device.jsonl
"""
import json
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import models, shift
from calib_jax.shift import core
from common import machine, median_seconds  # bench/ is the script's folder

_BATCH32 = flags.DEFINE_integer("batch32", 1024, "images per call at 32 px")
_BATCH224 = flags.DEFINE_integer("batch224", 128, "images per call at 224 px")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed calls after the warm-up")
_NAMES = flags.DEFINE_list("names", [], "corruptions (default: all)")
_SIZES = flags.DEFINE_list("sizes", ["32", "224"], "image sizes to run: 32 and/or 224")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "the model's dtype")
_DEADLINE = flags.DEFINE_float("deadline_s", 240.0, "stop starting new corruptions after this")
_JSON = flags.DEFINE_string("json", "", "append one JSON line per measurement here")
_FUSED = flags.DEFINE_bool("fused", True, "also time each corruption fused with the forward pass "
                           "(one model compilation per corruption: ~5-10 s each on a GPU)")
_SEVERITY = 3
_SETTINGS = {"32": ("cifar10", dict(stem="cifar"), _BATCH32),
             "224": ("imagenet", {}, _BATCH224)}


def _images(size: int, batch: int) -> np.ndarray:
  """Smooth random images with edges (not pure noise, so blurs and codecs see structure)."""
  rng = np.random.default_rng(0)
  coarse = rng.integers(0, 256, (batch, size // 8 + 1, size // 8 + 1, 3)).astype(np.float32)
  fine = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)[:, :size, :size]
  return np.clip(fine + rng.normal(0, 12, fine.shape), 0, 255).astype(np.uint8)


def _forward(size: str, dtype) -> callable:
  _, kwargs, _ = _SETTINGS[size]
  model = models.get("resnet50", 1000 if size == "224" else 10, dtype=dtype, **kwargs)
  variables = model.init(jax.random.key(0), jnp.zeros((1, int(size), int(size), 3)), train=False)

  def forward(images):
    x = images.astype(jnp.float32) / 255.0
    return model.apply(variables, x, train=False)

  return forward


def _record(row: dict) -> None:
  print(json.dumps(row), flush=True)
  if _JSON.value:
    with open(_JSON.value, "a") as f:
      f.write(json.dumps(row) + "\n")


def main(argv: list[str]) -> None:
  del argv
  print(machine(), jax.devices())
  started = time.perf_counter()
  dtype = jnp.bfloat16 if _DTYPE.value == "bfloat16" else jnp.float32
  names = _NAMES.value or shift.corruption_names()
  table_rows = []
  for size in _SIZES.value:
    table, _, batch_flag = _SETTINGS[size]
    batch = batch_flag.value
    images = jax.device_put(_images(int(size), batch))
    key = jax.random.key(1)
    forward = _forward(size, dtype)
    forward_jit = jax.jit(forward)
    t0 = time.perf_counter()
    jax.block_until_ready(forward_jit(images))
    forward_compile = time.perf_counter() - t0
    forward_s = median_seconds(lambda: forward_jit(images), _REPEATS.value)
    _record(dict(part="forward", size=int(size), batch=batch, dtype=_DTYPE.value,
                 seconds=forward_s, images_per_s=batch / forward_s,
                 compile_s=forward_compile))
    for name in names:
      if time.perf_counter() - started > _DEADLINE.value:
        print(f"deadline: stopped before {name} at {size} px")
        break
      program = core._program(name, _SEVERITY, table)  # pylint: disable=protected-access
      try:
        t0 = time.perf_counter()
        jax.block_until_ready(program(images, key))
      except Exception as e:  # pylint: disable=broad-except  # frost without the textures
        print(f"{name} at {size} px: skipped ({str(e).splitlines()[0][:120]})")
        continue
      compile_s = time.perf_counter() - t0
      alone = median_seconds(lambda: program(images, key), _REPEATS.value)
      fused = float("nan")
      if _FUSED.value:
        fused_jit = jax.jit(lambda x, k, program=program: forward(program(x, k)))
        jax.block_until_ready(fused_jit(images, key))
        fused = median_seconds(lambda: fused_jit(images, key), _REPEATS.value)
      row = dict(part="corruption", name=name, size=int(size), batch=batch,
                 host=name in core.HOST_CORRUPTIONS, seconds=alone,
                 images_per_s=batch / alone, compile_s=compile_s, fused_seconds=fused,
                 corrupt_over_forward=alone / forward_s,
                 fused_over_forward=fused / forward_s)
      _record(row)
      table_rows.append(row)
  print("\n| corruption | px | batch | images/s | corrupt / forward | fused / forward |")
  print("|---|---|---|---|---|---|")
  for r in table_rows:
    where = " (host)" if r["host"] else ""
    print(f"| {r['name']}{where} | {r['size']} | {r['batch']} | {r['images_per_s']:,.0f} | "
          f"{r['corrupt_over_forward']:.2f} | {r['fused_over_forward']:.2f} |")


if __name__ == "__main__":
  app.run(main)
