"""How fast this machine is right now, in three fixed workloads (not a test): the numbers to print
beside a benchmark or a suite time taken on another day.

The 2-core CPU VM this project is measured on has run the same code up to 1.5x slower at one
time than at another with nothing else running on it (a fresh clone's `make test` took 744-838 s
in the small hours of 2026-11-28 and 533 s at 05:00 on nearly the same code; `eval.py
--predictions` on 50,000 x 1,000 30.5-33.0 s, then 22.0 s): an "idle" number means little
without this probe beside it. The VM is not always on the same kind of host either (an AMD
EPYC with AVX2 on 2026-11-23, an Intel Xeon with AVX-512 and 300 MiB of L3 on 2026-11-28): the
line ends with the CPU's model and its L3 as the kernel reports them. Each workload is timed
`--repeats` times; the minimum is printed:

* `python`: a pure-Python loop (the host side of a run: tracing, pytest, argument parsing);
* `numpy`: float32 matrix products on one thread (the arithmetic of a run on XLA:CPU);
* `compile`: XLA compiling a fixed 60-op jitted function afresh (what most tests spend).

  python bench/machine_speed.py            # about 10 s
"""
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: the per-core speed
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from common import cpu_models, l3_size  # noqa: E402  (bench/ is the script's folder)

_REPEATS = flags.DEFINE_integer("repeats", 3, "times each workload runs; the minimum is printed")


def _python_loop() -> None:
  total = 0
  for i in range(20_000_000):
    total += i % 7
  assert total > 0


def _numpy_products() -> None:
  a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
  for _ in range(40):
    a = np.tanh(a @ a * 1e-2)


def _compile(salt: int) -> None:
  def chain(x):
    for i in range(60):
      x = jnp.sin(x) * (i + 1 + salt) + jnp.cumsum(x, axis=-1)
    return x.sum()
  # A fresh function (its constants salted) each time: traced, lowered and compiled, never cached.
  jax.jit(chain).lower(jnp.zeros((8, 128))).compile()


def _best(fn, repeats: int, *args) -> float:
  seconds = []
  for r in range(repeats):
    start = time.perf_counter()
    fn(*args) if args else fn()
    seconds.append(time.perf_counter() - start)
  return min(seconds)


def main(argv):
  del argv
  jax.config.update("jax_enable_compilation_cache", False)
  repeats = _REPEATS.value
  compile_seconds = min(_best(_compile, 1, salt) for salt in range(repeats))
  load = " ".join(f"{x:.2f}" for x in os.getloadavg())
  print(f"machine speed (min of {repeats}): python {_best(_python_loop, repeats):.2f} s, "
        f"numpy {_best(_numpy_products, repeats):.2f} s, compile {compile_seconds:.2f} s; "
        f"1-min load {load}; {os.cpu_count()} x {(cpu_models() or ['?'])[0]}, L3 {l3_size()}")


if __name__ == "__main__":
  app.run(main)
