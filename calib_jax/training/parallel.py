"""Data parallelism with one `jax.jit` over a 1-D device mesh.

Every device of every process is on the mesh axis `data`. A batch is sharded along its leading
axis, the training state is replicated. Because `jit` sees the *global* batch as one logical
array, BatchNorm statistics and the loss mean are over the global batch and gradients are the
global-batch mean, with XLA inserting the all-reduces: no `axis_name`, `pmean` or per-device
code in the model or loss, and the same program runs on 1 CPU, 8 GPUs or a TPU pod.
"""
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"
MEMBER_AXIS = "member"  # a sweep's members (`calib_jax.sweep`), on a 2-D mesh only


def maybe_initialize_distributed(multihost: bool) -> None:
  """Connects the processes of a multi-host job (TPU pod, multi-node GPU) before any JAX work.

  Called when the config asks for it or when the environment variable `CALIB_JAX_MULTIHOST=1`
  is set, unless the program already called `jax.distributed.initialize`. On Cloud TPU and SLURM
  `jax.distributed.initialize()` discovers the coordinator, process count and id itself;
  elsewhere set `JAX_COORDINATOR_ADDRESS=host:port` (process 0's machine),
  `CALIB_JAX_NUM_PROCESSES` and `CALIB_JAX_PROCESS_ID` (see docs/training.md, "Multi-host training").
  """
  if not (multihost or os.environ.get("CALIB_JAX_MULTIHOST") == "1"):
    return
  if not jax.distributed.is_initialized():
    count, index = (os.environ.get(f"CALIB_JAX_{k}") for k in ("NUM_PROCESSES", "PROCESS_ID"))
    jax.distributed.initialize(num_processes=int(count) if count else None,
                               process_id=int(index) if index else None)
    logging.info("Process %d of %d, %d local / %d global devices.", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())


def make_mesh(devices: Sequence[jax.Device] | None = None, member_shards: int = 1) -> Mesh:
  """A 1-D mesh over `devices` (default: all devices of all processes); with `member_shards`
  > 1, a 2-D mesh `(member, data)` of that many member shards (a sweep's members split over
  them) by `len(devices) / member_shards` data shards.

  Across processes each member shard takes an equal share of every process's devices (process
  0's first), so the data axis spans all processes, each holding a contiguous block of it: each
  process feeds its own share of every batch (`jax.make_array_from_process_local_data`), the
  global batch is process 0's share then process 1's, as for the 1-D mesh, and a member shard's
  gradient all-reduce is the single run's, across processes."""
  devices = jax.devices() if devices is None else list(devices)
  if member_shards == 1:
    return Mesh(np.asarray(devices), (DATA_AXIS,))
  processes = sorted({d.process_index for d in devices})
  by_process = np.asarray([[d for d in devices if d.process_index == p] for p in processes])
  # [processes, member_shards, local devices / member_shards] -> member-major.
  grid = by_process.reshape(len(processes), member_shards, -1).transpose(1, 0, 2)
  return Mesh(grid.reshape(member_shards, -1), (MEMBER_AXIS, DATA_AXIS))


def data_shards(mesh: Mesh) -> int:
  """How many ways a batch is split: the size of the mesh's data axis."""
  return int(mesh.shape[DATA_AXIS])


def on_cpu(mesh: Mesh) -> bool:
  """Whether the mesh's devices are CPUs (XLA:CPU), not TPUs or GPUs."""
  return mesh.devices.flat[0].platform == "cpu"


def replicated(mesh: Mesh) -> NamedSharding:
  """Sharding of arrays every device holds whole (parameters, optimiser state)."""
  return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  """Sharding of batch arrays: leading axis split over the mesh."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def stacked_batch_sharded(mesh: Mesh) -> NamedSharding:
  """Sharding of a stack of batches `[k, batch, ...]`: the batch axis split over the mesh."""
  return NamedSharding(mesh, PartitionSpec(None, DATA_AXIS))


def local_batch_size(global_batch_size: int) -> int:
  """This process's share of a global batch (an error if it does not divide evenly)."""
  if global_batch_size % jax.process_count():
    raise ValueError(f"batch size {global_batch_size} is not divisible by the number of "
                     f"processes {jax.process_count()}")
  return global_batch_size // jax.process_count()


def to_global(batch: Mapping[str, np.ndarray], mesh: Mesh, *,
              stacked: bool = False) -> dict[str, jax.Array]:
  """Assembles each process's host-local batch into global arrays sharded over the mesh
  (`stacked`: a `[k, batch, ...]` stack of batches, sharded along the batch axis)."""
  sharding = stacked_batch_sharded(mesh) if stacked else batch_sharded(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places a pytree on every device of the mesh."""
  return jax.device_put(tree, replicated(mesh))


def device_memory_bytes(mesh: Mesh) -> int | None:
  """The memory of the smallest of this process's devices on the mesh: an accelerator's
  `memory_stats()['bytes_limit']`, the host's physical memory for CPU devices (which share
  it: divided by their count), None when unknown. Bounds what may be kept resident on them."""
  local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  limits = []
  for device in local:
    try:
      stats = device.memory_stats()
    except Exception:  # pylint: disable=broad-except  (some backends do not implement it)
      stats = None
    if stats and stats.get("bytes_limit"):
      limits.append(int(stats["bytes_limit"]))
    elif device.platform == "cpu":
      try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
      except (ValueError, OSError, AttributeError):
        return None
      limits.append(host // len(local))
    else:
      return None
  return min(limits) if limits else None
