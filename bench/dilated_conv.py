"""One dilated 3x3 convolution's forward + backward, JAX (XLA) against PyTorch, by dilation.

    python bench/dilated_conv.py [--dilations=1,2,4,12,24,36] [--shapes=aspp,stage4] [--steps=20]

DeepLabV3's step (`voc2012_deeplabv3_resnet50.py`) is further from its roofline on a GPU than
the ResNets' (BENCHMARKS.md, "On a real GPU"), and the one model eager PyTorch runs faster;
its dilated convolutions are the layers the ResNets do not have. Shapes at output stride 8 on
512 px crops, batch 8, channels-last, bfloat16: `aspp` = an ASPP branch (2048 -> 256 channels
on 64x64), `stage4` = a dilated bottleneck's 3x3 (512 -> 512 on 64x64). Each program:
sum(conv(x, w) * g) and its gradients with respect to x and w, as training computes them; in
JAX both XLA's dilated convolution ("direct") and the phase sub-grid form of
`calib_jax.models.atrous` ("by phases"). The model rows: the library's DeepLabV3 step with each
form (`atrous.GPU_FORM`), and torchvision's. Median of 3 timings of `--steps` calls. Not a test.
"""
import statistics
import time

from absl import app, flags

_DILATIONS = flags.DEFINE_list("dilations", ["1", "2", "4", "12", "24", "36"], "dilations")
_SHAPES = flags.DEFINE_list("shapes", ["aspp", "stage4"], "aspp and/or stage4")
_STEPS = flags.DEFINE_integer("steps", 20, "calls per timing")
_TORCH = flags.DEFINE_bool("torch", True, "also time PyTorch (when installed, on CUDA)")
_MODEL = flags.DEFINE_bool("model", True, "also time the whole DeepLabV3-ResNet-50 step (SGD, "
                           "cross-entropy; batch 8 of 512 px, bfloat16) at output stride 8, "
                           "once with each form of its dilated convolutions, and "
                           "torchvision's (stride 8)")

SHAPES = {"aspp": (8, 64, 64, 2048, 256), "stage4": (8, 64, 64, 512, 512)}


def _median_ms(run, steps):
  runs = []
  for _ in range(3):
    start = time.perf_counter()
    run(steps)
    runs.append((time.perf_counter() - start) / steps * 1e3)
  return statistics.median(runs)


def jax_ms(shape, dilation, steps, form="direct"):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  b, h, w, cin, cout = shape
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (b, h, w, cin), jnp.bfloat16)
  k = (jax.random.normal(keys[1], (3, 3, cin, cout), jnp.float32) * 0.01).astype(jnp.bfloat16)
  g = jax.random.normal(keys[2], (b, h, w, cout), jnp.bfloat16)

  from calib_jax.models import atrous  # pylint: disable=import-outside-toplevel
  conv = {"direct": atrous.direct, "phases": atrous.by_phases}[form]

  def loss(x, k):
    return jnp.sum((conv(x, k, dilation) * g).astype(jnp.float32))

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))  # the forward too, as training
  jax.block_until_ready(grad(x, k))

  def run(n):
    for _ in range(n):
      out = grad(x, k)
    jax.block_until_ready(out)

  return _median_ms(run, steps)


def torch_ms(shape, dilation, steps):
  import torch  # pylint: disable=import-outside-toplevel
  torch.backends.cudnn.benchmark = True
  b, h, w, cin, cout = shape
  conv = torch.nn.Conv2d(cin, cout, 3, padding=dilation, dilation=dilation, bias=False)
  conv = conv.cuda().to(torch.bfloat16).to(memory_format=torch.channels_last)
  x = torch.randn(b, cin, h, w, device="cuda", dtype=torch.bfloat16,
                  requires_grad=True).contiguous(memory_format=torch.channels_last)
  x = x.detach().requires_grad_(True)
  g = torch.randn(b, cout, h, w, device="cuda", dtype=torch.bfloat16).contiguous(
      memory_format=torch.channels_last)

  def run(n):
    for _ in range(n):
      x.grad = conv.weight.grad = None
      conv(x).backward(g)
    torch.cuda.synchronize()

  run(3)
  return _median_ms(run, steps)


def jax_model_ms(output_stride, steps, form):
  """`form`: `atrous.GPU_FORM` for the model's dilated convolutions ("phases" or "direct")."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from calib_jax import models  # pylint: disable=import-outside-toplevel
  from calib_jax.models import atrous  # pylint: disable=import-outside-toplevel
  chosen = atrous.GPU_FORM
  atrous.GPU_FORM = form  # read when the model is traced
  model = models.get("deeplabv3_resnet50", 21, dtype=jnp.bfloat16, output_stride=output_stride)
  x = jax.random.normal(jax.random.key(0), (8, 512, 512, 3), jnp.float32)
  y = jax.random.randint(jax.random.key(1), (8, 512, 512), 0, 21)
  variables = jax.jit(lambda x: model.init({"params": jax.random.key(0)}, x, train=False))(x)
  tx = optax.sgd(0.1, momentum=0.9)
  state = (variables["params"], variables["batch_stats"], tx.init(variables["params"]))

  @jax.jit
  def step(state, key):
    params, stats, opt = state

    def loss_fn(params):
      logits, new = model.apply({"params": params, "batch_stats": stats}, x, train=True,
                                mutable=["batch_stats"], rngs={"dropout": key})
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new

    (_, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), new["batch_stats"], opt

  holder = [step(state, jax.random.key(2))]

  def run(n):
    for i in range(n):
      holder[0] = step(holder[0], jax.random.key(i))
    jax.block_until_ready(holder[0])

  try:
    run(2)
  finally:
    atrous.GPU_FORM = chosen
  return _median_ms(run, steps)


def torch_model_ms(steps):
  import torch  # pylint: disable=import-outside-toplevel
  import torchvision  # pylint: disable=import-outside-toplevel
  torch.backends.cudnn.benchmark = True
  model = torchvision.models.segmentation.deeplabv3_resnet50(
      weights=None, weights_backbone=None, num_classes=21, aux_loss=False)
  model = model.cuda().to(memory_format=torch.channels_last).train()
  x = torch.randn(8, 3, 512, 512, device="cuda").contiguous(memory_format=torch.channels_last)
  y = torch.randint(0, 21, (8, 512, 512), device="cuda")
  opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

  def run(n):
    for _ in range(n):
      opt.zero_grad(set_to_none=True)
      with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x)["out"].float(), y)
      loss.backward()
      opt.step()
    torch.cuda.synchronize()

  run(3)
  return _median_ms(run, steps)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  use_torch = _TORCH.value
  if use_torch:
    try:
      import torch  # pylint: disable=import-outside-toplevel
      use_torch = torch.cuda.is_available()
    except ImportError:
      use_torch = False
  if _MODEL.value:
    steps = max(_STEPS.value // 2, 3)
    for output_stride, form in ((8, "phases"), (8, "direct")):
      print(f"DeepLabV3-R50 step, output stride {output_stride}, dilated convolutions {form}: "
            f"jax {jax_model_ms(output_stride, steps, form):7.2f} ms", flush=True)
    if use_torch:
      print(f"DeepLabV3-R50 step, torchvision (stride 8): torch {torch_model_ms(steps):7.2f} ms",
            flush=True)
  for name in _SHAPES.value:
    shape = SHAPES[name]
    flops = 3 * 2 * shape[0] * shape[1] * shape[2] * 9 * shape[3] * shape[4]  # fwd + 2 bwd
    for dilation in map(int, _DILATIONS.value):
      j = jax_ms(shape, dilation, _STEPS.value)
      p = jax_ms(shape, dilation, _STEPS.value, "phases") if dilation > 1 else j
      t = torch_ms(shape, dilation, _STEPS.value) if use_torch else float("nan")
      print(f"{name:6s} {shape} dilation {dilation:2d}: jax direct {j:7.3f} ms "
            f"({flops / j / 1e9:6.1f} TFLOP/s), by phases {p:7.3f} ms  torch {t:7.3f} ms  "
            f"direct/torch {j / t:5.2f} phases/torch {p / t:5.2f}", flush=True)


if __name__ == "__main__":
  app.run(main)
