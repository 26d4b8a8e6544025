"""`calib_jax.program_store.jit`: programs kept on disk and loaded untraced, the same bits as
`jax.jit`; off (plain `jax.jit`) without `$CALIB_JAX_PROGRAM_STORE`."""
import functools
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import program_store
from calib_jax.cli import compilation_cache
from calib_jax.metrics import _ranking

TRACES = []


def _body(x, y, scale):
  TRACES.append(scale)  # runs once per trace: counts them
  return {"sum": jnp.sum(jnp.exp(x) * y) * scale, "max": jnp.max(x)}


def _fresh():
  """A new wrapper of a new function object with `_body`'s code, name and module: nothing of it
  in JAX's memory (its caches are keyed by the function object), as in another process, while
  the store (keyed by the module and qualified name) finds its programs. Not
  `jax.clear_caches()`: that also drops every other test's programs in this process (clearing
  and re-tracing them was ~5 CPU-s a run of this module, 2026-11-29)."""
  body = types.FunctionType(_body.__code__, _body.__globals__, _body.__name__,
                            _body.__defaults__, _body.__closure__)
  assert (body.__module__, body.__qualname__) == (_body.__module__, _body.__qualname__)
  return program_store.jit(body, static_argnames="scale")


@pytest.fixture
def store(tmp_path, monkeypatch):
  monkeypatch.setenv(program_store.ENV, str(tmp_path / "programs"))
  TRACES.clear()
  return tmp_path / "programs"


def _entries(path):
  return sorted(p.name for p in path.iterdir()) if path.exists() else []


def test_a_stored_program_is_loaded_untraced_with_the_same_bits(store):
  x = jnp.linspace(-3.0, 2.0, 257)
  want = jax.jit(_body, static_argnames="scale")(x, 0.5, scale=3)
  TRACES.clear()
  first = _fresh()(x, 0.5, scale=3)
  assert TRACES == [3] and len(_entries(store)) == 1
  loaded = []
  jax.monitoring.register_event_listener(
      lambda event, **kw: loaded.append(event) if event == program_store.LOADED_EVENT else None)
  again = _fresh()(x, 0.5, scale=3)
  assert TRACES == [3], "the stored program was traced again"
  assert loaded == [program_store.LOADED_EVENT]
  for got in (first, again):
    for key in want:
      assert np.asarray(got[key]).tobytes() == np.asarray(want[key]).tobytes(), key


def test_each_signature_and_static_value_is_its_own_program(store):
  fun = _fresh()
  fun(jnp.ones(4), 1.0, scale=2)
  fun(jnp.ones(4), 1.0, scale=2)  # in memory
  fun(jnp.ones(5), 1.0, scale=2)  # another shape
  fun(jnp.ones(4), np.float32(1.0), scale=2)  # not weakly typed
  fun(jnp.ones(4), 1.0, scale=7)  # another static value
  assert len(TRACES) == 4 and len(_entries(store)) == 4
  fun(jnp.ones(4), 1.0, scale=2)  # in memory still
  assert len(TRACES) == 4


def test_the_environment_read_while_tracing_is_part_of_the_key(store, monkeypatch):
  """`use_cacheable_cpu_sorts` is read at trace time from the environment: a program traced
  with it off is not the one loaded with it on."""
  assert _ranking.CACHEABLE_SORTS_ENV in program_store.TRACED_ENVIRONMENT
  _fresh()(jnp.ones(3), 1.0, scale=1)
  monkeypatch.setenv("CALIB_JAX_OTHER", "1")  # not read while tracing: the same program
  _fresh()(jnp.ones(3), 1.0, scale=1)
  assert len(TRACES) == 1
  monkeypatch.setenv(_ranking.CACHEABLE_SORTS_ENV, "1")
  _fresh()(jnp.ones(3), 1.0, scale=1)
  assert len(TRACES) == 2 and len(_entries(store)) == 2


def test_calls_inside_a_trace_are_staged_as_jax_jit_does(store):
  fun = _fresh()
  out = jax.jit(lambda x: fun(x, 2.0, scale=1)["sum"])(jnp.ones(3))
  batched = jax.vmap(lambda x: fun(x, 2.0, scale=1)["max"])(jnp.ones((2, 3)))
  assert float(out) == pytest.approx(6 * np.e) and batched.shape == (2,)
  assert not _entries(store)


def test_under_disable_jit_it_runs_op_by_op_as_jax_jit_does(store):
  with jax.disable_jit():
    got = _fresh()(jnp.arange(4.0), 2.0, scale=1)
  assert float(got["max"]) == 3.0 and not _entries(store)


def test_static_arguments_without_a_name_are_compiled_not_kept(store):
  @functools.partial(program_store.jit, static_argnames="fn")
  def apply(x, fn):
    return fn(x)

  np.testing.assert_allclose(apply(jnp.ones(2), fn=lambda v: v + 1), [2.0, 2.0])
  assert not _entries(store)
  np.testing.assert_allclose(apply(jnp.ones(2), fn=jnp.exp), [np.e, np.e], rtol=1e-6)
  assert len(_entries(store)) == 1  # a named module-level function is kept


def test_a_damaged_entry_is_compiled_again_and_rewritten(store):
  want = _fresh()(jnp.arange(3.0), 1.0, scale=1)["sum"]
  (entry,) = store.iterdir()
  entry.write_bytes(entry.read_bytes()[:100])
  got = _fresh()(jnp.arange(3.0), 1.0, scale=1)["sum"]
  assert float(got) == float(want) and len(TRACES) == 2
  assert _fresh()(jnp.arange(3.0), 1.0, scale=1)["sum"] == want and len(TRACES) == 2


def test_programs_with_host_callbacks_are_not_kept(store):
  @program_store.jit
  def with_callback(x):
    return jax.pure_callback(np.sort, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

  np.testing.assert_array_equal(with_callback(jnp.array([3.0, 1.0, 2.0])), [1.0, 2.0, 3.0])
  assert not _entries(store)


def test_without_the_variable_it_is_jax_jit(tmp_path, monkeypatch):
  monkeypatch.delenv(program_store.ENV, raising=False)
  TRACES.clear()
  fun = _fresh()
  fun(jnp.ones(3), 1.0, scale=1)
  fun(jnp.ones(3), 1.0, scale=1)
  assert TRACES == [1]
  assert fun.lower(jnp.ones(3), 1.0, scale=1).compile() is not None  # jax.jit's own API


def test_the_programs_switch_it_on_beside_their_compilation_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(compilation_cache.PROGRAM_STORE_ENV, "")  # restored after the test
  assert compilation_cache.PROGRAM_STORE_ENV == program_store.ENV
  path = compilation_cache.enable()
  assert os.environ[program_store.ENV] == os.path.join(path, "programs")
