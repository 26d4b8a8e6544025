"""The suite's own rules (tests/conftest.py, the Makefile): a test that asserts two different
compiled programs give the same bits runs only under XLA:CPU's default emitters."""
import os
import re

import pytest

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "exact_across_programs"
MARKED = "mark." + MARK  # built, so that this file is not one of the files that mark a test


class _Item:
  """What `pytest_collection_modifyitems` reads of a collected test."""

  def __init__(self, nodeid: str, exact: bool):
    self.nodeid = nodeid
    self.path = type("Path", (), {"stem": nodeid.split("::")[0]})()
    self._exact = exact

  def get_closest_marker(self, name):
    return object() if name == "exact_across_programs" and self._exact else None


def test_the_fast_compiler_refuses_to_collect_a_test_of_bits_across_programs(monkeypatch):
  items = [_Item("test_a::test_quick", False), _Item("test_b::test_scan_is_k_calls", True)]
  monkeypatch.setattr(conftest, "FUSION_EMITTERS_OFF", True)
  with pytest.raises(pytest.UsageError,
                     match=r"^1 tests marked exact_across_programs \(the first: "
                           r"test_b::test_scan_is_k_calls\) need XLA's default CPU emitters, "
                           r"and XLA_FLAGS has --xla_cpu_use_fusion_emitters=false"):
    conftest.pytest_collection_modifyitems(list(items))
  conftest.pytest_collection_modifyitems(items[:1])  # without it: collected, nothing raised
  monkeypatch.setattr(conftest, "FUSION_EMITTERS_OFF", False)
  conftest.pytest_collection_modifyitems(list(items))  # the default emitters run it


def test_make_test_runs_the_marked_tests_in_a_pass_of_their_own():
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    recipe = f.read().split("\ntest:", 1)[1].split("\n\n", 1)[0]
  # The recipe's shell commands: its lines joined, split at `;` and at `&` (not `&&`, `2>&1`).
  commands = re.split(r";|(?<![&>])&(?![&>])", recipe.replace("\\\n", " "))
  passes = [command.strip() for command in commands if "pytest" in command]
  fast = [p for p in passes if "CALIB_JAX_TESTS_COMPILER=fast" in p]
  exact = [p for p in passes if re.search(r"-m exact_across_programs\b", p)]
  assert len(fast) == 1 and '-m "not exact_across_programs"' in fast[0]
  assert len(exact) == 1 and "CALIB_JAX_TESTS_COMPILER" not in exact[0]
  # The second pass and the dry-run tests take only the CPU that the first pass leaves.
  assert exact[0].startswith("nice -n 19 ")
  assert [p for p in passes if "test_dry_run.py" in p and "nice -n 19 " in p]
  # The second pass collects the files that mark such a test (grep finds every one of them).
  assert "$(EXACT_FILES)" in exact[0]
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    assert f"EXACT_FILES = $(shell grep -l '{MARKED}' tests/test_*.py)" in f.read()


def test_xla_flags_a_user_set_win_and_merging_twice_changes_nothing():
  ours = "--xla_force_host_platform_device_count=8 " + conftest.FAST_COMPILE_FLAGS
  merged = conftest.merged_xla_flags("--xla_cpu_use_fusion_emitters=true --xla_dump_to=/d", ours)
  assert merged.split()[:2] == ["--xla_cpu_use_fusion_emitters=true", "--xla_dump_to=/d"]
  assert "--xla_cpu_use_fusion_emitters=false" not in merged.split()
  assert "--xla_force_host_platform_device_count=8" in merged.split()
  assert conftest.merged_xla_flags(merged, ours) == merged
  assert conftest.merged_xla_flags("", ours) == ours


def test_the_flags_in_effect_are_what_the_started_programs_get():
  in_effect = os.environ["XLA_FLAGS"].split()
  given = os.environ["CALIB_JAX_TESTS_COMPILE_FLAGS"].split()
  assert given and all(f in in_effect for f in given)
  assert conftest.FUSION_EMITTERS_OFF == ("--xla_cpu_use_fusion_emitters=false" in given)
