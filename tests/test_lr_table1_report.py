"""bench/lr_table1.py's bookkeeping on stand-in summaries: selection, run plan, report."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def study():
  spec = importlib.util.spec_from_file_location("lr_table1", os.path.join(ROOT, "bench",
                                                                         "lr_table1.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write(out_dir, study, variant, seed, **values):
  path = study.summary_path(str(out_dir), variant, seed)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"seconds": 1.0, **values}, f)


def test_selection_plan_and_report(study, tmp_path):
  grid = study._study().GRIDS["lr"][1]
  for value in grid:  # accuracy peaks at 0.1, ECE is lowest at 0.3; 0.4 diverged
    if value == 0.4:
      _write(tmp_path, study, f"tune,lr,{value:g}", 0, diverged="Non-finite at step 3")
      continue
    _write(tmp_path, study, f"tune,lr,{value:g}", 0, accuracy=0.95 - abs(value - 0.1),
           ece=0.01 + abs(value - 0.3))
  rows = study.final_rows(str(tmp_path))
  assert ("lr", "final,lr,0.1", "acc") in rows and ("lr", "final,lr,0.3", "ece") in rows
  plan = study.plan(str(tmp_path), [0, 1, 2])
  assert ("tune,lr,0.1", 0) not in plan and ("tune,ls,0.01", 0) in plan
  assert plan.index(("tune,ls,0.4", 0)) < plan.index(("final,ce", 0))  # LR and LS tuning first
  assert ("final,lr,0.3", 2) in plan
  # Once LR and LS are tuned, each known final's seed 0 comes before the other grids.
  for value in study._study().GRIDS["ls"][1]:
    _write(tmp_path, study, f"tune,ls,{value:g}", 0, accuracy=0.9, ece=0.02 + value)
  plan = study.plan(str(tmp_path), [0, 1, 2])
  assert plan[:2] == [("final,ce", 0), ("final_ts,ce", 0)]
  assert plan.index(("final,lr,0.3", 0)) < plan.index(("tune,focal,0.1", 0))
  assert plan.index(("tune,mbls,10", 0)) < plan.index(("final,lr,0.3", 1))
  for seed, (acc, ece) in enumerate([(0.91, 0.015), (0.912, 0.017), (0.914, 0.016)]):
    _write(tmp_path, study, "final,lr,0.3", seed, accuracy=acc, ece=ece)
  text = study.write_report(str(tmp_path), str(tmp_path), [0, 1, 2])
  line = next(l for l in text.splitlines() if l.startswith("| LR (opt. for ECE)"))
  # ours 0.912 ± 0.002 vs paper 0.911 ± 0.003: within; ECE 0.016 vs 0.015 ± 0.003: within
  assert "0.912 ± 0.002" in line and "0.016 ± 0.001" in line and line.count("yes") == 2
  assert "| LR | alpha | 0.4 | diverged | diverged |" in text
  assert os.path.exists(tmp_path / "label_relaxation_table1.md")
