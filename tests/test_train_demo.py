"""`make demo`'s driver on a shrunken copy of configs/default.py."""
import os
import textwrap

from calib_jax import demo
from test_train_loop import compilation_cache, quick_rng_compilation  # noqa: F401


def test_demo_trains_evaluates_and_compares_variants(tmp_path, capsys):
  config_file = tmp_path / "small_default.py"
  config_file.write_text(textwrap.dedent(f"""
      from calib_jax.training import variants
      from calib_jax.training.config import load_config_file

      def get_config(arg=None):
        config = load_config_file({demo.DEFAULT_CONFIG!r} + ":" + (arg or "ce"))
        variants.override(config, {{
            "data.name": "digits", "num_train_steps": 24, "data.batch_size": 32,
            "data.eval_batch_size": 64, "optimizer.name": "sgd",
            "optimizer.learning_rate": 0.1, "optimizer.weight_decay": 5e-4,
            "schedule.name": "cosine", "schedule.warmup_epochs": 0.1,
            "checkpoint_every_steps": 8, "log_every_steps": 8, "eval_every_steps": 0,
            "progress_bar": False, "tensorboard": False}})
        config.model_kwargs.widths = (4, 8)
        config.data.train_options = {{}}
        return config
      """))
  workdir = tmp_path / "demo"
  assert demo.main([f"--workdir={workdir}", "--variants=ce,ls",
                    f"--config={config_file}"]) == 0
  out = capsys.readouterr().out
  assert "[ce] trained in" in out and "[ls] trained in" in out
  comparison = out[out.index("variant"):].splitlines()
  assert [line.split()[0] for line in comparison[1:3]] == ["ce", "ls"]
  for variant in ("ce", "ls"):
    assert os.path.exists(workdir / variant / "eval_test" / "metrics.json")
  # Library logs went to the demo's log file, not the console.
  log = (workdir / "log.txt").read_text()
  assert "Constructing tf.data.Dataset sklearn_digits" in log and "checkpoint" in log
  assert "Constructing tf.data.Dataset" not in capsys.readouterr().err
  # A second run finds both runs finished and only re-evaluates them.
  assert demo.main([f"--workdir={workdir}", "--variants=ce", f"--config={config_file}"]) == 0


def test_demo_reports_a_missing_config(tmp_path, capsys):
  assert demo.main([f"--config={tmp_path}/nope.py"]) == 1
  assert "not found" in capsys.readouterr().err
