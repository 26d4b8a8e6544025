"""Training-step time of calib_jax models against equivalent PyTorch models on the same machine.

One step = forward + backward + SGD with momentum 0.9 on a batch of random 32x32x3 images
(CIFAR shapes) with BatchNorm in training mode and softmax cross-entropy. Models:
  resnet20: He et al.'s CIFAR ResNet-20, option A shortcuts (calib_jax `cifar_resnet20`);
  resnet50: ResNet-50 with the CIFAR stem (calib_jax `resnet50`, stem='cifar').
The PyTorch twins are written below with the same layers, shapes and parameter counts (checked
at start-up). Reported: median seconds per step over `--repeats` timed runs of `--steps` steps,
JAX and PyTorch alternating so that load from other processes hits both alike, after the first
call (JAX: compilation, reported separately) and `--warmup` untimed steps.

  .venv/bin/python bench/train_step.py                         # both models, both frameworks
  .venv/bin/python bench/train_step.py --models resnet20 --steps 10 --repeats 5
  .venv/bin/python bench/train_step.py --jax-dtype bfloat16     # e.g. on a GPU

Needs torch (the `bench` extra) for the PyTorch column; without it only JAX is measured.
"""
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from calib_jax import models

JAX_MODELS = {
    "resnet20": lambda dtype: models.get("cifar_resnet20", 10, dtype=dtype),
    "resnet50": lambda dtype: models.get("resnet50", 10, stem="cifar", dtype=dtype),
}
# model -> default (timed steps per repeat, repeats, warm-up steps)
DEFAULTS = {"resnet20": (5, 3, 1), "resnet50": (1, 2, 0)}

_MODELS = flags.DEFINE_string("models", "resnet20,resnet50",
                              "comma-separated subset of " + ",".join(JAX_MODELS))
_FRAMEWORKS = flags.DEFINE_string("frameworks", "jax,torch", "comma-separated: jax, torch")
_BATCH = flags.DEFINE_integer("batch", 128, "batch size")
_STEPS = flags.DEFINE_integer("steps", None,
                              "timed steps per repeat (default: resnet20 5, resnet50 1)")
_REPEATS = flags.DEFINE_integer("repeats", None, "timed repeats, JAX and torch alternating "
                                "(default: resnet20 3, resnet50 2)")
_WARMUP = flags.DEFINE_integer("warmup", None, "untimed steps after the first call (default: "
                               "resnet20 1, resnet50 0)")
_JAX_DTYPE = flags.DEFINE_enum("jax-dtype", "float32", ["float32", "bfloat16"],
                               "dtype of the JAX model's computation")
_THREADS = flags.DEFINE_integer("threads", os.cpu_count(),
                                "torch intra-op threads (XLA uses all cores)")
_TORCH_DEVICE = flags.DEFINE_string("torch-device", "auto",
                                    "torch device: auto (cuda when available, else cpu), cpu, cuda")
_TORCH_DTYPE = flags.DEFINE_enum("torch-dtype", "float32", ["float32", "bfloat16"],
                                 "torch computation dtype (bfloat16: torch.autocast, the usual "
                                 "mixed precision; float32 allows TF32 as JAX's default "
                                 "precision does on GPUs)")
_TORCH_CHANNELS_LAST = flags.DEFINE_boolean("torch-channels-last", False,
                                            "run the torch model in channels-last memory format")
_JSON = flags.DEFINE_string("json", None, "also write the results to this file")


# ----------------------------------------------------------------------------- JAX

def jax_train_step(model, learning_rate=0.1):
  """A jitted SGD-momentum step over (params, batch_stats, opt_state); the state is donated."""
  tx = optax.sgd(learning_rate, momentum=0.9)

  def loss_fn(params, batch_stats, images, labels):
    logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, images,
                                  train=True, mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, updates["batch_stats"]

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, images, labels):
    params, batch_stats, opt_state = state
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, batch_stats, images, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), batch_stats, opt_state), loss

  return tx, step


def jax_runner(name, batch, dtype):
  """Compiles the JAX step; returns (run(steps) -> last loss, compile+first-step s, params)."""
  model = JAX_MODELS[name](dtype)
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.standard_normal((batch, 32, 32, 3), dtype=np.float32))
  labels = jnp.asarray(rng.integers(0, 10, batch))
  variables = jax.jit(lambda x: model.init({"params": jax.random.key(0)}, x, train=False))(images)
  tx, step = jax_train_step(model)
  state = [(variables["params"], variables["batch_stats"], tx.init(variables["params"]))]

  def run(steps):
    for _ in range(steps):
      state[0], loss = step(state[0], images, labels)
    jax.block_until_ready(state[0])
    return float(loss)

  start = time.perf_counter()
  run(1)
  return run, time.perf_counter() - start, models.param_count(variables["params"])


# ----------------------------------------------------------------------------- PyTorch

def torch_models():
  """PyTorch twins of the JAX models (defined lazily so the script runs without torch)."""
  import torch
  from torch import nn
  import torch.nn.functional as F

  def bn(c):
    return nn.BatchNorm2d(c, momentum=0.1, eps=1e-5)

  class CifarBasicBlock(nn.Module):
    """Basic block with an option A (subsample + zero-pad) shortcut."""

    def __init__(self, c_in, c_out, stride):
      super().__init__()
      self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
      self.bn1 = bn(c_out)
      self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
      self.bn2 = bn(c_out)
      self.stride, self.pad = stride, c_out - c_in

    def forward(self, x):
      y = F.relu(self.bn1(self.conv1(x)))
      y = self.bn2(self.conv2(y))
      if self.stride != 1 or self.pad:
        x = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, 0, self.pad))
      return F.relu(y + x)

  class CifarResNet(nn.Module):

    def __init__(self, depth=20, num_classes=10):
      super().__init__()
      n = (depth - 2) // 6
      self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
      self.bn = bn(16)
      blocks, c_in = [], 16
      for stage, width in enumerate((16, 32, 64)):
        for i in range(n):
          blocks.append(CifarBasicBlock(c_in, width, 2 if stage > 0 and i == 0 else 1))
          c_in = width
      self.blocks = nn.Sequential(*blocks)
      self.head = nn.Linear(64, num_classes)

    def forward(self, x):
      x = self.blocks(F.relu(self.bn(self.conv(x))))
      return self.head(x.mean(dim=(2, 3)))

  class Bottleneck(nn.Module):

    def __init__(self, c_in, width, stride):
      super().__init__()
      c_out = 4 * width
      self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
      self.bn1 = bn(width)
      self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
      self.bn2 = bn(width)
      self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
      self.bn3 = bn(c_out)
      self.down = None
      if stride != 1 or c_in != c_out:
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), bn(c_out))

    def forward(self, x):
      y = F.relu(self.bn1(self.conv1(x)))
      y = F.relu(self.bn2(self.conv2(y)))
      y = self.bn3(self.conv3(y))
      return F.relu(y + (x if self.down is None else self.down(x)))

  class ResNet50Cifar(nn.Module):

    def __init__(self, num_classes=10):
      super().__init__()
      self.conv = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
      self.bn = bn(64)
      blocks, c_in = [], 64
      for stage, (n, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for i in range(n):
          blocks.append(Bottleneck(c_in, width, 2 if stage > 0 and i == 0 else 1))
          c_in = 4 * width
      self.blocks = nn.Sequential(*blocks)
      self.head = nn.Linear(2048, num_classes)

    def forward(self, x):
      x = self.blocks(F.relu(self.bn(self.conv(x))))
      return self.head(x.mean(dim=(2, 3)))

  return torch, {"resnet20": CifarResNet, "resnet50": ResNet50Cifar}


def torch_runner(name, batch, threads, channels_last, device="cpu", dtype="float32"):
  """Builds the PyTorch twin; returns (run(steps) -> last loss, first-step s, params)."""
  torch, builders = torch_models()
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  if device == "cuda":  # cuDNN's algorithm search, and TF32 as JAX's default precision
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
  model = builders[name]().to(device)
  images = torch.randn(batch, 3, 32, 32, device=device)
  labels = torch.randint(0, 10, (batch,), device=device)
  autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16) if dtype == "bfloat16"
              else contextlib.nullcontext())
  if channels_last:
    model = model.to(memory_format=torch.channels_last)
    images = images.contiguous(memory_format=torch.channels_last)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  model.train()

  def run(steps):
    for _ in range(steps):
      optimizer.zero_grad(set_to_none=True)
      with autocast:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
      loss.backward()
      optimizer.step()
    return loss.float().item()  # synchronises (a no-op on CPU, where torch runs eagerly)

  start = time.perf_counter()
  run(1)
  return run, time.perf_counter() - start, sum(p.numel() for p in model.parameters())


def timed(run, steps):
  start = time.perf_counter()
  loss = run(steps)
  if not np.isfinite(loss):
    raise RuntimeError(f"training loss is not finite: {loss}")
  return (time.perf_counter() - start) / steps


# ----------------------------------------------------------------------------- main

def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  names = [m for m in _MODELS.value.split(",") if m]
  for m in names:
    if m not in JAX_MODELS:
      raise app.UsageError(f"unknown model {m!r}; choose from {sorted(JAX_MODELS)}")
  frameworks = [f for f in ("jax", "torch") if f in _FRAMEWORKS.value.split(",")]
  batch, jax_dtype, threads = _BATCH.value, _JAX_DTYPE.value, _THREADS.value
  channels_last = _TORCH_CHANNELS_LAST.value
  torch_device, torch_dtype = _TORCH_DEVICE.value, _TORCH_DTYPE.value
  if "torch" in frameworks:
    try:
      import torch  # noqa: F401
      if torch_device == "auto":
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
      print("torch is not installed: measuring JAX only", file=sys.stderr)
      frameworks.remove("torch")

  device = jax.devices()[0]
  print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; jax {jax.__version__} on {device.platform} "
        f"({device.device_kind}); XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  results = []
  for name in names:
    steps, repeats, warmup = (default if given is None else given for given, default in
                              zip((_STEPS.value, _REPEATS.value, _WARMUP.value), DEFAULTS[name]))
    row = {"model": name, "batch": batch, "steps": steps, "repeats": repeats,
           "load_before": os.getloadavg()[0]}
    runners = {}
    if "jax" in frameworks:
      run, first, count = jax_runner(name, batch, getattr(jnp, jax_dtype))
      runners["jax"] = run
      row.update(jax_first_call_s=first, jax_params=count, jax_dtype=jax_dtype)
    if "torch" in frameworks:
      run, first, count = torch_runner(name, batch, threads, channels_last, torch_device,
                                       torch_dtype)
      runners["torch"] = run
      row.update(torch_first_call_s=first, torch_params=count, torch_threads=threads,
                 torch_channels_last=channels_last, torch_device=torch_device,
                 torch_dtype=torch_dtype)
    if len(runners) == 2 and row["jax_params"] != row["torch_params"]:
      raise RuntimeError(f"{name}: JAX has {row['jax_params']} parameters, torch "
                         f"{row['torch_params']}; the models are not equivalent")
    for run in runners.values():
      if warmup:
        run(warmup)
    # Alternate the frameworks so that load from other processes hits both alike.
    timings = {fw: [] for fw in runners}
    for _ in range(repeats):
      for fw, run in runners.items():
        timings[fw].append(timed(run, steps))
    row["load_after"] = os.getloadavg()[0]
    for fw, runs in timings.items():
      median = statistics.median(runs)
      row[f"{fw}_s"], row[f"{fw}_runs"] = median, runs
      label = f"{fw} ({jax_dtype if fw == 'jax' else torch_dtype})"
      print(f"{name:9s} {label:17s}: {median * 1e3:9.1f} ms/step ({batch / median:7.1f} "
            f"img/s)  first call {row[f'{fw}_first_call_s']:.1f} s  runs "
            f"{[round(t * 1e3, 1) for t in runs]}", flush=True)
    if len(runners) == 2:
      row["jax_over_torch"] = row["jax_s"] / row["torch_s"]
      print(f"{name:9s} params {row['jax_params']:,}  time ratio jax/torch = "
            f"{row['jax_over_torch']:.2f}  (load average {row['load_before']:.1f} -> "
            f"{row['load_after']:.1f})", flush=True)
    results.append(row)
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
