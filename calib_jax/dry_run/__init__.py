"""Dry run on Cloud TPU slices and GPUs without the hardware: `python -m calib_jax.dry_run`.

Compiles a config's exact train and eval steps with the target's own compiler (libtpu for TPU,
XLA's CUDA compiler for GPUs) from abstract shapes, and reports per-chip memory against HBM,
FLOPs and bytes per step, and a roofline estimate of step, epoch and run time. See
docs/accelerators.md.

Modules: `chips` (the chip table with sources), `topologies` (`--topology` names),
`gpu_targets` (GPU descriptions for the CUDA compiler), `shapes` (abstract batches and split
sizes), `compile` (lowering and compiling the steps), `report` (roofline, text, JSON), `api`
(`dry_run`, `largest_batch`).
"""
