"""`dry_run.measure`: the dry run's train step compiled for this machine's devices, run on
random inputs and timed against its roofline. Here the devices are the CPU's, measured on a
GPU's figures (the numbers are meaningless, the mechanics are the same); bench/accelerator_step.py
runs it on real chips (BENCHMARKS.md)."""
import dataclasses
import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from calib_jax.config import files as config_lib
from calib_jax.dry_run import chips, compile as compile_lib, measure, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = 1024


def small_config(batch: int = 64):
  config = config_lib.load_config_file(os.path.join(ROOT, "configs/default.py"))
  config.model_kwargs.hidden = (32,)
  config.data.batch_size = config.data.eval_batch_size = batch
  return config


@pytest.fixture(scope="module")
def topology():
  return measure.local_topology(chips.get("h100"))


@pytest.mark.parametrize("kind, name", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("TPU v4", "v4"), ("TPU v3", "v3")])
def test_a_real_devices_kind_names_its_chip(kind, name):
  assert measure.chip_of(types.SimpleNamespace(device_kind=kind)).name == name


def test_an_unknown_device_is_one_line_listing_the_chips():
  with pytest.raises(ValueError, match=r"unknown accelerator 'cpu'; known: v3, .*h200"):
    measure.chip_of(types.SimpleNamespace(device_kind="cpu"))


def test_k_steps_are_timed_with_the_figures_of_the_dry_runs_one_step(topology):
  config = small_config()
  m = measure.measure_config(config, topology, steps_per_call=4, calls=2, repeats=2,
                             num_train_examples=EXAMPLES)
  assert (m.members, m.steps_per_call, len(m.step_seconds_runs)) == (1, 4, 2)
  assert m.step_seconds == np.median(m.step_seconds_runs) > 0 and m.first_call_seconds > 0
  dry = compile_lib.compile_config(config, topology, num_train_examples=EXAMPLES,
                                   eval_step=False).train
  # One step's figures: the dry run's, not the k-step program's (whose loop body XLA counts
  # once, so dividing its figures by k would understate the roofline k times).
  assert (m.flops, m.bytes_accessed) == (dry.flops, dry.bytes_accessed) and m.flops > 0
  assert m.roofline_seconds == report.roofline_seconds(dry.flops, dry.bytes_accessed,
                                                       topology.device, config.dtype)
  assert m.over_roofline == m.step_seconds / m.roofline_seconds


def test_a_sweep_is_measured_as_one_program_of_every_member(topology):
  config = small_config()
  config.sweep = "seed=0,1,2"
  m = measure.measure_config(config, topology, steps_per_call=2, calls=1, repeats=1,
                             num_train_examples=EXAMPLES)
  assert m.members == 3 and m.step_seconds > 0


def test_random_arguments_keep_labels_positions_and_masks_valid():
  key = jax.random.key(0)
  abstract = {"label": jax.ShapeDtypeStruct((4000,), jnp.int32),
              "index": jax.ShapeDtypeStruct((2, 4000), jnp.int32),
              "mask": jax.ShapeDtypeStruct((4000,), jnp.bool_),
              "image": jax.ShapeDtypeStruct((4000, 3), jnp.bfloat16),
              "key": jax.ShapeDtypeStruct((3,), key.dtype), "absent": None}
  args = measure.random_arguments(abstract, num_classes=7, num_train_examples=50)
  labels, index = np.asarray(args["label"]), np.asarray(args["index"])
  assert labels.min() == 0 and labels.max() == 6 and index.min() == 0 and index.max() == 49
  assert np.asarray(args["mask"]).all() and args["image"].dtype == jnp.bfloat16
  assert 0.015 < float(np.std(np.asarray(args["image"], np.float32))) < 0.025
  assert args["key"].shape == (3,) and args["key"].dtype == key.dtype and args["absent"] is None


def test_a_step_larger_than_the_chips_memory_is_one_line(topology):
  tiny = dataclasses.replace(topology, chip=dataclasses.replace(topology.chip, hbm_bytes=4096))
  with pytest.raises(ValueError, match=r"the train step needs [\d.]+ GiB per chip, more than"):
    measure.measure_config(small_config(), tiny, num_train_examples=EXAMPLES)


def test_local_topology_names_the_chip_and_the_devices(topology):
  assert topology.name == f"h100:{len(jax.devices())} (local)"
  assert topology.devices == tuple(jax.devices()) and topology.device.name == "h100"


def _dry_run_cli(*args: str, program: tuple[str, ...] = ("-m", "calib_jax.dry_run")):
  return subprocess.run([sys.executable, *program, "--config=configs/default.py",
                         "--config.model_kwargs.hidden=(32,)", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)


def test_the_cli_measures_on_local_devices_against_a_named_chips_figures():
  result = _dry_run_cli("--measure", "--topology=h100:1", "--steps_per_call=2")
  assert result.returncode == 0, result.stderr[-2000:]
  line = result.stdout.strip().splitlines()[-1]
  assert re.fullmatch(r"configs/default\.py on h100:\d+ \(local\): 1 member\(s\), 2 step\(s\) "
                      r"per call: [\d.]+ ms per step measured; roofline [\d.]+ ms, measured "
                      r"[\d.]+x that; [\d.]+ GiB per chip; compiled in [\d.]+ s", line), line


# The program run as `python -m`, then (at exit, whatever its status) one line on stderr naming
# the heavy packages it imported.
_REPORTING_IMPORTS = ("import atexit, runpy, sys\n"
                      "atexit.register(lambda: print('imported:', sorted(m for m in ('tensorflow', "
                      "'flax', 'orbax') if m in sys.modules), file=sys.stderr))\n"
                      "sys.argv[0] = 'calib_jax.dry_run'\n"
                      "runpy.run_module('calib_jax.dry_run', run_name='__main__', alter_sys=True)")


def test_the_cli_without_an_accelerator_or_a_chip_is_one_line_before_the_heavy_imports():
  """Refused first, before the config's model or TensorFlow is imported (1 s, not 9)."""
  result = _dry_run_cli("--measure", program=("-c", _REPORTING_IMPORTS))
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert lines[-2].startswith(
      "dry_run: --measure times the train step on this machine's accelerator, and JAX sees "
      "only the CPU here"), result.stderr[-2000:]
  assert lines[-1] == "imported: []", result.stderr[-2000:]


def test_measure_is_read_from_argv_as_absl_reads_a_boolean_flag(monkeypatch):
  """`--measure` chooses JAX's platform before absl parses the flags (on a GPU host, spelled
  `--measure=True` it must not pin JAX to the CPU).

  Read in this process (a program started for it is ~7 s of imports): importing the program's
  module sets JAX_PLATFORMS if unset (set here first, so this process's environment is left as
  it was) and defines its flags in absl's registry (removed again, with the module)."""
  cases = {"--measure": True, "--measure=true": True, "--measure=True": True, "--measure=1": True,
           "--measure=false": False, "--nomeasure": False, "--measure --nomeasure": False,
           "--nomeasure --measure": True, "--topology=h100:1": False}
  monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
  defined, imported = set(flags.FLAGS), set(sys.modules)
  try:
    from calib_jax.dry_run import __main__ as program  # pylint: disable=import-outside-toplevel
    got = {case: program.measure_requested(case.split()) for case in cases}
  finally:
    for name in set(flags.FLAGS) - defined:
      delattr(flags.FLAGS, name)
    if "calib_jax.dry_run.__main__" not in imported:
      sys.modules.pop("calib_jax.dry_run.__main__", None)
  assert got == cases


def test_no_calls_or_repeats_is_one_line(topology):
  with pytest.raises(ValueError, match=r"calls=0 and repeats=3 must be >= 1"):
    measure.measure_config(small_config(), topology, calls=0, num_train_examples=EXAMPLES)
