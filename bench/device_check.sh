#!/bin/bash
# The one device check of a session with a GPU lent (see BENCHMARKS.md, "On a real GPU"):
# the recipes' steps against the dry run's roofline (accelerator_step.py), sweeps against
# single runs on the chip, and the JAX step against its PyTorch twin (train_step.py).
# Run from the repository root on the GPU machine; results under $OUT (default: /tmp/out).
# Needs ml_collections there: wheels in .whl/ are installed to /tmp/site when present.
# About 7 min on an H200 (2026-11-26: 5 min without the last part); its parts stop at their
# timeouts (590 s together), so a 10-minute limit on the whole script holds it.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import jax, flax, optax, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, jax.devices())"
quiet() { grep -v -E "^(W|I)[0-9]{4} |^WARNING: All log|absl::InitializeLog" ; }
timeout 200 python3 bench/accelerator_step.py --deadline_s=150 --json="$OUT/accelerator_step.jsonl" \
  --items=mlp_p1,mlp_p7,mlp_p21,cnn_p1,cnn_p7,cnn_p21,cifar10_resnet50,imagenet_resnet50_acls \
  2>&1 | quiet | tee "$OUT/accelerator_step.log"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 120 python3 bench/train_step.py --models=resnet20,resnet50 --steps=20 --repeats=3 \
  --warmup=3 --jax-dtype=bfloat16 --torch-dtype=bfloat16 --torch-channels-last \
  --json="$OUT/train_step_bf16.json" 2>&1 | quiet | tee "$OUT/train_step_bf16.log"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 80 python3 bench/train_step.py --models=resnet20,resnet50 --steps=20 --repeats=3 \
  --warmup=3 --json="$OUT/train_step_fp32.json" 2>&1 | quiet | tee "$OUT/train_step_fp32.log"
timeout 90 python3 bench/accelerator_step.py --deadline_s=40 --json="$OUT/accelerator_step.jsonl" \
  --items=voc2012_deeplabv3_resnet50,imagenet_vit_s16_sam 2>&1 | quiet | tee -a "$OUT/accelerator_step.log"
# DeepLab's dilated convolutions: XLA's against the phase sub-grid form (models.atrous), the
# model's step in both forms (decides atrous.GPU_FORM), and PyTorch's.
XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 100 python3 bench/dilated_conv.py --dilations=1,2,12 \
  2>&1 | quiet | tee "$OUT/dilated_conv.log"
echo "device check done"
