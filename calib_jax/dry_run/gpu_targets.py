"""GPU target descriptions for the CUDA compiler without a GPU (text `GpuTargetConfigProto`).

XLA compiles for a GPU it cannot see when it is told the device's properties. These are the
published figures of each GPU (NVIDIA's datasheets and architecture whitepapers, `SOURCES`);
XLA uses them to choose tilings and fusions, and the memory size to schedule buffers. Without
a GPU there is no autotuning: XLA takes its default GEMM/convolution algorithms.
"""
# Per GPU: compute capability, SMs, boost clock (GHz), FP32 lanes per SM, shared memory per SM
# and the per-block opt-in maximum (bytes), L2 (bytes), HBM bandwidth (B/s), device memory
# (bytes, as CUDA reports it).
_SPECS = {
    "h100": dict(major=9, minor=0, sms=132, clock_ghz=1.98, fpus_per_sm=128,
                 smem_per_sm=233_472, smem_per_block_optin=232_448, l2=52_428_800,
                 bandwidth=3_352_000_000_000, memory=81_559 * 2**20),
    "a100": dict(major=8, minor=0, sms=108, clock_ghz=1.41, fpus_per_sm=64,
                 smem_per_sm=167_936, smem_per_block_optin=166_912, l2=41_943_040,
                 bandwidth=2_039_000_000_000, memory=81_920 * 2**20),
}
# The H100's processor (GH100: SMs, clocks, shared memory) with 141 GB of HBM3e at 4.8 TB/s.
_SPECS["h200"] = dict(_SPECS["h100"], bandwidth=4_800_000_000_000, memory=143_771 * 2**20)

SOURCES = {
    "h100": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs, 128 FP32 "
            "cores/SM, 228 KB shared memory/SM, 50 MB L2) and H100 datasheet (80 GB HBM3, "
            "3.35 TB/s, 1.98 GHz boost)",
    "h200": "NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s; the H100 SXM5's GH100 processor, as "
            "above); CUDA reports 143,771 MiB on an H200 SXM",
    "a100": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 64 FP32 cores/SM, "
            "164 KB shared memory/SM, 40 MB L2) and A100 80GB datasheet (2,039 GB/s)",
}


def target_config(gpu: str) -> str:
  """The text-format GpuTargetConfigProto of `gpu` ('h100', 'h200' or 'a100')."""
  if gpu not in _SPECS:
    raise ValueError(f"no GPU target description for {gpu!r}; known: {', '.join(_SPECS)}")
  s = _SPECS[gpu]
  return f"""gpu_device_info {{
  cuda_compute_capability {{ major: {s['major']} minor: {s['minor']} }}
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: {s['smem_per_block_optin']}
  shared_memory_per_core: {s['smem_per_sm']}
  threads_per_core_limit: 2048
  core_count: {s['sms']}
  fpus_per_core: {s['fpus_per_sm']}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {s['bandwidth']}
  l2_cache_size: {s['l2']}
  clock_rate_ghz: {s['clock_ghz']}
  device_memory_size: {s['memory']}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
device_description_str: "{gpu.upper()} (calib_jax dry run, sm_{s['major']}{s['minor']})"
"""
