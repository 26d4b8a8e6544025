"""The README and docs/*.md as a newcomer uses them: code that runs, commands that exist, links
that resolve.

* Every ```python block of README.md and docs/*.md runs; a file's blocks run in order in one
  namespace (as a reader pastes them), from a temporary directory that holds a link to
  `configs/`. A block preceded by a `<!-- docs-test: skip <reason> -->` line does not run; the
  skips are counted, so a new one is a deliberate change of `EXPECTED_SKIPS`.
* Every command line of the ```sh / ```bash / ```console blocks that runs `train.py`,
  `eval.py`, a `bench/` script, `python -m calib_jax.<module>`, `python -m studies.<study>` or
  `make <target>` is checked
  without running it: the script, module or target exists, every flag is one the program
  defines, `--config=file.py:variant` loads, each `--config.field=value` names a field of that
  config and takes its value, and the result passes `experiment.build` (files the
  command names, such as weight files, may be missing).
* Every relative link and image of README.md, BENCHMARKS.md and docs/**/*.md points to an
  existing file, and every `#anchor` to a heading of its target (GitHub's anchor rules).
"""
import ast
import glob
import os
import re
import shlex

import jax
import pytest

from python_source import parse_file  # parsed in a child process: a 3.11 ast.parse race

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_FILES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                   for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK_FILES = (["README.md", "BENCHMARKS.md"]
              + sorted(os.path.relpath(p, ROOT)
                       for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)))
# Blocks that cannot run offline in seconds (a downloaded weight file, a real training run).
EXPECTED_SKIPS = 3
SKIP_MARKER = re.compile(r"^<!-- docs-test: skip (?P<reason>\S.*?) -->$")
SHELL_LANGS = ("sh", "bash", "console", "shell")


def _read(rel: str) -> str:
  with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
    return f.read()


def fenced_blocks(text: str) -> list[dict]:
  """Fenced code blocks: `lang`, `code`, `line` (1-based line of the first code line) and the
  `skip` reason of a marker on the line right before the fence (None without one)."""
  blocks, lines, i = [], text.split("\n"), 0
  while i < len(lines):
    match = re.match(r"^(`{3,})(\S*)\s*$", lines[i])
    if not match:
      i += 1
      continue
    fence, lang, start = match.group(1), match.group(2), i + 1
    end = start
    while end < len(lines) and not lines[end].startswith(fence):
      end += 1
    marker = SKIP_MARKER.match(lines[i - 1]) if i > 0 else None
    blocks.append({"lang": lang, "code": "\n".join(lines[start:end]), "line": start + 1,
                   "skip": marker.group("reason") if marker else None})
    i = end + 1
  return blocks


def prose(text: str, inline_code: bool = False) -> str:
  """`text` without fenced blocks, and without inline code spans unless `inline_code` (code
  holds no links; headings keep theirs)."""
  out, in_fence = [], None
  for line in text.split("\n"):
    match = re.match(r"^(`{3,})", line)
    if in_fence:
      if line.startswith(in_fence):
        in_fence = None
      out.append("")
      continue
    if match:
      in_fence = match.group(1)
      out.append("")
      continue
    out.append(line)
  text = "\n".join(out)
  return text if inline_code else re.sub(r"(`+)(?:(?!\1).)+?\1", "", text)


# --------------------------------------------------------------------------- python blocks


@pytest.fixture(scope="module", autouse=True)
def quick_rng_compilation():
  """Non-partitionable threefry compiles model initialisation ~5x faster on CPU (as in
  test_run_loop.py); the snippets print no random values that depend on it."""
  previous = jax.config.jax_threefry_partitionable
  jax.config.update("jax_threefry_partitionable", False)
  yield
  jax.config.update("jax_threefry_partitionable", previous)


def test_skip_markers_are_counted():
  """Skips are rare and deliberate: each names its reason and precedes a python block."""
  skips = []
  for rel in RUN_FILES:
    text = _read(rel)
    markers = [n for n, line in enumerate(text.split("\n"), 1)
               if line.startswith("<!-- docs-test:")]
    blocks = [b for b in fenced_blocks(text) if b["skip"]]
    assert len(markers) == len(blocks), f"{rel}: a docs-test marker not right before a fence"
    for b in blocks:
      assert b["lang"] == "python", f"{rel}:{b['line']}: skip marker on a {b['lang']!r} block"
      skips.append(f"{rel}:{b['line']}: {b['skip']}")
  assert len(skips) == EXPECTED_SKIPS, "\n".join(skips)


def _python_blocks(rel):
  return [b for b in fenced_blocks(_read(rel)) if b["lang"] == "python" and not b["skip"]]


@pytest.mark.parametrize("rel", [rel for rel in RUN_FILES if _python_blocks(rel)])
def test_python_blocks_run(rel, tmp_path, monkeypatch):
  blocks = _python_blocks(rel)
  os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
  monkeypatch.chdir(tmp_path)
  namespace = {"__name__": "__docs__"}
  for block in blocks:
    # Padding keeps tracebacks on the markdown file's own line numbers.
    code = compile("\n" * (block["line"] - 1) + block["code"], os.path.join(ROOT, rel), "exec")
    exec(code, namespace)  # pylint: disable=exec-used


# --------------------------------------------------------------------------- shell commands


def _defined_flags(path: str) -> dict[str, list | None]:
  """`{name: enum values or None}` of the absl flags `path` defines (DEFINE_*("name", ...))."""
  found = {}
  for node in ast.walk(parse_file(os.path.join(ROOT, path))):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("DEFINE_") and node.args
        and isinstance(node.args[0], ast.Constant)):
      values = None
      if node.func.attr == "DEFINE_enum" and len(node.args) > 2:
        values = ast.literal_eval(node.args[2])
      found[node.args[0].value] = values
  return found


def _absl_flags() -> set[str]:
  """Flags every absl program accepts (logging's --verbosity/-v, --alsologtostderr, ...)."""
  from absl import app, flags, logging  # noqa: F401  (importing defines their flags)
  names = set()
  for module in ("absl.logging", "absl.app", "absl.flags"):
    for flag in flags.FLAGS.get_flags_for_module(module):
      names.update({flag.name, flag.short_name} - {None})
  return names | {"helpfull", "helpshort", "flagfile", "undefok"}


# Where each program's own flags are defined (the repository's train.py / eval.py only run them).
PROGRAM_SOURCES = {"train.py": "calib_jax/cli/train.py", "eval.py": "calib_jax/cli/evaluate.py"}


def _program_flags(script: str) -> dict[str, list | None]:
  flags = {name: None for name in _absl_flags()}
  flags.update(_defined_flags("calib_jax/cli/flags.py"))
  flags.update(_defined_flags(PROGRAM_SOURCES[script]))
  return flags


def _logical_lines(code: str) -> list[tuple[int, str]]:
  """Lines with backslash continuations joined, comments and console prompts removed."""
  lines, pending, first = [], "", 0
  for n, raw in enumerate(code.split("\n")):
    line = re.sub(r"^\s*\$ ", "", raw)
    if not pending:
      first = n
    if line.rstrip().endswith("\\"):
      pending += line.rstrip()[:-1] + " "
      continue
    lines.append((first, pending + line))
    pending = ""
  out = []
  for n, line in lines:
    line = re.sub(r"(^|\s)#.*$", "", line)  # a comment starts at a '#' after a space
    if line.strip():
      out.append((n, line))
  return out


PYTHON_RUN = re.compile(r"(?:^|[\s\"'])(?:\S*/)?python3?\s+(?P<rest>.*)$")
MAKE_RUN = re.compile(r"(?:^|\s)make\s+(?P<target>[\w-]+)")


def shell_commands() -> list[tuple[str, str, list[str]]]:
  """`(where, kind, argv)` for each command of the shell blocks; kind is 'python' or 'make'."""
  commands = []
  for rel in RUN_FILES:
    for block in fenced_blocks(_read(rel)):
      if block["lang"] not in SHELL_LANGS:
        continue
      for n, line in _logical_lines(block["code"]):
        where = f"{rel}:{block['line'] + n}"
        # Separators outside double quotes (`--config.sweep="a=1,2;seed=0,1"` is one argument).
        for segment in re.split(r'(?:&&|\|\||;|\|)(?=(?:[^"]*"[^"]*")*[^"]*$)', line):
          match = PYTHON_RUN.search(segment)
          if match:
            rest = re.sub(r'="([^"]*)"', r"=\1", match.group("rest"))  # --flag="a b" -> one
            rest = rest.replace('"', " ").replace("'", " ")
            argv = [a.strip("[]") for a in shlex.split(rest)]
            commands.append((where, "python", argv))
          for make in MAKE_RUN.finditer(segment):
            commands.append((where, "make", [make.group("target")]))
  return commands


def _make_targets() -> set[str]:
  return set(re.findall(r"^([\w-]+)\s*:", _read("Makefile"), re.M))


def _parse_value(text: str, current):
  """The command-line value as ml_collections' config flags would read it."""
  if isinstance(current, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"{text!r} is not a bool")
    return text.lower() in ("true", "1")
  if isinstance(current, int):
    return int(text)
  if isinstance(current, float):
    return float(text)
  if isinstance(current, (tuple, list)):
    return tuple(ast.literal_eval(text))
  return text


def _check_train_eval(script: str, args: list[str]) -> list[str]:
  """Problems of a `python train.py|eval.py ARGS` line (nothing is run)."""
  from calib_jax import config as config_lib
  from calib_jax import experiment
  from calib_jax.config import variants

  problems, flags = [], _program_flags(script)
  spec, overrides, i = "configs/default.py", [], 0
  while i < len(args):
    arg = args[i]
    i += 1
    if not arg.startswith("-"):
      problems.append(f"unexpected argument {arg!r}")
      continue
    name, has_value, value = arg.lstrip("-").partition("=")
    if name.startswith("config."):
      overrides.append((name[len("config."):], value))
      continue
    if name not in flags and not (name.startswith("no") and name[2:] in flags):
      problems.append(f"{script} has no flag --{name}")
      continue
    if not has_value and name in ("v", "verbosity", "split", "step", "weights", "workdir",
                                  "config") and i < len(args):
      value, i = args[i], i + 1  # `-v 0`
    if flags.get(name) and value not in flags[name]:
      problems.append(f"--{name}={value}: not one of {flags[name]}")
    if name == "config":
      spec = value
  if spec.startswith("..."):
    return problems  # a placeholder: `--config=...`
  path = spec.partition(":")[0]
  if not os.path.isfile(os.path.join(ROOT, path)):
    return problems + [f"no config file {path}"]
  try:
    config = config_lib.load_config_file(os.path.join(ROOT, spec))
  except (ValueError, config_lib.ConfigError) as e:
    return problems + [f"--config={spec}: {e}"]
  paths = []
  for dotted, value in overrides:
    message = config_lib.unknown_field_message(config, dotted)
    if message:
      problems.append(f"--config.{dotted}: {message}")
      continue
    node = config
    for part in dotted.split("."):
      node = node[part]
    try:
      variants.override(config, {dotted: _parse_value(value, node)})
    except (ValueError, TypeError, SyntaxError) as e:
      problems.append(f"--config.{dotted}={value}: {e}")
    if "/" in value or re.search(r"\.\w+$", value):
      paths.append(value)
  try:
    experiment.build(config, devices=jax.devices()[:1])
  except config_lib.ConfigError as e:
    for line in str(e).splitlines()[1:]:
      # Files the command names (weights it was told to produce elsewhere) may be absent here.
      if not any(p in line and "does not exist" in line for p in paths):
        problems.append(f"validate: {line.strip()}")
  return problems


def _check_other_python(argv: list[str]) -> list[str]:
  """`python -m module ...`, `python bench/x.py ...`: the program exists and has the flags."""
  if argv[0] == "-m":
    module, args = argv[1], argv[2:]
    if module == "pytest":
      return [f"no test file {a}" for a in args
              if a.endswith(".py") and not os.path.isfile(os.path.join(ROOT, a))]
    source = os.path.join(*module.split(".")) + ".py"
    package_main = os.path.join(*module.split("."), "__main__.py")
    if not os.path.isfile(os.path.join(ROOT, source)) and os.path.isfile(
        os.path.join(ROOT, package_main)):
      source = package_main  # `python -m package` runs its __main__
  else:
    source, args = argv[0], argv[1:]
  if not os.path.isfile(os.path.join(ROOT, source)):
    return [f"no program {source}"]
  text, problems = _read(source), []
  for arg in args:
    if not arg.startswith("-"):
      continue
    name = arg.split("=")[0]
    bare = name.lstrip("-")
    if (bare == "config" or bare.startswith("config.")) and "cli_flags.define(" in text:
      continue  # the shared --config flag of calib_jax.cli.flags
    defined = (f'"{name}"' in text or f"'{name}'" in text
               or re.search(rf"DEFINE_\w+\(\s*[\"']{re.escape(bare)}[\"']", text))
    if not defined:
      problems.append(f"{source} has no flag {name}")
  if source == "calib_jax/demo.py":
    from calib_jax import config as config_lib
    valid = config_lib.load_config_module(os.path.join(ROOT, "configs/default.py")).VARIANTS
    for arg in args:
      if arg.startswith("--variants="):
        problems += [f"demo: no variant {v}" for v in arg.split("=", 1)[1].split(",")
                     if v and v not in valid]
  return problems


def test_shell_commands_name_real_programs_configs_and_flags():
  commands = shell_commands()
  programs = {argv[0] for _, _, argv in commands if argv}
  assert {"train.py", "eval.py", "test", "demo"} <= programs, "the parser missed commands"
  targets, problems = _make_targets(), []
  for where, kind, argv in commands:
    if kind == "make":
      if argv[0] not in targets:
        problems.append(f"{where}: make {argv[0]}: no such target in the Makefile")
      continue
    if argv and argv[0] in ("train.py", "eval.py"):
      found = _check_train_eval(argv[0], argv[1:])
    elif argv:
      found = _check_other_python(argv)
    else:
      found = ["python with no program"]
    problems += [f"{where}: {p}" for p in found]
  assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- links


def github_anchor(heading: str) -> str:
  """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
  text = text.replace("`", "").strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(rel: str) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  for line in prose(_read(rel), inline_code=True).split("\n"):
    match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if not match:
      continue
    base = github_anchor(match.group(1))
    count = seen.get(base, 0)
    seen[base] = count + 1
    out.add(base if count == 0 else f"{base}-{count}")
  return out


def test_anchor_rules():
  assert github_anchor("Losses — `calib_jax.losses`") == "losses--calib_jaxlosses"
  assert github_anchor("`ce`: cross-entropy") == "ce-cross-entropy"
  assert github_anchor("Label relaxation Table 1 on Fashion-MNIST (in progress)") == (
      "label-relaxation-table-1-on-fashion-mnist-in-progress")


LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@pytest.mark.parametrize("rel", LINK_FILES)
def test_links_and_anchors_resolve(rel):
  problems = []
  for target in LINK.findall(prose(_read(rel))):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(rel), path)) if path else (
        os.path.join(ROOT, rel))
    if not os.path.exists(resolved):
      problems.append(f"{target}: no file {os.path.relpath(resolved, ROOT)}")
      continue
    if anchor:
      if not resolved.endswith(".md"):
        problems.append(f"{target}: anchor into a file that is not markdown")
      elif anchor not in anchors(os.path.relpath(resolved, ROOT)):
        problems.append(f"{target}: no heading with anchor #{anchor}")
  assert not problems, f"{rel}:\n" + "\n".join(problems)


def test_feature_table_links_every_loss_metric_and_dataset():
  """Every loss, metric and dataset of the library is one click away on the front page."""
  from calib_jax import data, losses, metrics, posthoc

  readme = _read("README.md")
  linked = set()
  for text, target in re.findall(r"\[([^\]]+)\]\((docs/[^)]+#[^)]+)\)", readme):
    linked.update(re.findall(r"`(\w+)`", text))
  wanted = set(losses.names()) | set(data.names()) | set(metrics.__all__)
  wanted -= {"bin_index", "confidence_and_correct", "ReliabilityBins",  # building blocks
             "use_cacheable_cpu_sorts"}  # a setting (docs/metrics.md#speed), not a metric
  wanted |= {name for name, value in vars(posthoc).items()
             if callable(value) and not name.startswith("_")
             and getattr(value, "__module__", "").startswith(posthoc.__name__)}
  missing = sorted(wanted - linked)
  assert not missing, f"README feature table lacks a link for {missing}"


def test_no_two_docs_files_share_a_name():
  """A reader (and a link) told "shift.md" finds one file: the docs, the study reports under
  docs/results and the top-level pages have distinct file names."""
  paths = (glob.glob(os.path.join(ROOT, "*.md"))
           + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  by_name = {}
  for path in paths:
    by_name.setdefault(os.path.basename(path), []).append(os.path.relpath(path, ROOT))
  shared = {name: sorted(where) for name, where in by_name.items() if len(where) > 1}
  assert not shared, f"docs files that share a name: {shared}"


def test_readme_is_a_front_page():
  assert len(_read("README.md").splitlines()) <= 250
  assert "Status:" in _read("README.md")  # the LR Table 1 status line a person updates



def test_code_references_to_conventions_resolve():
  """Docstrings and comments cite sections of docs/conventions.md by anchor; each must exist."""
  sections = anchors("docs/conventions.md")
  files = [os.path.join(ROOT, name) for name in ("train.py", "eval.py")]
  for folder in ("calib_jax", "tests", "bench", "configs"):
    files += glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
  cited, problems = 0, []
  for path in files:
    if not os.path.exists(path):
      continue
    for anchor in re.findall(r"docs/conventions\.md#([\w-]+)", _read(path)):
      cited += 1
      if anchor not in sections:
        problems.append(f"{os.path.relpath(path, ROOT)}: no section #{anchor}")
  assert cited > 0 and not problems, "\n".join(problems)
