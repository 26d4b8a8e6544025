"""The LR Table 1 study's bookkeeping (studies/lr_table1) on stand-in summaries: selection, run
plan, report."""
import json
import os
import re
import subprocess
import sys
import types

import pytest

from studies.lr_table1 import claims, config as study_config, report, run, summaries, sweep_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(out_dir, variant, seed, folder=None, **values):
  path = summaries.summary_path(str(out_dir), variant, seed, folder or summaries.SUMMARY_FOLDER)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"seconds": 1.0, **values}, f)


def test_selection_plan_and_report(tmp_path):
  grid = study_config.GRIDS["lr"][1]
  for value in grid:  # accuracy peaks at 0.1, ECE is lowest at 0.3; 0.4 diverged
    if value == 0.4:
      _write(tmp_path, f"tune,lr,{value:g}", 0, diverged="Non-finite at step 3")
      continue
    _write(tmp_path, f"tune,lr,{value:g}", 0, accuracy=0.95 - abs(value - 0.1),
           ece=0.01 + abs(value - 0.3))
  rows = summaries.final_rows(str(tmp_path))
  assert ("lr", "final,lr,0.1", "acc") in rows and ("lr", "final,lr,0.3", "ece") in rows
  plan = run.plan(str(tmp_path), [0, 1, 2])
  assert ("tune,lr,0.1", 0) not in plan and ("tune,ls,0.01", 0) in plan
  assert plan.index(("tune,ls,0.4", 0)) < plan.index(("final,ce", 0))  # LR and LS tuning first
  assert ("final,lr,0.3", 2) in plan
  # Once LR and LS are tuned, each known final's seed 0 comes before the other grids.
  for value in study_config.GRIDS["ls"][1]:
    _write(tmp_path, f"tune,ls,{value:g}", 0, accuracy=0.9, ece=0.02 + value)
  plan = run.plan(str(tmp_path), [0, 1, 2])
  assert plan[:2] == [("final,ce", 0), ("final_ts,ce", 0)]
  assert plan.index(("final,lr,0.3", 0)) < plan.index(("tune,focal,0.1", 0))
  assert plan.index(("tune,mbls,10", 0)) < plan.index(("final,lr,0.3", 1))
  # Seed by seed: every row's second seed before any row's third.
  assert plan.index(("final,lr,0.3", 1)) < plan.index(("final,ce", 2))
  for seed, (acc, ece) in enumerate([(0.91, 0.015), (0.912, 0.017), (0.914, 0.016)]):
    _write(tmp_path, "final,lr,0.3", seed, accuracy=acc, ece=ece)
  text = report.write_report(str(tmp_path), str(tmp_path), [0, 1, 2])
  line = next(l for l in text.splitlines() if l.startswith("| LR (opt. for ECE)"))
  # ours 0.912 ± 0.002 vs paper 0.911 ± 0.003: within; ECE 0.016 vs 0.015 ± 0.003: within
  assert "0.912 ± 0.002" in line and "0.016 ± 0.001" in line and line.count("yes") == 2
  assert "| LR | alpha | 0.4 | diverged | diverged |" in text
  assert os.path.exists(tmp_path / "label_relaxation_table1.md")


def test_claim_verdicts():
  claim = claims.Claim("x", "ece", (("lr", "ece"), ("ls", "ece"), ("ce", None)), ("lr", "ece"))
  lr, ls, ce = ("lr", "ece"), ("ls", "ece"), ("ce", None)
  verdict = lambda stats: claims.verdict(claim, stats)[1]
  assert verdict({lr: (0.012, 0.001, 3), ls: (0.018, 0.002, 3), ce: (0.08, 0.01, 3)}) == "holds"
  assert verdict({lr: (0.012, 0.0, 1), ls: (0.018, 0.0, 1), ce: (0.08, 0.0, 1)}) == (
      "holds on one seed (no spread yet)")
  assert verdict({lr: (0.012, 0.004, 3), ls: (0.018, 0.002, 3), ce: (0.08, 0.01, 3)}) == (
      "holds, but LS (ECE) is within the seed spread")
  assert verdict({lr: (0.030, 0.001, 3), ls: (0.018, 0.002, 3), ce: (0.08, 0.01, 3)}) == (
      "does not hold: LS (ECE) is better")
  assert verdict({lr: (0.020, 0.002, 3), ls: (0.018, 0.002, 3), ce: (0.08, 0.01, 3)}) == (
      "undecided: LS (ECE) and LR (ECE) within the seed spread")
  assert verdict({lr: (0.012, 0.001, 3), ce: (0.08, 0.01, 3)}) == "pending (LS (ECE))"
  ours, _ = claims.verdict(claim, {lr: (0.012, 0.001, 3), ls: (0.018, 0.002, 3),
                                 ce: (0.08, 0.01, 3)})
  assert ours == "LR (ECE) 0.012 ± 0.001, LS (ECE) 0.018 ± 0.002"
  # Accuracy: higher is better.
  acc = claims.Claim("y", "acc", (lr, ls), ls)
  assert claims.verdict(acc, {lr: (0.90, 0.001, 3), ls: (0.91, 0.001, 3)})[1] == "holds"


def test_the_paper_column_of_the_claims_comes_from_its_table(tmp_path):
  lines = claims.verdict_table(str(tmp_path), [0, 1, 2])
  by_claim = {line.split(" | ")[0][2:]: line for line in lines[2:]}
  assert len(by_claim) == len(claims.CLAIMS)
  assert "| FL (ECE) 0.011 |" in next(v for k, v in by_claim.items() if "tuned for ECE (" in k)
  assert "| LS (acc.) 0.915 |" in next(v for k, v in by_claim.items() if "highest" in k)
  assert all("pending" in line for line in lines[2:])  # no summaries in tmp_path


def test_readme_block_is_written_between_the_markers(tmp_path):
  readme = tmp_path / "README.md"
  readme.write_text(f"intro\n{report.README_BEGIN}\nold table\n{report.README_END}\nafter\n")
  _write(tmp_path, "final,ce", 0, accuracy=0.904, ece=0.077)
  report.update_readme(str(readme), str(tmp_path), [0, 1, 2])
  text = readme.read_text()
  assert text.startswith("intro\n") and text.endswith(f"{report.README_END}\nafter\n")
  assert "old table" not in text and "| CE | – | 1/3 | 0.904 ± 0.000 |" in text
  readme.write_text("no markers\n")
  with pytest.raises(SystemExit, match="no .* markers"):
    report.update_readme(str(readme), str(tmp_path), [0])


def test_the_readme_table_is_the_committed_results():
  """README's LR Table 1 block is the 10-seed study's, as its committed summaries give it (rerun
  `python -m studies.lr_table1 --report_only --sweeps --seeds=0,1,2,3,4,5,6,7,8,9
  --out_dir=docs/results/lr_table1_sweeps --readme=README.md` after adding summaries)."""
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  out_dir = os.path.join(ROOT, "docs", "results", "lr_table1_sweeps")
  assert report.readme_block(out_dir, list(range(10))) in readme
  assert "| CE | – | 10/10 |" in readme  # every row has the paper's 10 seeds


def test_report_without_predictions_keeps_the_committed_figure(tmp_path):
  _write(tmp_path, "final,ce", 0, accuracy=0.904, ece=0.077,
         predictions="final_ce/seed0/eval/predictions.npz")  # not in this workdir
  text = report.write_report(str(tmp_path), str(tmp_path / "no_workdir"), [0, 1, 2])
  assert "![reliability]" not in text
  (tmp_path / "lr_table1_reliability.png").write_bytes(b"committed")
  text = report.write_report(str(tmp_path), str(tmp_path / "no_workdir"), [0, 1, 2])
  assert "![reliability](lr_table1_reliability.png)" in text
  assert (tmp_path / "lr_table1_reliability.png").read_bytes() == b"committed"


def test_split_check_note(tmp_path):
  assert report.split_check(str(tmp_path), [0, 1, 2]).endswith("Pending.")
  assert ("pooled,ce,2", 2) in run.plan(str(tmp_path), [0, 1, 2])
  _write(tmp_path, "final,ce", 0, accuracy=0.904, ece=0.077)
  _write(tmp_path, "pooled,ce,0", 0, accuracy=0.908, ece=0.073)
  _write(tmp_path, "pooled,ce,1", 1, accuracy=0.912, ece=0.071)
  text = report.split_check(str(tmp_path), [0, 1, 2])
  assert ("CE on 2 fold(s): accuracy 0.910 ± 0.003, ECE 0.072 ± 0.001, against 0.904 ± 0.000 "
          "and 0.077 ± 0.000 on the original test set (1 seed(s)) and the paper's 0.912 ± 0.003 "
          "(inside its mean ± 2 std) and 0.129 ± 0.184 (inside).") in text
  assert "FL" not in text.split("seed k.")[1]  # FL's row is not known before its tuning
  assert ("pooled,ce,1", 1) not in run.plan(str(tmp_path), [0, 1, 2])


def test_split_check_follows_the_tuned_focal_row(tmp_path):
  """FL (opt. for acc.) is checked on the pooled folds with the gamma its tuning chose."""
  for gamma in study_config.GRIDS["focal"][1]:
    _write(tmp_path, f"tune,focal,{gamma:g}", 0, accuracy=0.95 if gamma == 1 else 0.9,
           ece=0.05)
  plan = run.plan(str(tmp_path), [0, 1, 2])
  assert [item for item in plan if item[0].startswith("pooled,focal")] == [
      ("pooled,focal,1,0", 0), ("pooled,focal,1,1", 1), ("pooled,focal,1,2", 2)]
  for seed, (acc, ece) in enumerate(((0.905, 0.070), (0.907, 0.072))):
    _write(tmp_path, "final,focal,1", seed, accuracy=acc, ece=ece)
  _write(tmp_path, "pooled,focal,1,0", 0, accuracy=0.909, ece=0.065)
  text = report.split_check(str(tmp_path), [0, 1, 2])
  assert ("FL (opt. for acc.) on 1 fold(s): accuracy 0.909 ± 0.000, ECE 0.065 ± 0.000, against "
          "0.906 ± 0.001 and 0.071 ± 0.001 on the original test set (2 seed(s)) and the paper's "
          "0.911 ± 0.002 (inside its mean ± 2 std) and 0.062 ± 0.002 (inside).") in text


def test_not_worse_claims_hold_within_the_seed_spread():
  mbls, ce = ("mbls", "ece"), ("ce", None)
  claim = claims.Claim("keeps accuracy", "acc", (mbls, ce), mbls, kind="not_worse")
  verdict = lambda stats: claims.verdict(claim, stats)[1]
  assert verdict({mbls: (0.903, 0.002, 3), ce: (0.904, 0.002, 3)}) == (
      "holds: CE is better within the seed spread")
  assert verdict({mbls: (0.895, 0.001, 3), ce: (0.904, 0.001, 3)}) == (
      "does not hold: CE is better")
  assert verdict({mbls: (0.906, 0.001, 3), ce: (0.904, 0.001, 3)}) == "holds"
  assert verdict({mbls: (0.903, 0.0, 1), ce: (0.904, 0.0, 1)}) == (
      "undecided on one seed: CE is ahead")


def test_init_check_note(tmp_path):
  assert report.init_check(str(tmp_path), [0, 1, 2]).endswith("Pending.")
  plan = run.plan(str(tmp_path), [0, 1, 2])
  assert plan[-1] == ("keras_init,ce", 0)  # after the table's runs and the split check
  for seed, acc in enumerate((0.904, 0.906)):
    _write(tmp_path, "final,ce", seed, accuracy=acc, ece=0.077)
  _write(tmp_path, "keras_init,ce", 0, accuracy=0.9071, ece=0.0702)
  text = report.init_check(str(tmp_path), [0, 1, 2])
  assert text.endswith("Test accuracy 0.9071 and ECE 0.0702, against 0.905 ± 0.001 and "
                       "0.077 ± 0.000 with ours (2 seed(s)): +0.21 points of accuracy, beside "
                       "the 0.70-point gap to the paper's 0.912.")
  assert ("keras_init,ce", 0) not in run.plan(str(tmp_path), [0, 1, 2])


def test_train_size_note_pairs_archived_runs_with_reruns(tmp_path):
  assert report.train_size_note(str(tmp_path)).endswith("Seed 0 on 60,000: pending.")
  for variant, acc in (("final,ce", 0.9043), ("final,acls", 0.9030)):
    _write(tmp_path, variant, 0, report.ARCHIVE_55K, accuracy=acc, ece=0.07)
  _write(tmp_path, "final,ce", 0, accuracy=0.9063, ece=0.07)
  _write(tmp_path, "final,acls", 0, accuracy=0.9070, ece=0.05)
  text = report.train_size_note(str(tmp_path))
  assert text.endswith("Seed 0 test accuracy, 55,000 → 60,000 images (2 rows): `final,ce` "
                       "0.9043 → 0.9063; `final,acls` 0.9030 → 0.9070; change +0.30 ± 0.14 "
                       "points.")


def test_the_runner_goes_through_the_plan_and_says_how_long_is_left(tmp_path, monkeypatch,
                                                                    capsys):
  """`run_study` on stand-in runs: every planned run once, in plan order, each line with the runs
  left and an estimate from the median run time (none after the last)."""
  done = []

  def fake_run(variant, seed, workdir, out_dir):
    done.append((variant, seed))
    summary = {"accuracy": 0.9, "ece": 0.05, "seconds": 360.0, "ece_post": 0.02,
               "temperature": 1.5, "ece_post_grid": 0.03, "temperature_grid": 1.5}
    _write(out_dir, variant, seed, **summary)
    return summary

  monkeypatch.setattr(run, "run_one", fake_run)
  assert run.run_study(str(tmp_path), str(tmp_path), [0]) == 0
  assert len(done) == len(set(done)) and run.plan(str(tmp_path), [0]) == []
  lines = [l for l in capsys.readouterr().out.splitlines() if re.search(r"; \d+ runs? left", l)]
  assert len(lines) == len(done)
  for line in lines[:-1]:  # the plan grows as tunings finish: each line says what it knows
    left = int(line.split("; ")[1].split()[0])
    runs = "1 run" if left == 1 else f"{left} runs"
    assert line.endswith(f"{runs} left, about {left * 0.1:.1f} h")
  assert lines[-1].endswith("(360 s); 0 runs left")


def test_the_command_line_rewrites_the_report_from_the_summaries(tmp_path):
  """`python -m studies.lr_table1 --report_only` from the repository root (absl flags, the
  package imported from the checkout): the report of the summaries in --out_dir, no training."""
  _write(tmp_path, "final,ce", 0, accuracy=0.904, ece=0.077)
  result = subprocess.run(
      [sys.executable, "-m", "studies.lr_table1", "--report_only", f"--out_dir={tmp_path}",
       f"--workdir={tmp_path / 'no_workdir'}", "--seeds=0,1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "| CE | – | 1/2 | 0.904 ± 0.000 |" in result.stdout
  assert (tmp_path / "label_relaxation_table1.md").read_text() in result.stdout


def test_the_sweep_plan_runs_grids_as_one_sweep_and_final_rows_in_chunks_of_seeds(tmp_path):
  """`sweeps.sweep_plan`: a tuning grid is one sweep over its values (done values left out),
  every grid before the final rows; with `max_members`, a final row's seeds come in sweeps of
  at most that many, the next sweep taking the first seeds without a summary."""
  from studies.lr_table1 import sweeps
  seeds = list(range(10))
  assert sorted(sweeps.GRID_RUN_ORDER) == sorted(summaries.GRID_LOSSES)
  plan = sweeps.sweep_plan(str(tmp_path), seeds, max_members=4)
  assert plan[0][1] == "loss_kwargs.alpha=0.01,0.025,0.05,0.1,0.2,0.3,0.4"
  assert [seed for _, seed in plan[0][2]] == [0] * 7 and plan[0][3] == "val"
  ce = [item for item in plan if item[0] == "final,ce"]
  assert [item[1] for item in ce] == ["seed=0,1,2,3"]  # the row's first chunk
  assert ce[0][2] == [("final,ce", s) for s in range(4)] and ce[0][3] == "test"
  for seed in range(4):
    _write(tmp_path, "final,ce", seed, accuracy=0.9, ece=0.05)
  _write(tmp_path, "tune,lr,0.1", 0, accuracy=0.9, ece=0.05)
  plan = sweeps.sweep_plan(str(tmp_path), seeds, max_members=4)
  assert plan[0][1] == "loss_kwargs.alpha=0.01,0.025,0.05,0.2,0.3,0.4"
  assert [item[1] for item in plan if item[0] == "final,ce"] == ["seed=4,5,6,7"]
  # CE has 4 seeds, CE + T none: CE + T's first chunk comes before CE's second.
  order = [item[0] for item in plan]
  assert order.index("final_ts,ce") < order.index("final,ce")
  # Every grid runs before any final row, so each row of the table is known early.
  grids = [index for index, item in enumerate(plan) if item[3] == "val"]
  assert [plan[i][0].split(",")[1] for i in grids] == ["lr", "ls", "focal", "ecp", "mbls",
                                                       "maxsup", "logitnorm"]
  assert max(grids) < min(i for i, item in enumerate(plan) if item[3] == "test")
  unchunked = sweeps.sweep_plan(str(tmp_path), seeds)
  assert [item[1] for item in unchunked if item[0] == "final,ce"] == ["seed=4,5,6,7,8,9"]


def test_the_sweeps_report_compares_wall_time_and_selections_with_the_sequential_study(tmp_path):
  """`sweep_notes`: a finished sweep's wall time (its members' seconds added up) against
  the sequential runs of the same variants and seeds, and each tuned loss's selections."""
  sweeps_dir, sequential_dir = tmp_path / "sweeps", tmp_path / "sequential"
  grid = study_config.GRIDS["lr"][1]
  text = "loss_kwargs.alpha=" + ",".join(f"{v:g}" for v in grid)
  for index, value in enumerate(grid):
    variant = f"tune,lr,{value:g}"
    sweep = {"text": text, "member": index, "members": len(grid), "variant": variant,
             "load": 2.5}
    _write(sweeps_dir, variant, 0, accuracy=0.95 - abs(value - 0.1), ece=0.01 + abs(value - 0.3),
           sweep=sweep, seconds=60.0)
    _write(sequential_dir, variant, 0, accuracy=0.95 - abs(value - 0.1),
           ece=0.01 + abs(value - 0.2), seconds=120.0)
  # A loss added after the sequential study, tuned only by the sweeps (MaxSup: acc 0.01, ECE
  # 0.05 selected): its two final rows count in the whole protocol below.
  maxsup = study_config.GRIDS["maxsup"][1]
  text_maxsup = "loss_kwargs.alpha=" + ",".join(f"{v:g}" for v in maxsup)
  for index, value in enumerate(maxsup):
    variant = f"tune,maxsup,{value:g}"
    _write(sweeps_dir, variant, 0, accuracy=0.95 - value, ece=0.01 + abs(value - 0.05),
           sweep={"text": text_maxsup, "member": index, "members": len(maxsup),
                  "variant": variant, "load": 2.5}, seconds=60.0)
  _write(sweeps_dir, "final_ts,ce", 0, accuracy=0.9, ece=0.05, seconds=50.0,
         sweep={"text": "seed=0", "member": 0, "members": 1, "variant": "final_ts,ce"})
  for seed in (0, 1):  # a sweep of 2 seeds; the sequential study ran seed 0 only
    _write(sweeps_dir, "final,ce", seed, accuracy=0.9, ece=0.05, seconds=60.0,
           sweep={"text": "seed=0,1", "member": seed, "members": 2, "variant": "final,ce"})
  _write(sequential_dir, "final,ce", 0, accuracy=0.91, ece=0.05, seconds=100.0)
  _write(sequential_dir, "pooled,ce,0", 0, accuracy=0.91, ece=0.05, seconds=9999.0)  # a check
  lines = sweep_report.sweep_notes(str(sweeps_dir), str(sequential_dir))
  assert "| `final,ce` [seed=0,1] | 2 | 2.0 | – | 1 of 2 run | – | 1.0e-02, 0.0e+00 |" in lines
  assert f"| `tune,lr` [{text}] | 7 | 7.0 | 2.5 | 14.0 | 2.00x | 0.0e+00, 1.0e-01 |" in lines
  assert "| `final_ts,ce` [seed=0] | 1 | 0.8 | – | 0 of 1 run | – | – |" in lines
  assert any(l.startswith("Where both exist: 0.12 h as sweeps against 0.23 h") for l in lines)
  assert "- LR: acc 0.1 (the same); ece 0.3 (sequential: 0.2)." in lines
  # The whole protocol at the median minutes per member-run: 48 tuning runs (the paper's 33, 7
  # for MaxSup and 8 for LogitNorm; 1.0 against 2.0 min) and the sweeps' 8 known final rows
  # (CE, CE + T, LR x 2, ACLS x 2, MaxSup x 2) x 10 seeds (1.0 against 100 s; the pooled check
  # left out): 48 + 80 = 128 min against 96 + 133.3 = 229.3 min.
  whole = next(l for l in lines if l.startswith("Median per member-run"))
  assert "tuning 1.0 min per member-run (14 so far) against 2.0 min per run (7 runs), 2.00x" in whole
  assert "final 1.0 min per member-run (3 so far) against 1.7 min per run (1 runs), 1.67x" in whole
  assert whole.endswith("(128 member-runs: 48 tuning, 80 final) at these rates: 2.1 h as sweeps "
                        "against 3.8 h as sequential runs (1.79x).")
  assert sweep_report.sweep_notes(str(sequential_dir), str(sequential_dir)) == []  # no sweeps there


def test_a_resumed_sweep_reports_its_training_time_over_all_sessions(tmp_path, monkeypatch):
  """`sweeps.run_sweep`: a session cut short by preemption still adds its time, so a member's
  `seconds` is the whole training time, not that of the last (resuming) session."""
  from calib_jax.evaluation import run as evaluate
  from calib_jax.run import loop, preemption
  from studies.lr_table1 import sweeps
  clock = {"now": 0.0}
  monkeypatch.setattr(sweeps, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))

  def train(seconds, preempt):
    def train_and_evaluate(config, workdir):
      clock["now"] += seconds
      if preempt:
        raise preemption.Preempted(10, workdir)
    return train_and_evaluate

  results = {"test": {"accuracy": 0.9, "ece": 0.05, "nll": 0.3, "temperature": 1.2}}
  monkeypatch.setattr(evaluate, "evaluate_run", lambda *a, **k: results)
  monkeypatch.setattr(sweeps, "summarize", lambda results, seconds: {"seconds": seconds})
  item = ("final,ce", "seed=0,1", [("final,ce", 0), ("final,ce", 1)], "test")
  monkeypatch.setattr(loop, "train_and_evaluate", train(300.0, preempt=True))
  with pytest.raises(preemption.Preempted):
    sweeps.run_sweep(item, str(tmp_path), str(tmp_path / "out"))
  monkeypatch.setattr(loop, "train_and_evaluate", train(100.0, preempt=False))
  written = sweeps.run_sweep(item, str(tmp_path), str(tmp_path / "out"))
  assert [summary["seconds"] for _, _, summary in written] == [200.0, 200.0]  # (300 + 100) / 2


def test_maxsup_and_logitnorm_are_tuned_like_lr_and_run_alone_with_losses(tmp_path):
  """The rows added beyond the paper: one grid sweep each on the hold-out, then a row for
  accuracy and one for ECE; `losses=` plans only their sweeps (the finished study's rows stay
  done), sequentially as well."""
  from studies.lr_table1 import sweeps
  seeds = list(range(10))
  only = ("maxsup", "logitnorm")
  plan = sweeps.sweep_plan(str(tmp_path), seeds, losses=only)
  assert [item[1] for item in plan] == [
      "loss_kwargs.alpha=0.01,0.025,0.05,0.1,0.2,0.3,0.4",
      "loss_kwargs.temperature=0.005,0.01,0.02,0.04,0.1,0.2,0.5,1"]
  assert {variant for variant, _ in run.plan(str(tmp_path), seeds, only)} == {
      f"tune,{loss},{v:g}" for loss in only for v in study_config.GRIDS[loss][1]}
  for value in study_config.GRIDS["maxsup"][1]:  # accuracy best at 0.2, ECE at 0.05
    _write(tmp_path, f"tune,maxsup,{value:g}", 0, accuracy=0.9 - abs(value - 0.2),
           ece=0.01 + abs(value - 0.05))
  rows = summaries.final_rows(str(tmp_path))
  assert ("maxsup", "final,maxsup,0.2", "acc") in rows
  assert ("maxsup", "final,maxsup,0.05", "ece") in rows
  assert not any(key == "logitnorm" for key, _, _ in rows)  # its grid is not finished
  plan = sweeps.sweep_plan(str(tmp_path), seeds, max_members=5, losses=only)
  assert [(item[0], item[1]) for item in plan] == [
      ("tune,logitnorm,0.005", "loss_kwargs.temperature=0.005,0.01,0.02,0.04,0.1,0.2,0.5,1"),
      ("final,maxsup,0.2", "seed=0,1,2,3,4"), ("final,maxsup,0.05", "seed=0,1,2,3,4")]
  assert "final,maxsup,0.2" in study_config.VARIANTS
  text = report.write_report(str(tmp_path), str(tmp_path), [0, 1])
  assert "| MaxSup (opt. for acc.) | 0.2 | 0/2 | pending | – |" in text
  assert "| LogitNorm | temperature | 0.04 | pending | pending |" in text


def test_the_losses_flag_names_the_valid_ones():
  result = subprocess.run([sys.executable, "-m", "studies.lr_table1", "--losses=maxsup,logitnrom",
                           "--report_only"], cwd=ROOT, capture_output=True, text=True)
  assert result.returncode != 0
  assert "--losses: unknown logitnrom; valid: ls, lr, ecp, focal, mbls, maxsup, logitnorm" \
      in result.stderr
