"""Parse Python files in a child interpreter, for tests that read the package's source.

CPython 3.11 keeps the counter that `ast.parse` uses to check its recursion bookkeeping in
one per-interpreter slot: when another thread of the test process (a data pipeline's, a
library's background thread) parses at the same moment, the check fails with
`SystemError: AST constructor recursion depth mismatch` (reproduced with two threads parsing
and a gc callback letting them switch; reported upstream as python/cpython#106905 and
pytest-dev/pytest#10763). A child process has no such threads, and the trees come back
pickled, which builds the nodes without that check.
"""
import ast
import functools
import pickle
import subprocess
import sys

_PARSE = ("import ast, pickle, sys\n"
          "trees = [ast.parse(open(p, encoding='utf-8').read(), p) for p in sys.argv[1:]]\n"
          "sys.stdout.buffer.write(pickle.dumps(trees))\n")


@functools.lru_cache(maxsize=None)
def parse_files(paths: tuple[str, ...]) -> tuple[ast.Module, ...]:
  """`ast.parse` of each file of `paths`, parsed in a child interpreter (see the module doc)."""
  done = subprocess.run([sys.executable, "-c", _PARSE, *paths], capture_output=True, check=False)
  if done.returncode:
    raise RuntimeError(f"parsing {len(paths)} files failed:\n{done.stderr.decode()}")
  return tuple(pickle.loads(done.stdout))


def parse_file(path: str) -> ast.Module:
  return parse_files((path,))[0]
