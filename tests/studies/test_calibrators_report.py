"""studies/calibrators' report: the answers follow the numbers, and a model trained elsewhere
keeps its committed numbers when only another model is retrained."""
import json
import os

import numpy as np

from studies.calibrators import report, run

CALIBRATORS = ("none", "temperature", "vector", "histogram")


def _rows(ece: dict[str, float], aps_size: float) -> dict:
  rows = {}
  for name in CALIBRATORS:
    interval = {"value": ece[name], "lower": ece[name] - 0.002, "upper": ece[name] + 0.002}
    rows[name] = {"accuracy": 0.9, "nll": 0.3 + ece[name], "ece": interval,
                  "smooth_ece": dict(interval),
                  "aps_0.1": {"coverage": 0.9, "mean_set_size": aps_size},
                  "thr_0.1": {"coverage": 0.9, "mean_set_size": 0.97},
                  "aps_0.05": {"coverage": 0.95, "mean_set_size": aps_size + 0.2}}
  return rows


def test_the_answers_name_the_winners_and_the_smallest_sets():
  results = {
      "CE": _rows({"none": 0.08, "temperature": 0.012, "vector": 0.02, "histogram": 0.004}, 1.03),
      "LS": _rows({"none": 0.02, "temperature": 0.021, "vector": 0.005, "histogram": 0.03}, 1.24),
  }
  text = "\n".join(report._answers(results))
  assert "histogram after CE; LS (vector)" in text
  assert "smallest after CE (1.030), largest after LS (1.240)" in text
  assert "do not give smaller sets than CE" in text
  assert "overlaps" not in text  # every winner is 0.006+ ahead, beyond its ±0.002 interval
  assert "## What it says" in report.markdown(results, [0])


def test_write_keeps_the_committed_numbers_of_models_without_logits(tmp_path, monkeypatch):
  from calib_jax import metrics

  def few_resamples(metric_fn, probs, labels, key):  # the report's 1000 are ~15 s here
    result = metrics.bootstrap(metric_fn, probs, labels, num_samples=20, key=key)
    return {k: float(v) for k, v in result.items() if k in ("value", "lower", "upper")}

  monkeypatch.setattr(report, "_interval", few_resamples)
  # The committed rows' four calibrators, not the study's seven: this test checks which models
  # keep their committed numbers; fitting matrix, Dirichlet and isotonic calibrators (~40 % of
  # its CPU) is tests/test_posthoc_calibrators.py's, and their rows are built by the same loop.
  monkeypatch.setattr(report, "CALIBRATORS", CALIBRATORS)
  out_dir, workdir = str(tmp_path / "out"), str(tmp_path / "work")
  committed = {"CE": _rows({n: 0.01 for n in CALIBRATORS}, 1.0)}
  os.makedirs(os.path.join(out_dir, "calibrators"))
  with open(os.path.join(out_dir, report.NUMBERS_FILE), "w") as f:
    json.dump(committed, f)
  rng = np.random.default_rng(0)
  logits = {}
  for split in ("val", "test"):
    labels = rng.integers(0, 3, 400)
    z = rng.normal(size=(400, 3)).astype(np.float32)
    z[np.arange(400), labels] += 2.0
    logits[f"{split}_logits"], logits[f"{split}_labels"] = z, labels
  acls_dir = run.run_dir(workdir, "ACLS", 0)
  os.makedirs(acls_dir)
  np.savez(os.path.join(acls_dir, run.LOGITS_FILE), **logits)
  report.write(workdir, out_dir, [0])
  with open(os.path.join(out_dir, report.NUMBERS_FILE)) as f:
    numbers = json.load(f)
  assert numbers["CE"] == committed["CE"]          # kept: no CE logits in this workdir
  assert set(numbers) == {"CE", "ACLS"}            # ACLS evaluated from its logits
  assert 0.0 <= numbers["ACLS"]["none"]["ece"]["value"] <= 1.0
