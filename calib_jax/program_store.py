"""`jit`: `jax.jit` whose compiled programs are also kept on disk, so that a later process loads
each one without tracing or lowering it again.

JAX's persistent compilation cache spares a process the compiling, but it keys a program by
its lowered module, so each process still traces and lowers every program to find it (a warm
`eval.py --predictions` on digits spent ~2.8 s of its ~6.7 s there). A program kept here is
keyed by what its tracing depends on instead, and loaded from disk as an executable:

* the function (module and qualified name) and its static arguments (values of plain types,
  or named module-level functions, `functools.partial` of them; anything else: not kept);
* every dynamic argument's tree structure, shape, dtype, weak type and committed devices;
* JAX's configuration (every option, and the thread's trace context), the environment
  variables calib_jax reads while tracing (`TRACED_ENVIRONMENT`), the XLA flags;
* the versions of jax, jaxlib, numpy, optax, scipy, the backend's platform and devices, and
  this process's own devices;
* the contents of every `.py` file of calib_jax (a changed line anywhere makes new keys).

It is switched on by `$CALIB_JAX_PROGRAM_STORE` (a directory; `cli.compilation_cache.enable`
sets it beside JAX's cache); unset, `jit` is `jax.jit`. Not kept: a program called inside
another's trace (it is traced into it, as `jax.jit` does) or under `jax.disable_jit()`, one
with host callbacks or effects (their executables embed this process's pointers), one that
`serialize_executable` refuses.
Entries are written to a temporary file and renamed, so a reader never sees a partial one; an
unreadable entry is compiled again and rewritten. Loading an entry runs its code: the
directory must be trusted as JAX's cache directory is. The directory is bounded (`MAX_BYTES`,
least recently used entries removed).

The programs are the ones `jax.jit` compiles (`lower(...).compile()` of the same call, through
JAX's compilation cache): the same executables, so the same numbers to the bit.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import os
import pickle
import sys
import tempfile
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import serialize_executable

ENV = "CALIB_JAX_PROGRAM_STORE"
MAX_BYTES = 1 << 30
_SUFFIX = ".program"
_VERSIONED = ("jax", "jaxlib", "numpy", "optax", "scipy")
# The environment variables calib_jax reads at trace time: metrics._ranking's
# CACHEABLE_SORTS_ENV (`use_cacheable_cpu_sorts`; tests/test_program_store.py checks the name).
TRACED_ENVIRONMENT = ("CALIB_JAX_CACHEABLE_SORTS",)
# jax.monitoring event of each program loaded from the store (bench/eval_predictions_speed.py
# counts them beside the programs compiled).
LOADED_EVENT = "/calib_jax/program_store/loaded"


class _NotKept(Exception):
  """A static argument without a stable name across processes."""


def jit(fun: Callable | None = None, *, static_argnames: tuple[str, ...] | str = (),
        **options: Any) -> Callable:
  """`jax.jit(fun, static_argnames=..., **options)`, its programs kept in the store (see the
  module docstring); usable as a decorator, with or without arguments."""
  if fun is None:
    return functools.partial(jit, static_argnames=static_argnames, **options)
  return _StoredJit(fun, static_argnames, options)


class _StoredJit:
  """The jitted function and, per call signature, the executable loaded or compiled for it."""

  def __init__(self, fun: Callable, static_argnames, options: dict[str, Any]):
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    self._jitted = jax.jit(fun, static_argnames=names, **options)
    functools.update_wrapper(self, fun)
    parameters = list(inspect.signature(fun).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    self._static_positions = frozenset(i for i, p in enumerate(parameters)
                                       if p.name in names and p.kind in positional)
    self._static_names = frozenset(names)
    self._name = f"{fun.__module__}.{fun.__qualname__}"
    self._executables: dict[Any, Any] = {}

  def __getattr__(self, name: str) -> Any:  # lower, trace, eval_shape, ... of the jitted one
    return getattr(self._jitted, name)

  def __call__(self, *args, **kwargs):
    directory = os.environ.get(ENV)
    if not directory or jax.config.jax_disable_jit or not _trace_state_clean():
      return self._jitted(*args, **kwargs)
    static = (tuple((i, a) for i, a in enumerate(args) if i in self._static_positions)
              + tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_names)))
    dynamic_args = tuple(a for i, a in enumerate(args) if i not in self._static_positions)
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
    leaves, tree = jax.tree.flatten((dynamic_args, dynamic_kwargs))
    signature = (tree, tuple(map(_leaf_signature, leaves)), static, _context())
    executable = self._executables.get(signature)
    if executable is None:
      executable = self._load_or_compile(directory, signature, args, kwargs)
      self._executables[signature] = executable
    return executable(*dynamic_args, **dynamic_kwargs)

  def _load_or_compile(self, directory: str, signature, args, kwargs):
    """The executable of this call: from the store, else compiled (and stored if it can be)."""
    try:
      path = os.path.join(directory, _key(self._name, signature) + _SUFFIX)
    except _NotKept:
      return self._jitted.lower(*args, **kwargs).compile()
    loaded = _read(path)
    if loaded is not None:
      jax.monitoring.record_event(LOADED_EVENT)
      return loaded
    compiled = _compile_past_jax_cache(self._jitted, args, kwargs)
    _write(directory, path, compiled)
    return compiled


def _compile_past_jax_cache(jitted, args, kwargs):
  """`jitted.lower(*args, **kwargs).compile()` with JAX's persistent cache off: an executable
  read from that cache serialises without its machine code on XLA:CPU (loaded again, it fails:
  "Function ... not found"), a freshly compiled one whole. JAX decides once per process whether
  it uses its cache, so the decision is reset before and after. (The switch is global: a
  program another thread compiles meanwhile skips JAX's cache too, which costs only time.)"""
  from jax.experimental.compilation_cache import compilation_cache as jax_cache
  enabled = jax.config.jax_enable_compilation_cache
  jax_cache.reset_cache()
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    return jitted.lower(*args, **kwargs).compile()
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    jax_cache.reset_cache()


def _trace_state_clean() -> bool:
  """Whether no trace is under way (a call inside one is staged into it, as `jax.jit` is)."""
  from jax._src import core  # Private, as `jax.stages.Compiled` itself checks it.
  return core.trace_state_clean()


def _context() -> tuple:
  """What a program's tracing may read besides its arguments: the thread's trace context (the
  one `jax.jit` keys its own cache by) and `TRACED_ENVIRONMENT`."""
  from jax._src import config  # Private: jax.jit's own key of the configuration.
  return (config.trace_context(), tuple(os.environ.get(k) for k in TRACED_ENVIRONMENT))


def _leaf_signature(x: Any) -> tuple:
  """Shape, dtype, weak type and committed devices of one dynamic argument."""
  if isinstance(x, jax.Array):
    devices = (tuple(sorted(d.id for d in x.sharding.device_set)), x.sharding.memory_kind,
               type(x.sharding).__name__) if x.committed else None
    return (x.shape, str(x.dtype), getattr(x, "weak_type", False), devices)  # (keys: none)
  if isinstance(x, (np.ndarray, np.generic)):
    return (x.shape, str(x.dtype), False, None)
  aval = jax.typeof(x)  # Python scalars: weakly typed
  return (aval.shape, str(aval.dtype), aval.weak_type, type(x).__name__)


def _stable(value: Any) -> str:
  """A static argument as the same text in every process (`_NotKept` where there is none)."""
  if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
    return f"{type(value).__name__}:{value!r}"
  if isinstance(value, (tuple, list, frozenset)):
    items = sorted(map(_stable, value)) if isinstance(value, frozenset) else map(_stable, value)
    return f"{type(value).__name__}({', '.join(items)})"
  if isinstance(value, np.dtype):
    return f"dtype:{value}"
  if isinstance(value, functools.partial):
    keywords = sorted((k, _stable(v)) for k, v in value.keywords.items())
    return f"partial({_stable(value.func)}, {_stable(value.args)}, {keywords})"
  name = getattr(value, "__qualname__", None)
  if (isinstance(value, (types.FunctionType, type)) or hasattr(value, "__wrapped__")) and name:
    if "<" in name:  # a lambda or a local function: no name to find it by in another process
      raise _NotKept(name)
    return f"{value.__module__}.{name}"
  raise _NotKept(type(value).__name__)


def _key(name: str, signature) -> str:
  tree, leaves, static, context = signature
  text = repr((name, str(tree), leaves, [(i, _stable(v)) for i, v in static], _text(context),
               sorted((k, repr(v)) for k, v in jax.config.values.items()), _environment()))
  return hashlib.sha256(text.encode()).hexdigest()


def _text(value: Any) -> str:
  """`repr(value)`, with objects that repr as their address (the trace context's axis
  environment) written as their fields instead, so that every process writes the same text
  (where one still names an address, the key just never matches: the program is compiled)."""
  if isinstance(value, tuple):
    return f"({', '.join(map(_text, value))})"
  text = repr(value)
  if " at 0x" not in text:
    return text
  names = [n for n in getattr(type(value), "__slots__", ()) if n != "__weakref__"]
  fields = ({n: getattr(value, n) for n in names if hasattr(value, n)} if names
            else getattr(value, "__dict__", {}))
  return f"{type(value).__qualname__}{_text(tuple(sorted(fields.items())))}"


@functools.lru_cache(maxsize=None)
def _environment() -> str:
  """This process's fixed part of every key: versions, backend, devices, XLA flags, and a hash
  of calib_jax's source."""
  versions = []
  for package in _VERSIONED:
    try:
      versions.append((package, importlib.metadata.version(package)))
    except importlib.metadata.PackageNotFoundError:
      versions.append((package, None))
  backend = jax.devices()[0].client
  devices = [(d.id, d.platform, d.device_kind, d.process_index) for d in jax.devices()]
  # This process's own devices: uncommitted arguments run on its first, which differs between
  # the processes of a multi-process run.
  devices.append((jax.process_index(), [d.id for d in jax.local_devices()]))
  xla = [os.environ.get("XLA_FLAGS"), os.environ.get("LIBTPU_INIT_ARGS"),
         [a for a in sys.argv if a.startswith("--xla")]]
  return repr((versions, backend.platform, backend.platform_version, devices, xla,
               _source_hash()))


def _source_hash() -> str:
  source = hashlib.sha256()
  package = os.path.dirname(os.path.abspath(__file__))
  for folder, dirs, files in os.walk(package):
    dirs.sort()
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        source.update(os.path.relpath(path, package).encode() + b"\0")
        with open(path, "rb") as f:
          source.update(f.read() + b"\0")
  return source.hexdigest()


def _read(path: str):
  """The executable stored at `path`, or None (absent or unreadable: compiled again)."""
  try:
    with open(path, "rb") as f:
      serialized, in_tree, out_tree, device_ids = pickle.load(f)
    devices = {d.id: d for d in jax.devices()}
    executable = serialize_executable.deserialize_and_load(
        serialized, in_tree, out_tree, execution_devices=[devices[i] for i in device_ids])
  except FileNotFoundError:
    return None
  except Exception as e:  # noqa: BLE001  (a partial or stale entry: compiled and rewritten)
    logging.warning("program store: cannot load %s (%s); compiling it again", path, e)
    return None
  try:
    os.utime(path)  # the least recently used entries go first (`_evict`)
  except OSError:
    pass
  return executable


def _write(directory: str, path: str, compiled) -> None:
  """Stores `compiled` at `path` where it can be kept (see the module docstring)."""
  unloaded = getattr(compiled._executable, "_unloaded_executable", None)  # noqa: SLF001
  if (unloaded is None or unloaded.host_callbacks or unloaded.ordered_effects
      or unloaded.unordered_effects):
    return
  try:
    device_ids = [d.id for d in unloaded.device_list]  # the devices it runs on, to load it on
    payload = pickle.dumps((*serialize_executable.serialize(compiled), device_ids))
  except Exception:  # noqa: BLE001  (not serialisable: constants, mutable refs, ...)
    return
  try:
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      f.write(payload)
    os.replace(temporary, path)
    _evict(directory)
  except OSError as e:  # an unwritable store: the program is used, not kept
    logging.warning("program store: cannot write %s (%s)", path, e)


def _evict(directory: str) -> None:
  """Removes the least recently used entries while the store holds over `MAX_BYTES`."""
  entries = []
  with os.scandir(directory) as scan:
    for entry in scan:
      if entry.name.endswith(_SUFFIX):
        stat = entry.stat()
        entries.append((stat.st_mtime, stat.st_size, entry.path))
  total = sum(size for _, size, _ in entries)
  for _, size, path in sorted(entries):
    if total <= MAX_BYTES:
      break
    try:
      os.remove(path)
    except OSError:
      pass
    total -= size
