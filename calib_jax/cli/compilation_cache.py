"""A persistent JAX compilation cache for the command-line programs (`train.py`, `eval.py`, the
demo): a second run of the same command loads its compiled XLA programs from disk instead of
compiling them again (`eval.py --predictions` compiles ~65 small programs, most of a small
file's time).

Where: `$CALIB_JAX_COMPILATION_CACHE` if set to a directory; otherwise
`$XDG_CACHE_HOME/calib_jax/jax`, or `~/.cache/calib_jax/jax` without XDG_CACHE_HOME.
Off switch: `CALIB_JAX_COMPILATION_CACHE=off` (also `0`, `false`, `no`, `none`). A cache
directory a user gave JAX already (`JAX_COMPILATION_CACHE_DIR` or `jax.config`) is kept.

Every program is cached, however fast it compiled (JAX's default keeps only those over 1 s,
which none of the evaluation's are). Entries are keyed by the program, the jax/jaxlib version,
the backend and the compile options, so a cache shared by versions or machines never hands a
program to the wrong one.

Two processes sharing the directory: JAX writes an entry in place (it is not written to a
temporary file and renamed), so a reader racing a writer can read a partial entry; JAX then
fails to decompress it, warns (the warning goes to the run's log.txt) and compiles the program
itself, which is safe (checked by truncating entries: "Error reading persistent compilation
cache entry ... incomplete", the right result). JAX never rewrites an existing entry, so one left
partial by a killed writer is compiled on every run until the directory is deleted. With the
`filelock` package installed the cache is bounded (`MAX_BYTES`, least recently used entries
evicted) and every read and write holds a file lock, so no partial entry is ever read.

Importing this module does nothing; `enable()` is called by each program's `run()`.
"""
import importlib.util
import os

ENV = "CALIB_JAX_COMPILATION_CACHE"
_OFF = ("off", "0", "false", "no", "none")
# calib_jax.metrics.use_cacheable_cpu_sorts(True), set without importing JAX (that module's
# CACHEABLE_SORTS_ENV): the rank metrics' short rows sorted by XLA, so they are cached too.
CACHEABLE_SORTS_ENV = "CALIB_JAX_CACHEABLE_SORTS"
# calib_jax.program_store.ENV, likewise set without importing JAX: the programs kept on disk to
# be loaded untraced, in a folder of the cache directory (JAX's cache ignores folders).
PROGRAM_STORE_ENV = "CALIB_JAX_PROGRAM_STORE"
MAX_BYTES = 2 << 30  # the bound with `filelock` installed (JAX evicts the oldest entries)


def cache_dir(environ: dict[str, str] | None = None) -> str | None:
  """The cache directory the environment asks for (None: switched off)."""
  environ = os.environ if environ is None else environ
  value = environ.get(ENV, "").strip()
  if value.lower() in _OFF:
    return None
  if value:
    return os.path.abspath(os.path.expanduser(value))
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "calib_jax", "jax")


def enable(environ: dict[str, str] | None = None) -> str | None:
  """Points JAX's persistent compilation cache at `cache_dir(environ)` and returns the
  directory in use (None when switched off)."""
  import jax  # Deferred: importing this module stays free.
  path = jax.config.jax_compilation_cache_dir  # one the user set for JAX already: kept
  if not path:
    path = cache_dir(environ)
    if path is None:
      return None
    try:
      os.makedirs(path, exist_ok=True)
    except OSError:  # An unwritable home: run without a cache rather than fail.
      return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if importlib.util.find_spec("filelock") is not None:  # JAX's lock needs it (docstring)
      jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  # With a cache, the rank metrics' short rows sorted by XLA, so their programs are cached too
  # (calib_jax.metrics._ranking: slower to compile once, then found by every later process).
  os.environ[CACHEABLE_SORTS_ENV] = "1"
  os.environ[PROGRAM_STORE_ENV] = os.path.join(path, "programs")
  return path
