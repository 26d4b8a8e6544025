"""The zoo table of docs/accelerators.md from the dry runs' JSON (`bench/accelerator_zoo.py`).

Beside each estimate: the analytic training FLOPs of the networks with a published count, and
published ResNet-50 throughputs per chip with the ratio of our roofline estimate to them.
"""
import json
import os
import re
from typing import Any, Callable

from calib_jax.config import files as config_lib

# Forward multiply-accumulates per example at 224x224, and the passes a training step makes:
# forward + backward ≈ 3 forwards; SAM (sam_rho > 0) takes two gradients per step.
# ResNet-50: 4.1 GMACs (He et al. 2016, Table 1: 3.8e9 FLOPs counted as multiply-adds, 4.1e9
# for v1.5's stride in the 3x3 conv); ViT-S/16: 4.6 GMACs (Touvron et al. 2021, DeiT Table 1).
ANALYTIC_GMACS = {"resnet50": 4.1, "vit_s16": 4.6}

# Published training throughput per chip (images/s), ResNet-50 v1.5 at 224 px.
PUBLISHED = {
    ("resnet50", "a100", "bfloat16"): (
        2470, "NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, 1x A100 80GB, mixed "
        "precision (PyTorch/Classification/ConvNets/resnet50v1.5/README.md)"),
    ("resnet50", "a100", "float32"): (
        938, "same README, 1x A100 80GB, TF32"),
}

BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"


def _gib(n: float) -> str:
  return f"{n / 2**30:.2f}"


def analytic_gflop(result: dict[str, Any], model: str, sam: bool) -> float | None:
  """Training GFLOP per example from the published forward MACs (224 px ImageNet only)."""
  if model not in ANALYTIC_GMACS or "imagenet" not in result["config"]:
    return None
  return ANALYTIC_GMACS[model] * 2 * 3 * (2 if sam else 1)


def row(result: dict[str, Any], model: str, sam: bool) -> str:
  """One markdown table row of a dry run's JSON."""
  r = result
  name = r["config"] + (f" ({r['dtype']})" if r.get("dtype") else "")
  where = f"{r['topology']}"
  if "error" in r:
    return f"| {name} | {where} | | | error: {r['error']} | | | | | | |"
  where += f" ({r['chips']} chip{'s' if r['chips'] > 1 else ''}, {r['processes']} host{'s' if r['processes'] > 1 else ''})"
  fits = "yes" if r["fits"] else f"**no** (+{_gib(r['over_bytes'])} GiB)"
  if r["flops_per_step"] is None:
    return (f"| {name} | {where} | {r['per_chip_batch']} | {_gib(r['per_chip_bytes'])} | "
            f"{fits} | | | | | | |")
  per_example = r["flops_per_step"] / r["per_chip_batch"] / 1e9
  analytic = analytic_gflop(r, model, sam)
  check = f"{per_example:.1f}" + (f" / {analytic:.1f} ({per_example / analytic:.2f})"
                                  if analytic else "")
  rate = r.get("examples_per_second_per_chip", 0.0)
  published = PUBLISHED.get((model, r["chip"], r["dtype"]))
  versus = f"{published[0]} ({rate / published[0]:.2f}x)" if published else ""
  return (f"| {name} | {where} | {r['per_chip_batch']} | {_gib(r['per_chip_bytes'])} | {fits} "
          f"| {r['flops_per_step'] / 1e9:.1f} | {check} | {r['step_seconds_estimate'] * 1e3:.2f} "
          f"| {rate:.0f} | {versus} | {r.get('chip_hours', 0.0):.1f} |")


HEADER = (
    "| Config (dtype) | Topology | Batch / chip | Memory / chip (GiB) | Fits | GFLOP / step / "
    "chip | GFLOP / example (analytic, ratio) | Roofline step (ms) | Est. images/s / chip | "
    "Published images/s / chip (est./published) | Chip-hours, whole recipe |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|")


def table(json_dir: str, rows: list, row_file: Callable[..., str]) -> str:
  """The zoo table: one row per `(config, topology, overrides)` whose JSON exists."""
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  lines, missing = [HEADER], []
  for spec, topology, overrides in rows:
    path = row_file(json_dir, spec, topology, overrides)
    if not os.path.exists(path):
      missing.append(f"{spec} on {topology} {overrides or ''}".strip())
      continue
    with open(path, encoding="utf-8") as f:
      result = json.load(f)
    config = config_lib.load_config_file(os.path.join(package, "configs", spec))
    lines.append(row(result, config.model, config.optimizer.sam_rho > 0))
  if missing:
    lines.append("\nNot compiled yet: " + "; ".join(missing) + ".")
  return "\n".join(lines)


def write(json_dir: str, out: str, rows: list, row_file: Callable[..., str]) -> None:
  """Replaces the text between the zoo markers of `out` with `table(...)`."""
  with open(out, encoding="utf-8") as f:
    text = f.read()
  pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
  if not pattern.search(text):
    raise ValueError(f"{out} has no {BEGIN} ... {END} section")
  text = pattern.sub(lambda _: f"{BEGIN}\n{table(json_dir, rows, row_file)}\n{END}", text)
  with open(out, "w", encoding="utf-8") as f:
    f.write(text)
