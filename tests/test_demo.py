"""`make demo`'s driver on a shrunken copy of configs/default.py."""
import json
import os
import textwrap

from calib_jax import demo
from test_run_loop import quick_rng_compilation  # noqa: F401


class _StubToolkit:
  """Stands in for the post-hoc toolkit (its own tests are test_evaluation_toolkit's): what
  `--full_report` adds shows up in metrics.json without the toolkit's cost."""

  def __init__(self, experiment, split, calibration):
    del experiment, split, calibration

  def run(self, variables):
    del variables
    return {"posthoc": {"stub": True}}

  def write(self, out_dir):
    del out_dir
    return {}


def test_demo_trains_evaluates_and_compares_variants(tmp_path, capsys, monkeypatch):
  from calib_jax.evaluation import toolkit
  monkeypatch.setattr(toolkit, "PosthocReport", _StubToolkit)
  config_file = tmp_path / "small_default.py"
  config_file.write_text(textwrap.dedent(f"""
      from calib_jax import config as config_lib
      from calib_jax.config import variants

      VARIANTS = config_lib.load_config_module({demo.DEFAULT_CONFIG!r}).VARIANTS

      def get_config(arg=None):
        config = config_lib.load_config_file({demo.DEFAULT_CONFIG!r} + ":" + (arg or "ce"))
        variants.override(config, {{
            "num_train_steps": 24, "model_kwargs": {{"hidden": (16,)}},
            "checkpoint_every_steps": 8, "log_every_steps": 8, "eval_every_steps": 0,
            "progress_bar": False, "tensorboard": False}})
        return config
      """))
  workdir = tmp_path / "demo"
  assert demo.main([f"--workdir={workdir}", "--variants=ce,mbls",
                    f"--config={config_file}"]) == 0
  out = capsys.readouterr().out
  assert "[ce] trained in" in out and "[mbls] trained in" in out
  table = out[out.index("variant  train acc"):].splitlines()
  assert [line.split()[0] for line in table[2:4]] == ["CE", "MbLS"]
  assert "MbLS: ECE" in out and "summary.json" in out and "reliability.png" in out
  summary = json.loads((workdir / "summary.json").read_text())
  assert set(summary["variants"]) == {"ce", "mbls"}
  for variant in ("ce", "mbls"):
    row = summary["variants"][variant]
    assert set(row) == set(demo.SUMMARY_KEYS)
    assert 0.0 <= row["ece"] <= 1.0 and row["temperature"] > 0
    results = json.loads((workdir / variant / "eval_test" / "metrics.json").read_text())
    assert row["ece"] == results["pre_temperature"]["ece"]
    assert row["ece_post"] == results["post_temperature"]["ece"]
    # The table shows none of the post-hoc toolkit, so the demo does not run it by default;
    # the run's saved config (what eval.py reads) keeps the recipe's setting.
    assert "posthoc" not in results
    assert json.loads((workdir / variant / "config.json").read_text())["eval"]["toolkit"]
    # The default's test split is every digit not trained on: 1,237 training + 300 test images.
    assert results["pre_temperature"]["num_samples"] == 1537
  with open(workdir / "reliability.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # Library logs went to the demo's log file, not the console.
  log = (workdir / "log.txt").read_text()
  assert "Constructing tf.data.Dataset sklearn_digits" in log and "checkpoint" in log
  assert "Constructing tf.data.Dataset" not in capsys.readouterr().err
  assert "--full_report adds the post-hoc toolkit" in out
  # A second run finds the run finished and only re-evaluates it (no new training records),
  # with the post-hoc toolkit when asked.
  records = (workdir / "ce" / "metrics.jsonl").read_text().count('"split": "train"')
  assert demo.main([f"--workdir={workdir}", "--variants=ce", f"--config={config_file}",
                    "--full_report"]) == 0
  assert (workdir / "ce" / "metrics.jsonl").read_text().count('"split": "train"') == records
  results = json.loads((workdir / "ce" / "eval_test" / "metrics.json").read_text())
  assert results["posthoc"] == {"stub": True}
  assert "each run's full report" in capsys.readouterr().out


def test_demo_rejects_an_unknown_variant_in_one_line(tmp_path, capsys):
  assert demo.main([f"--workdir={tmp_path}", "--variants=ce,mblss"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("demo: unknown variant(s) mblss; valid: ce, ls,") and err.count("\n") == 1
  assert not os.listdir(tmp_path)  # nothing was started


def test_demo_reports_a_missing_config(tmp_path, capsys):
  assert demo.main([f"--config={tmp_path}/nope.py"]) == 1
  assert "not found" in capsys.readouterr().err
