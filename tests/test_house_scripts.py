"""The programs beside the package (bench/, crosscheck/, studies/) follow one convention: absl
flags, run by `app.run`, and real imports (no `sys.path` edits); the studies import each other
without cycles."""
import ast
import glob
import os

from python_source import parse_files  # parsed in a child process: a 3.11 ast.parse race
from test_house_imports import _cycle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("bench", "crosscheck", "studies")
SCRIPTS = sorted(p for folder in FOLDERS
                 for p in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True))


def _trees():
  return dict(zip((os.path.relpath(p, ROOT) for p in SCRIPTS), parse_files(tuple(SCRIPTS))))


def _imported(tree):
  """Every module name an `import` / `from ... import` of `tree` names (absolute imports)."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level:
      yield node.module
      yield from (f"{node.module}.{a.name}" for a in node.names)


def _main_block(tree):
  """The body of `if __name__ == "__main__":`, or None."""
  for node in tree.body:
    if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
      return node.body
  return None


def test_every_program_uses_absl_and_real_imports():
  assert len(SCRIPTS) > 20, "the glob missed the folders"
  problems, programs = [], 0
  for rel, tree in _trees().items():
    if "argparse" in set(_imported(tree)):
      problems.append(f"{rel}: imports argparse (the programs take absl flags)")
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and node.attr == "path"
          and isinstance(node.value, ast.Name) and node.value.id == "sys"):
        problems.append(f"{rel}:{node.lineno}: touches sys.path (import the module instead)")
    body = _main_block(tree)
    if body is None:
      continue
    programs += 1
    calls = [ast.unparse(n) for n in body if isinstance(n, ast.Expr)]
    if calls != ["app.run(main)"]:
      problems.append(f"{rel}: the __main__ block is {calls}, not app.run(main)")
  assert programs >= 11, "fewer programs than bench/ and studies/ hold"
  assert not problems, "\n".join(problems)


def test_the_studies_import_each_other_without_cycles():
  graph = {}
  for rel, tree in _trees().items():
    if rel.startswith("studies"):
      module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
      graph[module] = set(_imported(tree))
  graph = {m: {n for n in names if n in graph and n != m} for m, names in graph.items()}
  assert "studies.lr_table1.summaries" in graph["studies.lr_table1.report"]
  assert _cycle(graph) is None, " -> ".join(_cycle(graph))
