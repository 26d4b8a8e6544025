"""`--topology` names: which chips a dry run compiles for, as devices without hardware.

Names:

* TPU slices, as Cloud TPU names their topologies: `<generation>:<chips per dimension>`, e.g.
  `v5e:2x2` (4 chips, one host), `v5e:4x4` (16 chips, 4 hosts), `v4:2x2x2` (8 chips, 2 hosts),
  `v5p:2x2x1`, `v6e:2x4`. libtpu (the `.[tpu]` extra) builds the slice's devices, each with its
  process (host) index, exactly as on the real slice.
* GPUs: `<gpu>:<gpus>` for one host (`h100:1`, `h100:8`) or `<gpu>:<hosts>x<gpus per host>`
  (`h100:2x8`). The CUDA plugin (the `.[gpu]` extra) compiles for the target description in
  `gpu_targets.py`, with `JAX_PLATFORMS=cpu` on a machine without a GPU.
"""
import dataclasses
import os
import re

from calib_jax.dry_run import chips, gpu_targets

_TPU_SHAPE = re.compile(r"^\d+(x\d+){1,2}$")
_GPU_SHAPE = re.compile(r"^(?:(\d+)x)?(\d+)$")


# A valid name per generation (v3/v4/v5p slices are 3-D, v5e/v6e 2-D).
EXAMPLES = {"v3": "v3:2x2", "v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1",
            "v6e": "v6e:2x2", "h100": "h100:8", "h200": "h200:8",
            "a100": "a100:8"}


class MissingCompilerError(RuntimeError):
  """The compiler of a topology is not installed (names the extra that installs it)."""


@dataclasses.dataclass(frozen=True)
class Topology:
  """A parsed `--topology`: its name, chip and compile-only devices.

  Attributes:
    name: the `--topology` value.
    chip: the chips' `chips.Chip`.
    devices: compile-only devices, one per chip, each with its `process_index`.
  """
  name: str
  chip: chips.Chip
  devices: tuple

  @property
  def num_chips(self) -> int:
    """Physical chips: devices at distinct coordinates (a GPU is one device)."""
    coords = {(d.process_index, tuple(d.coords)) for d in self.devices if hasattr(d, "coords")}
    return len(coords) or len(self.devices)

  @property
  def num_devices(self) -> int:
    """JAX devices, over which the batch is split: one per chip, except the TPU generations
    with two TensorCores per chip that libtpu's compile-only slice shows as two devices (v3,
    v4: a v4 VM's JAX shows one megacore device per chip, the compile-only slice does not)."""
    return len(self.devices)

  @property
  def device(self) -> chips.Chip:
    """The chip's figures per JAX device (a two-core chip's split in half)."""
    share = self.num_devices // self.num_chips
    if share == 1:
      return self.chip
    return dataclasses.replace(
        self.chip, peak_bf16=self.chip.peak_bf16 / share, peak_fp32=self.chip.peak_fp32 / share,
        hbm_bytes=self.chip.hbm_bytes // share, hbm_bandwidth=self.chip.hbm_bandwidth / share)

  @property
  def num_processes(self) -> int:
    return len({d.process_index for d in self.devices})


def parse(name: str) -> tuple[chips.Chip, str]:
  """`(chip, shape)` of a topology name; a one-line ValueError naming the valid forms."""
  generation, sep, shape = name.partition(":")
  known = ", ".join(EXAMPLES.values())
  if not sep or generation not in chips.CHIPS:
    raise ValueError(f"unknown topology {name!r}: expected <generation>:<shape> with a "
                     f"generation of {', '.join(chips.CHIPS)} (e.g. {known})")
  chip = chips.CHIPS[generation]
  pattern = _TPU_SHAPE if chip.kind == "tpu" else _GPU_SHAPE
  if not pattern.match(shape) or "0" in re.split(r"x", shape):
    form = "AxB or AxBxC chips" if chip.kind == "tpu" else "N gpus or HOSTSxGPUS"
    raise ValueError(f"topology {name!r}: the shape {shape!r} is not {form} (e.g. {known})")
  return chip, shape


def _tpu_devices(name: str) -> tuple:
  # libtpu locks /tmp/libtpu_lockfile for the one process that may drive the TPU; compiling
  # for a slice drives none, so dry runs (and parallel tests) may run side by side.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    import libtpu  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError:
    raise MissingCompilerError(
        f"topology {name!r} needs the TPU compiler (libtpu): pip install 'calib_jax[tpu]'"
    ) from None
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    return tuple(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except Exception as e:  # libtpu's messages are multi-line C++ errors.
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"topology {name!r}: libtpu cannot build it ({first})") from None


def _gpu_devices(name: str, chip: chips.Chip, shape: str) -> tuple:
  hosts, per_host = _GPU_SHAPE.match(shape).groups()
  try:
    import jax_cuda12_plugin  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError:
    raise MissingCompilerError(
        f"topology {name!r} needs the CUDA compiler plugin: pip install 'calib_jax[gpu]' "
        "(and run with JAX_PLATFORMS=cpu on a machine without a GPU)") from None
  # Without a GPU, XLA cannot autotune, and its untuned Triton GEMM tiling fails on some dots
  # of DeepLab and ViT ("Couldn't find output tile sizes that satisfy hlo"); matmuls go to
  # cuBLAS instead (FLOPs are counted before this choice, see `compile._gpu_cost`).
  if "xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_gpu_enable_triton_gemm=false").strip()
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  target = gpu_targets.target_config(chip.name)
  return tuple(topologies.get_topology_desc(
      platform="cuda", topology=f"1x{hosts or 1}x{per_host}",
      target_config=target).devices)


def get(name: str) -> Topology:
  """The `Topology` called `name` (see the module docstring for the names).

  Raises:
    ValueError: an unknown generation or a malformed shape (one line, listing the valid ones).
    MissingCompilerError: libtpu / the CUDA plugin is not installed (naming the extra).
  """
  chip, shape = parse(name)
  devices = _tpu_devices(name) if chip.kind == "tpu" else _gpu_devices(name, chip, shape)
  return Topology(name=name, chip=chip, devices=devices)

