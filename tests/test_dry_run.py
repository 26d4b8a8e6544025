"""The accelerator dry run (`python -m calib_jax.dry_run`), compiled by libtpu for real TPU
slices without a TPU. Needs the `.[tpu]` extra: `make test` runs this file in .venv-tpu.

A small config (configs/default.py: an MLP on 8x8 digits, hidden width 256) keeps each compile
to seconds; its FLOPs are checked against the matmul count of the network written out here.
"""
import json
import os
import subprocess
import sys

import pytest

from calib_jax.dry_run import api, compile as compile_lib, shapes, topologies
from calib_jax.config import files as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/default.py")
HIDDEN, INPUTS, CLASSES = 256, 8 * 8 * 1, 10  # digits: 8x8x1 images, 10 classes
PARAMS = INPUTS * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
KEYS = ("topology", "chips", "processes", "global_batch", "per_chip_bytes", "hbm_bytes", "fits",
        "flops_per_step", "bytes_per_step", "step_seconds_estimate")


def small_config(batch: int = 1024, eval_batch: int = 256):
  config = config_lib.load_config_file(CONFIG)
  config.model_kwargs.hidden = (HIDDEN,)
  config.data.batch_size, config.data.eval_batch_size = batch, eval_batch
  return config


def matmul_flops(per_chip_batch: int, train: bool) -> int:
  """2·b·(in·hidden + hidden·classes) forward; training adds the weight gradients (same
  count) and the hidden layer's input gradient (2·b·hidden·classes), not the input's."""
  forward = 2 * per_chip_batch * (INPUTS * HIDDEN + HIDDEN * CLASSES)
  return 2 * forward + 2 * per_chip_batch * HIDDEN * CLASSES if train else forward


@pytest.fixture(scope="module")
def single_host(tmp_path_factory):
  result = api.dry_run(small_config(), "v5e:2x2", config_name="default", num_train_examples=10_240)
  path = tmp_path_factory.mktemp("dry_run") / "v5e.json"
  api.report.write_json(result, str(path))
  return json.loads(path.read_text())


@pytest.fixture(scope="module")
def two_hosts():
  return api.dry_run(small_config(), "v5e:2x4", config_name="default", num_train_examples=10_240)


def check_sane(result: dict, chips: int) -> None:
  per_chip = 1024 // chips
  assert result["chips"] == chips and result["global_batch"] == 1024
  assert result["per_chip_batch"] == per_chip
  assert result["fits"] is True and result["hbm_bytes"] == 16 * 2**30  # v5e: 16 GiB
  # Memory: at least the parameters and SGD momentum, far below HBM.
  assert 2 * 4 * PARAMS <= result["per_chip_bytes"] < 2**30
  # FLOPs: the matmuls of the chip's share of the batch, plus elementwise work (bias, ReLU,
  # softmax, the optimiser's per-parameter update) of well under a third on top.
  train_matmuls = matmul_flops(per_chip, train=True)
  assert train_matmuls <= result["flops_per_step"] <= 1.3 * train_matmuls + 50 * PARAMS
  # Eval: the forward matmuls plus the metric accumulators' update, whose bins (the confidence
  # histogram's 24·2^12 + 2, the classwise C·15) cost about a million FLOPs at any batch.
  eval_matmuls = matmul_flops(256 // chips, train=False)
  assert eval_matmuls <= result["eval"]["flops"] <= 1.3 * eval_matmuls + 1_000_000
  # Bytes: the parameters are read at least once.
  assert result["bytes_per_step"] >= 4 * PARAMS
  assert result["step_seconds_estimate"] > 0
  assert result["total_steps"] == small_config().num_train_steps  # the recipe's length
  assert result["steps_per_epoch"] == 10


def test_single_host_slice_train_and_eval_compile_with_sane_numbers(single_host):
  assert set(KEYS) <= set(single_host)
  assert single_host["topology"] == "v5e:2x2" and single_host["processes"] == 1
  check_sane(single_host, chips=4)


def test_two_process_slice_shards_the_global_batch_over_every_chip(single_host, two_hosts):
  assert two_hosts["topology"] == "v5e:2x4" and two_hosts["processes"] == 2
  check_sane(two_hosts, chips=8)
  # Twice the chips, half the batch per chip: about half the FLOPs per chip.
  ratio = two_hosts["flops_per_step"] / single_host["flops_per_step"]
  assert 0.45 <= ratio <= 0.6


def test_a_batch_too_large_for_hbm_gives_fits_false_and_the_json(tmp_path):
  out = tmp_path / "oom.json"
  # 262,144 128x128 images per chip: 16 GiB of input alone, more than a v5e chip's HBM.
  proc = subprocess.run(
      [sys.executable, "-m", "calib_jax.dry_run", f"--config={CONFIG}", "--topology=v5e:2x2",
       "--config.data.batch_size=1048576", "--config.model_kwargs.hidden=(64,)",
       "--config.data.options.image_size=128", "--num_train_examples=10000000",
       "--eval_step=false", f"--json={out}"],
      capture_output=True, text=True, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "DOES NOT FIT" in proc.stdout
  result = json.loads(out.read_text())
  assert result["fits"] is False
  input_bytes = 1048576 // 4 * 128 * 128 * 4
  assert result["per_chip_bytes"] >= input_bytes
  assert result["over_bytes"] == result["per_chip_bytes"] - result["hbm_bytes"] > 0


def test_unknown_topology_is_one_line_listing_the_generations():
  with pytest.raises(ValueError, match=r"unknown topology 'v9:2x2'.*v4, v5e, v5p, v6e, h100"):
    topologies.get("v9:2x2")
  with pytest.raises(ValueError, match=r"shape '2by2' is not AxB"):
    topologies.get("v5e:2by2")


def test_missing_compilers_name_the_extra_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "libtpu", None)  # import libtpu -> ImportError
  with pytest.raises(topologies.MissingCompilerError, match=r"calib_jax\[tpu\]"):
    topologies.get("v5e:2x2")
  monkeypatch.setitem(sys.modules, "jax_cuda12_plugin", None)
  with pytest.raises(topologies.MissingCompilerError, match=r"calib_jax\[gpu\]"):
    topologies.get("h100:8")


def test_a_batch_that_does_not_divide_over_the_chips_is_one_line():
  with pytest.raises(ValueError, match=r"data.batch_size=30 does not divide over the 4 devices "
                                       r"of v5e:2x2; use a multiple of 4"):
    compile_lib.compile_config(small_config(batch=30), topologies.get("v5e:2x2"))


def test_a_step_the_compiler_rejects_is_one_line_naming_the_op():
  """An op the TPU has no kernel for (here a custom call written for GPUs only) stops the
  compile: one line with the target, the step and the compiler's reason naming the op."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from calib_jax.training import parallel  # pylint: disable=import-outside-toplevel
  topology = topologies.get("v5e:2x2")
  replicated = parallel.replicated(parallel.make_mesh(topology.devices))
  kernel = jax.ffi.ffi_call("my_cuda_only_kernel", jax.ShapeDtypeStruct((8, 8), jnp.float32))
  jitted = jax.jit(kernel, in_shardings=replicated, out_shardings=replicated)
  args = (jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=replicated),)
  with pytest.raises(compile_lib.CompileError) as error:
    compile_lib.compile_step(jitted, args, topology, "train")
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith("v5e:2x2: the train step does not compile: ")
  assert "my_cuda_only_kernel" in message


def test_split_sizes_follow_tfds_slicing():
  assert shapes.split_size("imagenet2012", "train[:99%]") == round(1_281_167 * 0.99)
  assert shapes.split_size("cifar10", "train[45000:]") == 5_000
  assert shapes.split_size("cifar10", "test") == 10_000
  with pytest.raises(ValueError, match="--num_train_examples"):
    shapes.split_size("cifar10", "validation")


def test_find_max_batch_bisects_to_the_largest_fitting_multiple_of_the_devices(monkeypatch):
  probes = []

  def fake_compile(config, topology, **_):  # fits up to 1000 examples per step
    probes.append(config.data.batch_size)
    fits = config.data.batch_size <= 1000
    step = compile_lib.StepCompile(fits=fits, per_chip_bytes=0)
    return compile_lib.Program(train=step, eval=None, num_train_examples=1, steps_per_epoch=1,
                               total_steps=1)

  monkeypatch.setattr(compile_lib, "compile_config", fake_compile)
  topology = topologies.get("v5e:2x2")
  assert api.largest_batch(small_config(batch=32), topology) == 1000  # 250 per device x 4
  assert all(b % 4 == 0 for b in probes) and len(probes) < 20
  assert api.largest_batch(small_config(batch=4000), topology) == 1000


def test_a_sweep_compiles_as_one_program_with_its_cost_per_member(single_host):
  """Three LR members (the same data): about three times the single run's train FLOPs, and the
  time per member-step is the population's step time over three."""
  config = small_config()
  config.loss, config.sweep = "lr", "loss_kwargs.alpha=0.05,0.1,0.2"
  result = api.dry_run(config, "v5e:2x2", config_name="default", num_train_examples=10_240,
                       eval_step=False)
  assert result["sweep_members"] == 3 and result["fits"]
  assert 2.5 <= result["flops_per_step"] / single_host["flops_per_step"] <= 3.5
  assert result["member_step_seconds_estimate"] == pytest.approx(
      result["step_seconds_estimate"] / 3)
  assert single_host["sweep_members"] == 1



def test_the_training_set_on_the_devices_compiles_and_counts_in_every_chips_memory():
  """`data.on_device`: the resident split (10,240 digits: images, labels, masks) is an
  argument of the train step on every chip, in place of the chip's share of a batch; the step
  gathers its batch from it, with the FLOPs of the step fed by the host."""
  topology = topologies.get("v5e:2x2")
  steps = {}
  for on_device in (False, True):
    config = small_config()
    config.data.on_device = on_device
    steps[on_device] = compile_lib.compile_config(config, topology, num_train_examples=10_240,
                                                  eval_step=False).train
  resident = 10_240 * (INPUTS * 4 + 4 + 1)
  batch = 1024 // 4 * (INPUTS * 4 + 4 + 1)  # the chip's share of a batch sent by the host
  positions = 1024 // 4 * 4
  grown = steps[True].argument_bytes - steps[False].argument_bytes
  assert abs(grown - (resident - batch + positions)) <= 1024
  assert steps[True].fits
  assert 0.95 <= steps[True].flops / steps[False].flops <= 1.05


def test_the_shifted_and_ensemble_eval_steps_compile_with_their_memory():
  """`eval.py --shift`'s step (uint8 images corrupted on the chip, then the forward pass) and
  `--ensemble`'s (the members' stacked forward passes): compiled for the target, their memory
  reported; jpeg_compression runs on the host and is named as left out."""
  config = small_config()
  config.loss, config.sweep = "lr", "loss_kwargs.alpha=0.05,0.1,0.2"
  config.eval.shift = "gaussian_noise,contrast,jpeg_compression:2"
  result = api.dry_run(config, "v5e:2x2", config_name="default", num_train_examples=10_240)
  shifted, ensemble = result["shift_eval"], result["ensemble_eval"]
  assert shifted["fits"] and ensemble["fits"]
  assert sorted(shifted["compiled"]) == ["contrast/2", "gaussian_noise/2"]
  assert shifted["cell"] in shifted["compiled"]
  assert "jpeg_compression" in shifted["left_out"]
  # The parameters and the chip's 64 uint8 8x8 images at least; far below a MiB in all.
  assert 4 * PARAMS + 64 * 64 <= shifted["argument_bytes"] <= shifted["per_chip_bytes"] < 2**20
  assert shifted["flops"] >= matmul_flops(256 // 4, train=False)
  # Three members' forward passes: about three times the one-member eval's matmuls.
  assert ensemble["flops"] >= 3 * matmul_flops(256 // 4, train=False)
  assert ensemble["argument_bytes"] >= 3 * 4 * PARAMS
  text = api.report.text(result)
  assert "shifted eval (" in text and "ensemble eval (3 members)" in text
