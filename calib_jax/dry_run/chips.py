"""Accelerator chips the dry run estimates for: peak FLOP/s, HBM size and bandwidth, host vCPUs.

Every figure is the vendor's published per-chip number, with the page it comes from
(`Chip.source`). The dry run's roofline (`report.roofline_seconds`) divides a compiled step's
FLOPs by `peak_flops(dtype)` and its HBM traffic by `hbm_bandwidth`.

Peak FLOP/s by computation dtype: JAX's default matmul precision runs float32 dots as one bf16
pass on TPU and as TF32 on Ampere/Hopper GPUs, so a float32 model's matmuls run at the bf16
rate on TPU and at the dense TF32 tensor-core rate on GPU; `peak_fp32` holds that rate.
"""
import dataclasses

GIB = 2**30
GB = 10**9
TERA = 10**12


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip (a TPU chip or a GPU).

  Attributes:
    name: the generation as `--topology` spells it ('v5e', 'h100').
    kind: 'tpu' or 'gpu'.
    peak_bf16: dense bfloat16 FLOP/s (matrix units / tensor cores), per chip.
    peak_fp32: FLOP/s of a float32 dot under JAX's default precision (see the module note).
    hbm_bytes: high-bandwidth memory per chip.
    hbm_bandwidth: HBM bytes/s per chip.
    host_vcpus_per_chip: vCPUs of a typical host divided by its chips (the input pipeline's
      budget).
    host: the typical host the vCPU figure is from.
    source: where the figures are published.
  """
  name: str
  kind: str
  peak_bf16: float
  peak_fp32: float
  hbm_bytes: int
  hbm_bandwidth: float
  host_vcpus_per_chip: float
  host: str
  source: str

  def peak_flops(self, dtype: str) -> float:
    """Peak FLOP/s for a model computing in `dtype` ('bfloat16' or 'float32')."""
    return self.peak_bf16 if dtype == "bfloat16" else self.peak_fp32


CHIPS: dict[str, Chip] = {c.name: c for c in (
    Chip("v3", "tpu", 123 * TERA, 123 * TERA, 32 * GIB, 900 * GB, 96 / 4,
         "v3-8 host: 96 vCPUs, 4 chips", "https://cloud.google.com/tpu/docs/v3"),
    Chip("v4", "tpu", 275 * TERA, 275 * TERA, 32 * GIB, 1200 * GB, 240 / 4,
         "v4 host: 240 vCPUs, 4 chips", "https://cloud.google.com/tpu/docs/v4"),
    Chip("v5e", "tpu", 197 * TERA, 197 * TERA, 16 * GIB, 819 * GB, 224 / 8,
         "ct5lp-hightpu-8t: 224 vCPUs, 8 chips", "https://cloud.google.com/tpu/docs/v5e"),
    Chip("v5p", "tpu", 459 * TERA, 459 * TERA, 95 * GB, 2765 * GB, 208 / 4,
         "v5p host: 208 vCPUs, 4 chips", "https://cloud.google.com/tpu/docs/v5p"),
    Chip("v6e", "tpu", 918 * TERA, 918 * TERA, 32 * GIB, 1640 * GB, 180 / 4,
         "ct6e-standard-4t: 180 vCPUs, 4 chips", "https://cloud.google.com/tpu/docs/v6e"),
    Chip("h100", "gpu", 989.4 * TERA, 494.7 * TERA, 80 * GB, 3352 * GB, 208 / 8,
         "a3-highgpu-8g: 208 vCPUs, 8 GPUs",
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5: dense BF16 989.4 TFLOPS, TF32 494.7, "
         "80 GB HBM3 at 3.35 TB/s); https://www.nvidia.com/en-us/data-center/h100/"),
    Chip("h200", "gpu", 989.4 * TERA, 494.7 * TERA, 141 * GB, 4800 * GB, 224 / 8,
         "a3-ultragpu-8g: 224 vCPUs, 8 GPUs",
         "NVIDIA H200 Tensor Core GPU datasheet (SXM: dense BF16 989.4 TFLOPS, TF32 494.7, "
         "141 GB HBM3e at 4.8 TB/s); https://www.nvidia.com/en-us/data-center/h200/"),
    Chip("a100", "gpu", 312 * TERA, 156 * TERA, 80 * GB, 2039 * GB, 96 / 8,
         "a2-ultragpu-8g: 96 vCPUs, 8 GPUs",
         "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: BF16 312 TFLOPS, TF32 156, "
         "2,039 GB/s); https://www.nvidia.com/en-us/data-center/a100/"),
)}


def get(name: str) -> Chip:
  """The chip called `name`; a one-line ValueError listing the known generations otherwise."""
  if name not in CHIPS:
    raise ValueError(f"unknown accelerator generation {name!r}; known: {', '.join(CHIPS)}")
  return CHIPS[name]
