"""The accelerator zoo: every config of configs/ compiled for the slice its paper's scale
suggests (and for H100s), its table written into docs/accelerators.md.

    python bench/accelerator_zoo.py --part=tpu      # in an environment with .[tpu]
    python bench/accelerator_zoo.py --part=gpu      # in an environment with .[gpu]
    python bench/accelerator_zoo.py --part=render   # the table from the JSON files
    make accelerators                               # all three (.venv-tpu, .venv-gpu)

Each row's dry-run JSON is kept in docs/results/accelerators/ (a row whose JSON exists is not
compiled again; --force recompiles), so the table can be rendered without the compilers.
"""
import json
import os
import time
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags  # pylint: disable=wrong-import-position

_PART = flags.DEFINE_enum("part", None, ["tpu", "gpu", "render"],
                          "Compile the TPU rows, the GPU rows, or render the table.")
_JSON_DIR = flags.DEFINE_string("json_dir", os.path.join(ROOT, "docs/results/accelerators"),
                                "Where each row's dry-run JSON is kept.")
_OUT = flags.DEFINE_string("out", os.path.join(ROOT, "docs/accelerators.md"),
                           "The Markdown file whose zoo section is rewritten.")
_FORCE = flags.DEFINE_bool("force", False, "Recompile rows whose JSON exists.")


# (config spec, topology, overrides): the recipe's own batch on the slice its paper's scale
# suggests; the ImageNet, ViT and segmentation recipes in both dtypes. In order of interest:
# the zoo compiles the train step only (the eval step: `python -m calib_jax.dry_run`), rows in
# this order, skipping those whose JSON exists.
TPU_ROWS = [
    ("default.py", "v5e:2x2", {}),
    ("mnist_mlp.py", "v5e:2x2", {}),
    ("fashion_mnist_mlp.py", "v5e:2x2", {}),
    ("clutter_objects_cnn.py", "v5e:2x2", {}),
    ("newsgroups20_gpool_cnn.py", "v5e:2x2", {}),
    ("cifar10_resnet50.py", "v5e:2x4", {}),
    ("imagenet_resnet50_acls.py", "v5e:4x8", {"dtype": "bfloat16"}),
    ("imagenet_vit_s16_sam.py", "v5e:4x8", {}),
    ("voc2012_deeplabv3_resnet50.py", "v5e:2x4", {"dtype": "bfloat16"}),
    ("cityscapes_deeplabv3plus_resnet101.py", "v5e:2x2", {"dtype": "bfloat16"}),
    ("imagenet_resnet50_acls.py", "v5e:4x8", {}),
    ("imagenet_resnet50_ls_sc.py", "v5e:4x8", {"dtype": "bfloat16"}),
    ("tiny_imagenet_resnet50.py", "v5e:2x4", {}),
    ("cub200_resnet101.py", "v5e:2x4", {}),
    ("imagenet_boxes_resnet50_als.py", "v5e:4x8", {"dtype": "bfloat16"}),
    # Every config has a row before any gets its second dtype.
    ("cifar10_resnet101.py", "v5e:2x4", {}),
    ("tiny_imagenet_resnet101.py", "v5e:2x4", {}),
    ("imagenet_boxes_resnet101_als.py", "v5e:4x8", {"dtype": "bfloat16"}),
    ("voc2012_deeplabv3_resnet34.py", "v5e:2x4", {}),
    ("voc2012_deeplabv3_resnet50.py", "v5e:2x4", {}),
    ("cityscapes_deeplabv3plus_resnet101.py", "v5e:2x2", {}),
    ("imagenet_vit_s16_sam.py", "v5e:4x8", {"dtype": "float32"}),
    ("imagenet_resnet50_ls_sc.py", "v5e:4x8", {}),
]
GPU_ROWS = [
    ("imagenet_resnet50_acls.py", "a100:1", {"dtype": "bfloat16"}),
    ("imagenet_resnet50_acls.py", "a100:1", {}),
    ("imagenet_resnet50_acls.py", "h100:8", {"dtype": "bfloat16"}),
    ("imagenet_resnet50_acls.py", "h100:1", {"dtype": "bfloat16"}),
    ("imagenet_vit_s16_sam.py", "h100:8", {}),
    ("voc2012_deeplabv3_resnet50.py", "h100:8", {"dtype": "bfloat16"}),
    ("cifar10_resnet50.py", "h100:1", {}),
    ("cityscapes_deeplabv3plus_resnet101.py", "h100:4", {"dtype": "bfloat16"}),
    # The other large recipes on one H100 and on 8 (batch per chip x8 / /8).
    ("imagenet_vit_s16_sam.py", "h100:1", {}),
    ("voc2012_deeplabv3_resnet50.py", "h100:1", {"dtype": "bfloat16"}),
    ("cifar10_resnet50.py", "h100:8", {}),
    ("imagenet_resnet50_ls_sc.py", "h100:1", {"dtype": "bfloat16"}),
    ("imagenet_resnet50_ls_sc.py", "h100:8", {"dtype": "bfloat16"}),
    ("cityscapes_deeplabv3plus_resnet101.py", "h100:1", {"dtype": "bfloat16"}),
    # One H200 (141 GB): the ViT recipe's whole batch, which one H100 cannot hold, and the
    # rows measured on a real H200 (BENCHMARKS.md, "On a real GPU").
    ("imagenet_vit_s16_sam.py", "h200:1", {}),
    ("imagenet_resnet50_acls.py", "h200:1", {"dtype": "bfloat16"}),
]


def row_file(json_dir: str, spec: str, topology: str, overrides: dict) -> str:
  stem = os.path.splitext(spec)[0]
  extra = "".join(f"_{k}-{v}" for k, v in sorted(overrides.items()))
  return os.path.join(json_dir, f"{stem}_{topology.replace(':', '-')}{extra}.json")


def compile_rows(rows, json_dir: str, force: bool) -> None:
  from calib_jax.dry_run import api
  from calib_jax.config import files as config_lib
  os.makedirs(json_dir, exist_ok=True)
  for spec, topology, overrides in rows:
    path = row_file(json_dir, spec, topology, overrides)
    if os.path.exists(path) and not force:
      continue
    config = config_lib.load_config_file(os.path.join(ROOT, "configs", spec))
    for key, value in overrides.items():
      config[key] = value
    start = time.monotonic()
    try:
      result = api.dry_run(config, topology, config_name=spec, eval_step=False)
    except Exception as e:  # pylint: disable=broad-except
      result = {"config": spec, "topology": topology, "dtype": config.dtype,
                "error": str(e).splitlines()[0] if str(e) else type(e).__name__}
      traceback.print_exc()
    result["overrides"] = overrides
    result["wall_seconds"] = time.monotonic() - start
    api.report.write_json(result, path)
    print(f"{spec} {topology} {overrides}: {time.monotonic() - start:.0f} s "
          f"{result.get('error', '')}", flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if _PART.value is None:
    raise app.UsageError("--part is required (tpu, gpu or render)")
  if _PART.value == "render":
    from calib_jax.dry_run import zoo_table
    zoo_table.write(_JSON_DIR.value, _OUT.value, TPU_ROWS + GPU_ROWS, row_file)
  else:
    compile_rows(TPU_ROWS if _PART.value == "tpu" else GPU_ROWS, _JSON_DIR.value, _FORCE.value)


if __name__ == "__main__":
  app.run(main)
