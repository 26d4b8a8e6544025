"""The loss-comparison report (studies/compare) on made-up run results: aggregation, paired
claim verdicts, the Markdown report and the side-by-side reliability figure."""
import os

import numpy as np
import pytest

from calib_jax.evaluation import report, run as evaluate
from studies.compare import report as compare
from studies.compare.run import run_dir


def fake_results(seed, ece, accuracy=0.9, msp_aurc=0.05, pnorm_aurc=0.04, pnorm=2.0,
                 context_confidence=None):
  table = {"accuracy": accuracy, "ece": ece, "aece": ece, "classwise_ece": ece / 10,
           "nll": 0.3 + ece, "aurc": msp_aurc, "num_samples": 100}
  selective = {name: {"aurc": value, "eaurc": value / 2, "coverage_at_5pct_risk": 0.8}
               for name, value in (("msp", msp_aurc), ("max_logit", msp_aurc),
                                   ("max_logit_pnorm", pnorm_aurc))}
  results = {"seed": seed, "model": "mlp", "pre_temperature": table,
             "post_temperature": {**table, "ece": ece / 2}, "selective": selective,
             "fit": {"temperature": 1.5, "pnorm": pnorm}}
  if context_confidence is not None:
    results["context"] = {"accuracy": 0.1, "average_confidence": context_confidence,
                          "mean_entropy": 2.0, "uniform_confidence": 0.1}
  return results


def test_mean_and_sample_std():
  assert compare.mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
  assert compare.mean_std([4.0]) == (4.0, 0.0)
  assert compare.format_cell([0.01, 0.03], 100.0, 2) == "2.00 ± 1.41"


def test_table_has_a_row_per_loss_with_mean_and_std():
  runs = {"ce": [fake_results(0, 0.10), fake_results(1, 0.20)],
          "mbls": [fake_results(0, 0.02), fake_results(1, 0.04)]}
  table = compare.markdown_table(runs, compare.CALIBRATION_COLUMNS).splitlines()
  assert len(table) == 4
  assert table[2].startswith("| CE | 90.00 ± 0.00 | 15.00 ± 7.07 |")
  assert table[3].startswith("| MbLS | 90.00 ± 0.00 | 3.00 ± 1.41 |")


def test_claim_verdicts_are_paired_by_seed():
  claim = compare.Claim("MbLS", "MbLS has lower ECE than CE", "mbls", "ce", compare._pre("ece"))
  ce = [fake_results(0, 0.10), fake_results(1, 0.20), fake_results(2, 0.30)]
  # Seed-paired: MbLS beats CE on seeds 0 and 2 only, although its mean is lower.
  mixed = [fake_results(0, 0.05), fake_results(1, 0.25), fake_results(2, 0.01)]
  checked = compare.check_claim(claim, {"ce": ce, "mbls": mixed})
  assert (checked["wins"], checked["seeds"], checked["verdict"]) == (2, 3, "mixed")
  assert checked["diff_mean"] == pytest.approx(((0.05 - 0.1) + (0.25 - 0.2) + (0.01 - 0.3))
                                               * 100 / 3)
  better = [fake_results(s, 0.01) for s in range(3)]
  assert compare.check_claim(claim, {"ce": ce, "mbls": better})["verdict"] == "supported"
  worse = [fake_results(s, 0.5) for s in range(3)]
  assert compare.check_claim(claim, {"ce": ce, "mbls": worse})["verdict"] == "not supported"
  assert compare.check_claim(claim, {"ce": ce}) is None


def test_pnorm_claim_compares_two_scores_of_the_same_runs():
  claim = next(c for c in compare.CLAIMS if c.better == c.worse == "ls")
  runs = {"ls": [fake_results(0, 0.1, msp_aurc=0.06, pnorm_aurc=0.05),
                 fake_results(1, 0.1, msp_aurc=0.06, pnorm_aurc=0.07)]}
  checked = compare.check_claim(claim, runs)
  assert (checked["wins"], checked["verdict"]) == (1, "mixed")
  assert checked["diff_mean"] == pytest.approx(0.0)
  # No p beat MSP on validation: the p-norm score is MSP, which is no evidence either way.
  fell_back = {"ls": [fake_results(s, 0.1, msp_aurc=0.06, pnorm_aurc=0.06, pnorm=None)
                      for s in range(2)]}
  assert compare.check_claim(claim, fell_back)["verdict"] == "no difference"


def test_report_writes_tables_claims_and_the_reliability_figure(tmp_path):
  workdir, out_dir = str(tmp_path / "work"), str(tmp_path / "out")
  rng = np.random.default_rng(0)
  for loss in compare.RELIABILITY_LOSSES:
    eval_dir = evaluate.eval_dir(run_dir(workdir, "clutter_objects", loss, 0), "test")
    os.makedirs(eval_dir)
    probs = rng.dirichlet(np.ones(10), size=50).astype(np.float32)
    np.savez(os.path.join(eval_dir, report.PREDICTIONS_FILE), probs_pre=probs,
             probs_post=probs, labels=rng.integers(0, 10, 50))
  runs = {loss: [fake_results(0, ece, context_confidence=conf)]
          for loss, ece, conf in (("ce", 0.2, 0.6), ("mbls", 0.1, 0.5), ("acls", 0.05, 0.5),
                                  ("als_context", 0.1, 0.15))}
  text = compare.write_report(workdir, out_dir, {"clutter_objects": runs}, [0],
                              "python -m studies.compare")
  assert open(os.path.join(out_dir, "compare.md")).read() == text
  assert "| ALS + context |" in text
  assert "Context-only test images" in text
  assert "| MbLS | MbLS has lower ECE than CE | -10.00 ± 0.00 pt | 1/1 | supported |" in text
  # Claims whose runs are missing (LS, ALS without context) are left out, not guessed.
  assert "than LS" not in text
  with open(os.path.join(out_dir, "reliability_clutter_objects.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_diverged_runs_are_reported_not_averaged():
  diverged = {"diverged": "Non-finite training loss (inf) or gradient norm (inf) at step 51; ..."}
  runs = {"ce": [fake_results(0, 0.1), fake_results(1, 0.2)],
          "mbls": [fake_results(0, 0.05), {**diverged, "seed": 1}],
          "acls": [{**diverged, "seed": 0}, {**diverged, "seed": 1}]}
  rows = compare.markdown_table(runs, compare.CALIBRATION_COLUMNS).splitlines()
  assert rows[3].startswith("| MbLS (diverged on 1/2 seeds (step 51)) | 90.00 ± 0.00 | 5.00 ± 0.00 |")
  assert rows[4].startswith("| ACLS | diverged on 2/2 seeds (step 51, 51) |")
  assert rows[4].count("|") == rows[2].count("|")
  claims = compare.claims_table(runs)
  assert "| ACLS | ACLS has lower ECE than CE | — | — | not testable: ACLS diverged |" in claims
  # MbLS vs CE is paired on the seed both finished.
  assert "| MbLS | MbLS has lower ECE than CE | -5.00 ± 0.00 pt | 1/1 | supported |" in claims
