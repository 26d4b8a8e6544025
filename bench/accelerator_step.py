"""Recipes' train steps timed on this machine's accelerator, against the dry run's roofline.

    python bench/accelerator_step.py [--items=mlp_p1,mlp_p7,cifar10_resnet50,...]
        [--deadline_s=420] [--calls=10] [--json=out.jsonl]

Each item is `calib_jax.dry_run.measure.measure_config`: the train step the dry run compiles
(the loop's program, k steps per call), compiled for the local chip and run on random inputs of
its shapes; printed beside the roofline the dry run estimates from the same compile. The
`mlp`/`cnn` items are the label-relaxation study's Fashion-MNIST recipe (`fashion_mnist_mlp.py:lr`,
and the same with `small_cnn`) as a single run and as sweeps of P = 7 (7 alphas) and P = 21
(× 3 seeds) members, one program each: per member-step, the sweep against P sequential runs.

The machine needs JAX for its accelerator, flax, optax, orbax and ml_collections; TensorFlow is
not needed (no data is read). Where it is not installed, `calib_jax.data`'s module-level
`import tensorflow` is answered by an inert stand-in (`_stand_in_tensorflow`), which is never
called. Items run in order until `--deadline_s`; each row is printed (and appended to --json)
as soon as it is measured.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
import time
import types

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Inert(type):
  """A class whose every attribute is another such class, and whose calls return one: enough
  for module-level `tf.X`, `@tfds.Y(...)` decorators and `class B(tfds.core.Z)`."""

  def __getattr__(cls, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _Inert(name, (), {})

  def __call__(cls, *args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
      return args[0]  # used as a decorator
    return _Inert("result", (), {})

  def __getitem__(cls, item):
    return _Inert("item", (), {})

  def _same(cls, *_):
    return cls

  __or__ = __ror__ = __add__ = __radd__ = __mul__ = __rmul__ = __mod__ = _same


class _InertModule(types.ModuleType):
  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _Inert(name, (), {})


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def __init__(self, roots):
    self.roots = roots

  def find_spec(self, fullname, path, target=None):
    if fullname.split(".")[0] in self.roots:
      return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    return None

  def create_module(self, spec):
    module = _InertModule(spec.name)
    module.__path__ = []
    return module

  def exec_module(self, module):
    pass


def _stand_in_tensorflow() -> list[str]:
  """Inert `tensorflow`/`tensorflow_datasets` modules where they are not installed."""
  missing = [m for m in ("tensorflow", "tensorflow_datasets")
             if importlib.util.find_spec(m) is None]
  if missing:
    sys.meta_path.insert(0, _InertFinder(set(missing)))
  return missing


STUDY_ALPHAS = "0.01,0.025,0.05,0.1,0.2,0.3,0.4"


def _items():
  """name -> (config file, overrides, steps per call)."""
  items = {}
  for recipe, model in (("mlp", None), ("cnn", "small_cnn")):
    for members, sweep in ((1, ""), (7, f"loss_kwargs.alpha={STUDY_ALPHAS}"),
                           (21, f"loss_kwargs.alpha={STUDY_ALPHAS};seed=0,1,2")):
      overrides = {"sweep": sweep}
      if model:
        overrides.update(model=model, model_kwargs={"widths": (32, 64)})
      items[f"{recipe}_p{members}"] = ("fashion_mnist_mlp.py:lr", overrides, 16)
  # Per-chip batches of the dry-run table (docs/accelerators.md) for one GPU.
  # k = 1: a step of tens of milliseconds hides the host's work per call.
  items["cifar10_resnet50"] = ("cifar10_resnet50.py", {}, 1)
  # bfloat16 as the dry-run table's rows (docs/accelerators.md); the recipes default to float32.
  items["imagenet_resnet50_acls"] = ("imagenet_resnet50_acls.py:acls",
                                     {"data.batch_size": 256, "data.eval_batch_size": 256,
                                      "dtype": "bfloat16"}, 1)
  items["voc2012_deeplabv3_resnet50"] = ("voc2012_deeplabv3_resnet50.py",
                                         {"data.batch_size": 8, "data.eval_batch_size": 8,
                                          "dtype": "bfloat16"}, 1)
  items["imagenet_vit_s16_sam"] = ("imagenet_vit_s16_sam.py",
                                   {"data.batch_size": 256, "data.eval_batch_size": 256}, 1)
  return items


def _config(spec: str, overrides: dict):
  from calib_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from calib_jax.config import variants  # pylint: disable=import-outside-toplevel
  return variants.override(config_lib.load_config_file(os.path.join(ROOT, "configs", spec)),
                           overrides)


_ITEMS = flags.DEFINE_list("items", list(_items()), "what to measure, in order (" +
                           ", ".join(_items()) + ")")
_DEADLINE = flags.DEFINE_float("deadline_s", 420, "start no item after this many seconds")
_CALLS = flags.DEFINE_integer("calls", 10, "timed calls per repeat (3 repeats, median)")
_JSON = flags.DEFINE_string("json", None, "append one JSON row per item to this file")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  items = _items()
  unknown = [name for name in _ITEMS.value if name not in items]
  if unknown:
    raise app.UsageError(f"unknown items {unknown}; choose from {', '.join(items)}")
  start = time.monotonic()
  stood_in = _stand_in_tensorflow()
  import jax  # pylint: disable=import-outside-toplevel
  import flax  # pylint: disable=import-outside-toplevel
  from calib_jax.dry_run import measure  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  print(f"machine: {platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__}, flax "
        f"{flax.__version__}; {len(jax.devices())} x {device.device_kind} ({device.platform}); "
        f"stand-in modules: {stood_in or 'none'}", flush=True)
  topology = measure.local_topology() if device.platform != "cpu" else None
  if topology is None:
    from calib_jax.dry_run import chips  # pylint: disable=import-outside-toplevel
    topology = measure.local_topology(chips.get("h100"))  # a CPU smoke run: ratios meaningless
  print(f"roofline on the figures of: {topology.chip.name} ({topology.chip.source})", flush=True)
  for name in _ITEMS.value:
    if time.monotonic() - start > _DEADLINE.value:
      print(f"{name}: skipped (deadline)", flush=True)
      continue
    spec, overrides, k = items[name]
    try:
      config = _config(spec, overrides)
      m = measure.measure_config(config, topology, steps_per_call=k, calls=_CALLS.value)
    except Exception as e:  # pylint: disable=broad-except
      print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
      continue
    row = {"item": name, "config": spec, "overrides": overrides, "dtype": config.dtype,
           "batch": config.data.batch_size, "device": device.device_kind,
           **{f: getattr(m, f) for f in ("members", "steps_per_call", "step_seconds",
                                         "step_seconds_runs", "roofline_seconds",
                                         "per_chip_bytes", "flops", "bytes_accessed",
                                         "compile_seconds", "first_call_seconds")},
           "over_roofline": m.over_roofline}
    member_step = m.step_seconds / m.members
    roof = f"{m.roofline_seconds * 1e3:.3f} ms" if m.roofline_seconds else "n/a"
    ratio = f"{m.over_roofline:.2f}x" if m.over_roofline else "n/a"
    print(f"{name:28s} P={m.members:2d} k={k:2d} batch {config.data.batch_size:4d} "
          f"{config.dtype:8s}: {m.step_seconds * 1e3:9.3f} ms/step "
          f"({member_step * 1e6:9.1f} us/member-step) roofline {roof} (measured {ratio}); "
          f"{m.per_chip_bytes / 2**30:.2f} GiB; compile {m.compile_seconds:.1f} s; "
          f"runs {[round(t * 1e3, 3) for t in m.step_seconds_runs]}", flush=True)
    if _JSON.value:
      with open(_JSON.value, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  app.run(main)
