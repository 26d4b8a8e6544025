#!/bin/bash
# The one device check of a session with a GPU lent (see BENCHMARKS.md, "On a real GPU").
#   bash bench/device_check.sh [PARTS]     PARTS: comma-separated, default shift,report,dilated
# * shift:   calib_jax.shift's corruptions on the chip against the model's forward pass
#            (corruption_device.py; issue: corrupting costs less than the forward pass);
# * report:  the evaluation on the GPU: calib_jax's metrics against torch-uncertainty's and
#            torchmetrics' on the GPU (metrics_speed.py --torch-device=cuda), and the whole
#            `eval.py --predictions` report (eval_predictions_speed.py) at 540 x 10 and 50,000 x 1,000;
# * dilated: DeepLab's dilated convolutions, XLA's against the phase sub-grid form
#            (models.atrous; decides atrous.GPU_FORM), and PyTorch's;
# * cache:   the same `eval.py --predictions` reports with a warm compilation cache (the first
#            run fills it), programs counted, and saturate at 32 px (missed by an earlier deadline);
# * steps:   the recipes' steps against the dry run's roofline, and the JAX step against its
#            PyTorch twin (an earlier round's check; about 5 min);
# * tests:   the test modules that need no TensorFlow, on the GPU at the platform's default
#            matmul precision (TF32 operands, what a user's program gets), then the failures
#            again at full precision (what separates precision from the platform); ~7 min.
# Run from the repository root on the GPU machine; results under $OUT (default: /tmp/out).
# Needs ml_collections there (and imagecorruptions-imaug for frost, torch-uncertainty for the
# report): wheels in .whl/ are installed to /tmp/site when present. The default parts stop at
# their timeouts (550 s together), so a 10-minute limit on the whole script holds them.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PARTS=",${1:-shift,report,dilated},"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import jax, flax, optax, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, jax.devices())"
quiet() { grep -v -E "^(W|I)[0-9]{4} |^WARNING: All log|absl::InitializeLog" ; }
if [[ $PARTS == *,shift,* ]]; then
  # 32 px with each corruption fused with the model (one ResNet-50 compilation each), 224 px alone.
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 170 python3 bench/corruption_device.py --sizes=32 \
    --deadline_s=150 --json="$OUT/corruption_device_32.jsonl" 2>&1 | quiet | tee "$OUT/corruption_32.log"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 130 python3 bench/corruption_device.py --sizes=224 \
    --nofused --deadline_s=100 --json="$OUT/corruption_device_224.jsonl" 2>&1 | quiet | tee "$OUT/corruption_224.log"
fi
if [[ $PARTS == *,report,* ]]; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 70 python3 bench/metrics_speed.py --sizes=1e5,1e6 \
    --classes=10,1000 --torch-device=cuda --torch-max-gb=4.5 --no-numpy --repeats=3 \
    2>&1 | quiet | tee "$OUT/metrics_speed.log"
  timeout 40 python3 bench/eval_predictions_speed.py --runs=2 --data_dir=/tmp/evalspeed \
    2>&1 | quiet | tee "$OUT/eval_predictions.log"
  timeout 60 python3 bench/eval_predictions_speed.py --large --runs=1 --data_dir=/tmp/evalspeed \
    --keep="$OUT/metrics_large.json" 2>&1 | quiet | tee -a "$OUT/eval_predictions.log"
fi
if [[ $PARTS == *,dilated,* ]]; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 80 python3 bench/dilated_conv.py --dilations=1,2,12 \
    2>&1 | quiet | tee "$OUT/dilated_conv.log"
fi
if [[ $PARTS == *,cache,* ]]; then
  timeout 120 python3 bench/eval_predictions_speed.py --runs=3 --cache=warm --count \
    --data_dir=/tmp/evalspeed 2>&1 | quiet | tee "$OUT/eval_predictions_warm.log"
  timeout 150 python3 bench/eval_predictions_speed.py --large --runs=2 --cache=warm --count \
    --data_dir=/tmp/evalspeed 2>&1 | quiet | tee -a "$OUT/eval_predictions_warm.log"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 90 python3 bench/corruption_device.py --sizes=32 \
    --names=saturate --deadline_s=60 --json="$OUT/saturate_32.jsonl" 2>&1 | quiet | tee "$OUT/saturate_32.log"
fi
if [[ $PARTS == *,steps,* ]]; then
  timeout 200 python3 bench/accelerator_step.py --deadline_s=150 --json="$OUT/accelerator_step.jsonl" \
    --items=mlp_p1,mlp_p7,mlp_p21,cnn_p1,cnn_p7,cnn_p21,cifar10_resnet50,imagenet_resnet50_acls \
    2>&1 | quiet | tee "$OUT/accelerator_step.log"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 120 python3 bench/train_step.py --models=resnet20,resnet50 \
    --steps=20 --repeats=3 --warmup=3 --jax-dtype=bfloat16 --torch-dtype=bfloat16 --torch-channels-last \
    --json="$OUT/train_step_bf16.json" 2>&1 | quiet | tee "$OUT/train_step_bf16.log"
fi
if [[ $PARTS == *,tests,* ]]; then
  GPU_TESTS="test_metrics_accumulators test_metrics_calibration test_metrics_detection test_metrics_l2
    test_metrics_segmentation test_metrics_selective test_metrics_smooth test_metrics_streaming
    test_metrics_bootstrap test_conformal test_conformal_method_scores test_conformal_mondrian
    test_posthoc test_posthoc_bbq_beta test_posthoc_calibrators test_losses test_losses_gradients
    test_losses_training test_shift test_shift_random test_shift_weather test_ensemble
    test_evaluation_predictions test_evaluation_predictions_intervals test_models_atrous
    test_models_bfloat16 test_training_step test_plotting_shift"
  files=$(for t in $GPU_TESTS; do echo tests/$t.py; done)
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  # Why the full precision matters: running_sums' block sums as a plain float32 product.
  timeout 60 python3 -c "
import jax, jax.numpy as jnp, numpy as np
x = np.random.default_rng(9).integers(0, 400, (1250, 32)).astype(np.float32)
tri = jnp.triu(jnp.ones((32, 32), jnp.float32))
for p in ('default', 'highest'):
  with jax.default_matmul_precision(p):
    got = np.asarray(jax.jit(lambda a: a @ tri)(x))
  print(p, 'max |block sums - exact|:', np.abs(got - np.cumsum(x, axis=1)).max())
" 2>&1 | quiet | tee "$OUT/precision_demo.log"
  CALIB_JAX_TESTS_MATMUL_PRECISION=default timeout 330 python3 -m pytest -n 14 -q -p no:randomly \
    --timeout=150 --tb=line -rfE --durations=10 --junitxml="$OUT/gpu_tests_default.xml" $files \
    2>&1 | quiet | tee "$OUT/gpu_tests_default.log"
  timeout 120 python3 -m pytest -n 14 -q --lf --lfnf=none --timeout=100 --tb=short -rfE \
    $files 2>&1 | quiet | tee "$OUT/gpu_tests_highest.log"
fi
echo "device check done"
