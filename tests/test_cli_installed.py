"""The installed package, away from the source checkout: a wheel built from this checkout holds
what the installed commands need (the recipes, the entry points), and, unpacked as pip installs
it, the installed commands run from another directory (the demo for a few steps).

The wheel is built by pip (with build isolation, as a user's `pip install .` builds it) from a
copy of the package's files, so the checkout gets no build/ or .egg-info. The unpacked wheel is
put first on PYTHONPATH, ahead of the test environment's editable install of the checkout; each
check asserts that `calib_jax` was imported from the wheel.
"""
import configparser
import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from fixtures import forked_programs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"calib-jax-train", "calib-jax-eval", "calib-jax-demo", "calib-jax-dry-run"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
  source = tmp_path_factory.mktemp("source")
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), source)
  shutil.copytree(os.path.join(ROOT, "calib_jax"), source / "calib_jax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  out = tmp_path_factory.mktemp("dist")
  built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                          str(out), str(source)], capture_output=True, text=True, check=False)
  assert built.returncode == 0, built.stderr[-2000:]
  (path,) = glob.glob(str(out / "calib_jax-*.whl"))
  return path


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> str:
  """The wheel unpacked as pip lays it into site-packages."""
  target = tmp_path_factory.mktemp("site")
  with zipfile.ZipFile(wheel) as archive:
    archive.extractall(target)
  return str(target)


def _entry_points(wheel: str) -> dict[str, str]:
  with zipfile.ZipFile(wheel) as archive:
    (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(archive.read(name).decode())
  return dict(parser["console_scripts"])


def test_the_wheel_holds_the_recipes_and_the_entry_points(wheel):
  with zipfile.ZipFile(wheel) as archive:
    names = set(archive.namelist())
  recipes = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "calib_jax",
                                                                      "configs", "*.py"))}
  assert "calib_jax/configs/default.py" in recipes and len(recipes) > 10
  assert recipes <= names, sorted(recipes - names)
  assert {"calib_jax/cli/train.py", "calib_jax/cli/evaluate.py", "calib_jax/demo.py",
          "calib_jax/dry_run/__main__.py"} <= names
  # Nothing outside the package: no tests, studies or benchmarks in the wheel.
  assert not [n for n in names if n.split("/")[0] in ("tests", "studies", "bench", "configs")]
  entry_points = _entry_points(wheel)
  assert set(entry_points) == SCRIPTS
  for target in entry_points.values():
    module, function = target.split(":")
    assert f"{module.replace('.', '/')}.py" in names, target
    assert f"def {function}(" in zipfile.ZipFile(wheel).read(
        f"{module.replace('.', '/')}.py").decode(), target


# The demo's recipe: the packaged one (read from the wheel), with 50 bootstrap resamples of the
# report's intervals instead of 1000, as every test's config (tests/test_run_loop.tiny_config):
# the resamples are most of the evaluation's time and the test asserts what the demo writes.
DEMO_RECIPE = """
from calib_jax import config as config_lib
from calib_jax import demo
from calib_jax.config import variants

VARIANTS = config_lib.load_config_module(demo.DEFAULT_CONFIG).VARIANTS

def get_config(arg=None):
  config = config_lib.load_config_file(demo.DEFAULT_CONFIG + ":" + (arg or "ce"))
  assert config_lib.__file__.startswith(%r), config_lib.__file__
  return variants.override(config, {"eval.bootstrap_samples": 50})
"""


@pytest.fixture(scope="module")
def installed_runs(wheel, site, tmp_path_factory):
  """The installed commands run from a temporary directory, each a child forked from one
  process that imported the wheel's package once (tests/fixtures/forked_programs.py): what
  pip's console-script wrapper does (import the entry point, call it with argv), in place of a
  whole start each. calib-jax-train and calib-jax-eval with a packaged recipe, calib-jax-train
  with a missing one, then calib-jax-demo for a few steps. {"commands": their 3 processes,
  "demo": (its process, the directory it ran in)}."""
  cwd = tmp_path_factory.mktemp("elsewhere")
  (cwd / "recipe.py").write_text(DEMO_RECIPE % site)
  entry_points = _entry_points(wheel)
  runs = [(entry_points[script], [script, "--config=configs/default.py:mbls", "--config.seed=3"])
          for script in ("calib-jax-train", "calib-jax-eval")]
  runs.append((entry_points["calib-jax-train"],
               ["calib-jax-train", "--config=configs/nope.py", f"--workdir={cwd}/w"]))
  runs.append((entry_points["calib-jax-demo"],
               ["calib-jax-demo", "--workdir=demo", "--variants=ce", "--num_train_steps=5",
                f"--config={cwd / 'recipe.py'}"]))
  # 10 minutes for the commands, 10 for the demo, as each had before they shared a start.
  done = forked_programs.run_programs(runs, cwd=str(cwd), env={**os.environ, "PYTHONPATH": site},
                                      timeout=1200)
  assert done[0].calib_jax_file.startswith(site), done[0].calib_jax_file
  return {"commands": done[:3], "demo": (done[3], cwd)}


def test_installed_commands_find_their_packaged_recipes_from_any_directory(installed_runs):
  done = installed_runs["commands"]
  for run in done[:2]:
    # `--config=configs/default.py` does not exist here: it is read from the package, with its
    # variant and an override; the command then stops at the first thing it lacks.
    assert run.returncode == 1 and "--workdir is required" in run.stdout + run.stderr, (
        run.stdout + run.stderr)
  assert done[2].returncode == 1 and "nope.py" in done[2].stderr
  assert len(done[2].stderr.strip().splitlines()) == 1, done[2].stderr


def test_installed_demo_trains_a_few_steps_from_a_temporary_directory(installed_runs):
  done, cwd = installed_runs["demo"]
  assert done.returncode == 0, done.stderr[-3000:]
  assert "[ce] trained in" in done.stdout and "CE" in done.stdout
  assert (cwd / "demo" / "summary.json").is_file()
  assert (cwd / "demo" / "reliability.png").is_file()
  assert (cwd / "demo" / "ce" / "eval_test" / "metrics.json").is_file()
