"""The package has no import cycles (deferred imports inside functions included), and the
training loop and the evaluation program never import each other."""
import ast
import os

from python_source import parse_files  # parsed in a child process: a 3.11 ast.parse race

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "calib_jax")


def _module_name(path):
  rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
  return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _graph():
  modules = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        modules[_module_name(path)] = path
  graph = {}
  trees = dict(zip(modules, parse_files(tuple(modules.values()))))
  for module, path in modules.items():
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    edges = set()
    for node in ast.walk(trees[module]):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] +
                          ([base] if base else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
      else:
        continue
      edges |= {n for n in names if n in modules and n != module}
    graph[module] = edges
  return graph


def _cycle(graph):
  state = {}

  def visit(node, stack):
    state[node] = "open"
    for nxt in graph[node]:
      # A package's __init__ importing its own submodules is how packages expose them.
      if nxt.startswith(node + ".") or node.startswith(nxt + "."):
        continue
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
      if nxt not in state:
        found = visit(nxt, stack + [nxt])
        if found:
          return found
    state[node] = "done"
    return None

  for node in graph:
    if node not in state:
      found = visit(node, [node])
      if found:
        return found
  return None


def test_no_import_cycles():
  assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_loop_and_evaluation_do_not_import_each_other():
  """The loop uses the validation evaluator only; eval.py's report and the build pass never
  import the loop (both sides get what they need from `calib_jax.experiment`)."""
  graph = _graph()
  report = ("calib_jax.evaluation.report", "calib_jax.evaluation.run", "calib_jax.evaluation.maps")
  assert not set(report) & set(graph["calib_jax.run.loop"])
  for module in (*report, "calib_jax.evaluation.validation", "calib_jax.experiment.build",
                 "calib_jax.experiment.data"):
    assert "calib_jax.run.loop" not in graph[module], module


def _imported_modules(node):
  """Dotted names an import statement brings in (`from a import b`: `a` and `a.b`)."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  base = node.module or ""
  return [base] + [f"{base}.{a.name}" for a in node.names]


def _late_imports(tree):
  """(line, module) of every import inside a function body."""
  found = []
  for func in ast.walk(tree):
    if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for node in ast.walk(func):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          found += [(node.lineno, name) for name in _imported_modules(node)]
  return found


def test_models_import_the_models_package_at_module_level_only():
  """The cycle check skips a submodule's edge to its own package, so a late import of
  `calib_jax.models` inside it would hide a cycle: none of the models' modules has one."""
  folder = os.path.join(PACKAGE, "models")
  paths = tuple(os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".py"))
  late = [f"{os.path.relpath(path, ROOT)}:{line} imports {name}"
          for path, tree in zip(paths, parse_files(paths))
          for line, name in _late_imports(tree)
          if name == "calib_jax.models" or name.startswith("calib_jax.models.")]
  assert not late, "\n".join(late)
  assert _late_imports(ast.parse("def f():\n  from calib_jax import models\n")) == [
      (2, "calib_jax"), (2, "calib_jax.models")]


def test_the_cycle_check_finds_a_cycle():
  assert _cycle({"m.a": {"m.b"}, "m.b": {"m.c"}, "m.c": {"m.a"}}) is not None
  assert _cycle({"m.a": {"m.b"}, "m.b": set()}) is None


def _package_of(module: str) -> str:
  """'calib_jax.run.loop' -> 'run'; a top-level module ('calib_jax.demo') is its own package."""
  return module.split(".")[1] if module.count(".") >= 1 else module


def _package_edges():
  """{(importer package, imported package): [module -> module, ...]} over every import,
  function-level ones included."""
  edges = {}
  for module, imported in _graph().items():
    for other in imported:
      a, b = _package_of(module), _package_of(other)
      if a != b and module != "calib_jax" and other != "calib_jax":
        edges.setdefault((a, b), []).append(f"{module} -> {other}")
  return edges


def test_packages_import_one_way_only():
  """No two calib_jax packages import each other, counting function-level imports: the
  floors are config; data, losses, models, metrics; posthoc, conformal, plotting; sweep;
  training (the step's parts); experiment; evaluation; run; the programs (cli, demo,
  dry_run)."""
  edges = _package_edges()
  both = sorted(f"{a} <-> {b}: {edges[(a, b)][0]}; {edges[(b, a)][0]}"
                for (a, b) in edges if (b, a) in edges and a < b)
  assert not both, "\n".join(both)
  # The step's parts sit below everything that runs them.
  above_training = {"experiment", "evaluation", "sweep", "run", "cli", "dry_run", "demo"}
  assert not {b for (a, b) in edges if a == "training"} & above_training


def test_no_package_imports_another_packages_private_module():
  graph = _graph()
  private = sorted(f"{module} -> {other}" for module, imported in graph.items()
                   for other in imported
                   if other.rsplit(".", 1)[-1].startswith("_") and not other.endswith("__")
                   and _package_of(other) != _package_of(module))
  assert not private, "\n".join(private)


def test_no_module_is_over_400_lines():
  long = []
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
          lines = sum(1 for _ in f)
        if lines > 400:
          long.append(f"{os.path.relpath(path, ROOT)}: {lines} lines")
  assert not long, "\n".join(long)


# What an import inside a function may defer: heavy or optional dependencies (TensorFlow, torch,
# matplotlib, Pillow, scikit-learn, libtpu, the CUDA plugin, clu's TensorBoard writer); the
# modules of ours that import TensorFlow (data, experiment, evaluation, run), deferred by the
# programs until their console has imported it quietly; `calib_jax.plotting*` (matplotlib);
# JAX itself where a program chooses the platform first (the dry run, the compilation cache).
_DEFERRABLE = ("tensorflow", "tensorflow_datasets", "torch", "safetensors", "matplotlib",
               "sklearn", "PIL", "libtpu", "jax_cuda12_plugin", "jax.experimental.topologies",
               "jax._src", "clu", "jax", "calib_jax.data", "calib_jax.experiment",
               "calib_jax.evaluation", "calib_jax.run", "calib_jax.dry_run.measure",
               "calib_jax.dry_run.api",
               "calib_jax.plotting", "calib_jax.plotting_maps",
               # JAX's (and orbax/tensorstore's) native logging, started by the programs after
               # TensorFlow's log level is set
               "calib_jax.training.checkpoint", "calib_jax.training.reporting",
               "calib_jax.cli.run_config", "calib_jax.sweep")


def test_function_level_imports_defer_a_heavy_dependency_only():
  """Imports inside functions only where they defer TensorFlow, torch, matplotlib or another
  heavy optional dependency (directly, or a module of ours that imports it)."""
  modules = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        modules[os.path.join(folder, name)] = None
  paths = tuple(sorted(modules))
  late = []
  for path, tree in zip(paths, parse_files(paths)):
    found = _late_imports(tree)
    for line, name in found:
      if any(other.startswith(name + ".") for at, other in found if at == line):
        continue  # `from a import b` names `a.b` too: the deeper name is the one checked
      if not any(name == d or name.startswith(d + ".") for d in _DEFERRABLE):
        late.append(f"{os.path.relpath(path, ROOT)}:{line} imports {name}")
  assert not late, "\n".join(late)
