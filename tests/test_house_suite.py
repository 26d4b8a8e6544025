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
  monkeypatch.setattr(conftest, "COMPILER", "fast")
  with pytest.raises(pytest.UsageError,
                     match=r"^1 tests marked exact_across_programs \(the first: "
                           r"test_b::test_scan_is_k_calls\) need XLA's default CPU emitters"):
    conftest.pytest_collection_modifyitems(list(items))
  conftest.pytest_collection_modifyitems(items[:1])  # without it: collected, nothing raised
  monkeypatch.setattr(conftest, "COMPILER", "default")
  conftest.pytest_collection_modifyitems(list(items))  # the default emitters run it


def test_make_test_runs_the_marked_tests_in_a_pass_of_their_own():
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    recipe = f.read().split("\ntest:", 1)[1].split("\n\n", 1)[0]
  passes = [line for line in recipe.replace("\\\n", " ").splitlines() if "pytest" in line]
  fast = [p for p in passes if "CALIB_JAX_TESTS_COMPILER=fast" in p]
  exact = [p for p in passes if re.search(r"-m exact_across_programs\b", p)]
  assert len(fast) == 1 and '-m "not exact_across_programs"' in fast[0]
  assert len(exact) == 1 and "CALIB_JAX_TESTS_COMPILER" not in exact[0]
  # The second pass collects the files that mark such a test (grep finds every one of them).
  assert "$(EXACT_FILES)" in exact[0]
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    assert f"EXACT_FILES = $(shell grep -l '{MARKED}' tests/test_*.py)" in f.read()
