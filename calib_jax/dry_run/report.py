"""The dry run's numbers: a roofline step time, the run's cost, the printed summary and JSON.

Roofline (Williams, Waterman & Patterson 2009, "Roofline: an insightful visual performance
model"): a step cannot take less than its FLOPs at the chip's peak rate, nor less than its HBM
traffic at the chip's bandwidth,

    t_step ≈ max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)      (per chip, per step)

so the estimate is a lower bound: it assumes perfect overlap of compute and memory, no time in
the all-reduce of the gradients and an input pipeline that keeps up. Real steps of
convolutional nets reach 40-60 % of it on TPU (`docs/accelerators.md` compares with published
ResNet-50 throughputs).
"""
import dataclasses
import json
from typing import Any

from calib_jax.dry_run.chips import Chip
from calib_jax.dry_run.compile import Program, StepCompile
from calib_jax.dry_run.topologies import Topology


def roofline_seconds(flops: float, bytes_accessed: float, chip: Chip, dtype: str) -> float:
  """`max(flops / peak, bytes / bandwidth)` for one chip (see the module docstring)."""
  return max(flops / chip.peak_flops(dtype), bytes_accessed / chip.hbm_bandwidth)


def _step_dict(step: StepCompile | None, chip: Chip, dtype: str) -> dict[str, Any] | None:
  if step is None:
    return None
  out = dataclasses.asdict(step)
  out["over_bytes"] = max(step.per_chip_bytes - chip.hbm_bytes, 0)
  out["step_seconds_estimate"] = (
      roofline_seconds(step.flops, step.bytes_accessed, chip, dtype)
      if step.flops is not None and step.bytes_accessed is not None else None)
  return out


def summary(config_name: str, config, topology: Topology, program: Program) -> dict[str, Any]:
  """The dry run's JSON: the train step's figures at the top level, the eval step's under
  'eval', and the run's length and cost from the roofline step time."""
  chip, dtype = topology.device, config.dtype
  train = _step_dict(program.train, chip, dtype)
  step_seconds = train["step_seconds_estimate"]
  batch = int(config.data.batch_size)
  out = {
      "config": config_name,
      "topology": topology.name,
      "chip": chip.name,
      "chips": topology.num_chips,
      "devices": topology.num_devices,
      "processes": topology.num_processes,
      "dtype": dtype,
      "global_batch": batch,
      "per_chip_batch": batch // topology.num_devices,
      "per_chip_bytes": train["per_chip_bytes"],
      "hbm_bytes": chip.hbm_bytes,
      "fits": train["fits"],
      "over_bytes": train["over_bytes"],
      "flops_per_step": train["flops"],
      "bytes_per_step": train["bytes_accessed"],
      "step_seconds_estimate": step_seconds,
      "compile_seconds": train["compile_seconds"],
      "train": train,
      "eval": _step_dict(program.eval, chip, dtype),
      "num_train_examples": program.num_train_examples,
      "steps_per_epoch": program.steps_per_epoch,
      "total_steps": program.total_steps,
      "host_vcpus_per_chip": chip.host_vcpus_per_chip,
      "chip_source": chip.source,
      "sweep_members": program.members,
  }
  if program.shift_eval is not None:  # eval.py --shift's step: the cell needing most memory
    shifted = program.shift_eval
    out["shift_eval"] = {**(_step_dict(shifted.step, chip, dtype) or {}), "cell": shifted.cell,
                         "compiled": shifted.compiled, "left_out": shifted.left_out}
  if program.ensemble_eval is not None:
    out["ensemble_eval"] = _step_dict(program.ensemble_eval, chip, dtype)
  if step_seconds and program.members > 1:
    out["member_step_seconds_estimate"] = step_seconds / program.members
    out["member_examples_per_second"] = batch * program.members / step_seconds
  if step_seconds:
    out["examples_per_second"] = batch / step_seconds
    out["examples_per_second_per_chip"] = batch / step_seconds / topology.num_chips
    out["epoch_seconds"] = program.steps_per_epoch * step_seconds
    out["run_hours"] = program.total_steps * step_seconds / 3600
    out["chip_hours"] = out["run_hours"] * topology.num_chips
  return out


def _size(n: float | None) -> str:
  if n is None:
    return "?"
  for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{int(n)} B"


def _duration(seconds: float | None) -> str:
  if seconds is None:
    return "?"
  if seconds < 1:
    return f"{seconds * 1e3:.2f} ms"
  if seconds < 3600:
    return f"{seconds:.1f} s"
  return f"{seconds / 3600:.1f} h"


def text(result: dict[str, Any]) -> str:
  """The printed summary of a `summary` dict."""
  r = result
  lines = [
      f"{r['config']} on {r['topology']}: {r['chips']} chips ({r['chip']}), "
      f"{r['processes']} host(s); {r['dtype']}, global batch {r['global_batch']} "
      f"({r['per_chip_batch']} per chip)",
  ]
  for name in ("train", "eval", "shift_eval", "ensemble_eval"):
    step = r.get(name)
    if not step or "fits" not in step:
      continue
    verdict = "fits" if step["fits"] else f"DOES NOT FIT (over by {_size(step['over_bytes'])})"
    title = {"shift_eval": f"shifted eval ({step.get('cell')}, the largest of "
                           f"{len(step.get('compiled', []))})",
             "ensemble_eval": f"ensemble eval ({r['sweep_members']} members)"}.get(name, name)
    lines.append(
        f"  {title} step: {_size(step['per_chip_bytes'])} per chip of {_size(r['hbm_bytes'])} "
        f"HBM, {verdict}; compiled in {step['compile_seconds']:.0f} s")

    if step["flops"] is not None:
      lines.append(
          f"    {step['flops'] / 1e9:.2f} GFLOP and {_size(step['bytes_accessed'])} HBM traffic "
          f"per chip per step; roofline {_duration(step['step_seconds_estimate'])}")
    if step.get("left_out"):
      lines.append("    left out: " + "; ".join(f"{k} ({v})" for k, v in step["left_out"].items()))
  if r.get("sweep_members", 1) > 1:
    lines.append(f"  sweep of {r['sweep_members']} members: the train step trains them all, "
                 f"{_duration(r['member_step_seconds_estimate'])} per member-step "
                 f"({r['member_examples_per_second']:.0f} member-examples/s; the figures below "
                 "are per step of the whole population)")
  if r.get("examples_per_second"):
    lines.append(
        f"  estimate: {r['examples_per_second']:.0f} examples/s "
        f"({r['examples_per_second_per_chip']:.0f} per chip), epoch "
        f"({r['steps_per_epoch']} steps) {_duration(r['epoch_seconds'])}, whole run "
        f"({r['total_steps']} steps) {r['run_hours']:.2f} h = {r['chip_hours']:.1f} chip-hours "
        "(roofline: a lower bound; evaluation not included)")
  return "\n".join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
  """Writes `result` as indented JSON."""
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2, sort_keys=True)
    f.write("\n")
