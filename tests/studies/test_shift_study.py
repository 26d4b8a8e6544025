"""The shift study's report (studies/shift/report.py) on made-up results of the eval layout."""
import json
import os

import numpy as np
import pytest

from studies.shift import config as study_config
from studies.shift import report, run

NAMES = ("gaussian_noise", "fog")


def _metrics(rng, shift_amount):
  return {"accuracy": 0.9 - shift_amount, "ece": 0.02 + shift_amount / 2 + rng.normal(0, 1e-3),
          "aece": 0.02, "nll": 0.3 + shift_amount, "brier": 0.1, "aurc": 0.01}


def _shift(kind, rng, offset=0.0):
  def cell(amount):
    pre = _metrics(rng, amount + offset)
    post = {**pre, "ece": pre["ece"] / 2}
    return {"pre_temperature": pre, "post_temperature": post}
  out = {"table": "cifar10", "kind": kind, "clean": cell(0.0)}
  if kind == "rotate":
    # In text order ("105" before "15"), as a metrics.json written with sorted keys holds them.
    out["rotate"] = {str(a): cell(a / 1000) for a in sorted(range(0, 181, 15), key=str)}
  else:
    out["corruptions"] = {n: {str(s): cell(s / 50) for s in range(1, 6)} for n in NAMES}
  return out


def test_report_from_results_in_the_eval_layout(tmp_path):
  rng = np.random.default_rng(0)
  out_dir = str(tmp_path)
  for row in ("ce", "mbls_m6"):
    for kind in ("rotate", "corruptions"):
      for member in range(len(study_config.SEEDS)):
        path = run.result_path(out_dir, row, kind, member)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
          json.dump({"shift": _shift(kind, rng, 0.01 if row == "mbls_m6" else 0.0)}, f)
      with open(run.result_path(out_dir, row, kind, None), "w") as f:
        json.dump({"shift": _shift(kind, rng, -0.01)}, f)
  readme = tmp_path / "README.md"
  readme.write_text(f"# head\n{report.README_BEGIN}\nold\n{report.README_END}\ntail\n")
  path = report.write_report("unused", out_dir, readme=str(readme))
  text = open(path).read()
  block = readme.read_text()
  assert block.startswith("# head\n") and block.endswith("tail\n") and "old" not in block
  assert "| CE + TS | " in block and "| MbLS ensemble (5) | " in block
  # The made-up CE + TS halves CE's ECE in every cell, so it is better by an interval off 0.
  line = next(l for l in block.splitlines() if "CE + TS − CE" in l)
  assert line.endswith("(better)") and ": -0.0" in line, line
  # One line per question, each finished pair in it (MbLS and the ensembles against CE).
  line = next(l for l in block.splitlines() if l.startswith("- Does training-time"))
  assert "MbLS " in line and "LS " not in line.replace("MbLS ", ""), line
  assert sum(l.startswith("- ") for l in block.splitlines()) == 4
  assert "(shift_study.md)" in block  # the report's path, relative to the README
  assert "Rows with results: CE, CE + TS, MbLS, CE ensemble (5), MbLS ensemble (5)." in text
  assert os.path.getsize(os.path.join(out_dir, report.BOXES_FILE)) > 10_000
  assert os.path.getsize(os.path.join(out_dir, report.ROTATION_FILE)) > 10_000
  # CE + TS halves ECE in every made-up cell: its difference to CE is negative everywhere.
  loaded = report.load(out_dir, lambda d, r, k, m: run.result_path(d, r, k, m))
  runs = report.runs_of(loaded, "corruptions")
  mean, half = report.compare(runs["ce_ts"], runs["ce"], "corruptions", "ece", "5")
  assert mean < 0 and half >= 0
  # MbLS's made-up accuracy is 0.01 lower than CE's at every cell, paired by seed.
  mean, half = report.compare(runs["mbls_m6"], runs["ce"], "corruptions", "accuracy", "3")
  assert mean == pytest.approx(-0.01) and half == pytest.approx(0.0, abs=1e-9)
  assert "| ECE: LS − CE |" not in text  # rows without results are left out, not invented
  assert "| row | 0° | 15° | 30° | 45° |" in text  # the angles in numeric order


def test_interval_is_the_t_interval_of_the_mean():
  mean, half = report.interval([1.0, 2.0, 3.0])
  assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)


def test_readme_without_markers_is_one_line_error(tmp_path):
  readme = tmp_path / "README.md"
  readme.write_text("no markers\n")
  with pytest.raises(SystemExit, match="no '<!-- shift study: begin -->'"):
    report.update_readme(str(readme), "block")
  assert readme.read_text() == "no markers\n"  # nothing the user wrote is lost


def test_the_study_finds_before_training_that_frost_cannot_run(monkeypatch):
  from calib_jax.shift import weather  # pylint: disable=import-outside-toplevel
  assert run.corruption_problems() == [] or "frost" in run.corruption_problems()[0]
  monkeypatch.setattr(weather.importlib.util, "find_spec", lambda name: None)
  # `__main__` raises these as its usage error before the train phase.
  assert run.corruption_problems() == ["frost needs the frost textures of the reference package: "
                                       "pip install imagecorruptions-imaug"]
