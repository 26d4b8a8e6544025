"""train.py then eval.py through their absl `main` functions (`calib_jax.cli.train` and
`calib_jax.cli.evaluate`), in this process; the written metrics.json is checked against numpy
re-computations from the checkpoint's parameters."""
import json
import os
import sys

import jax
import numpy as np
import pytest
from absl import app, flags

from calib_jax import config as config_lib
from calib_jax import data, experiment
from calib_jax.cli import evaluate as cli_evaluate
from calib_jax.cli import flags as cli_flags
from calib_jax.cli import train as cli_train
from calib_jax.config import variants
from calib_jax.evaluation import report, run as evaluation
from calib_jax.training import checkpoint
from test_run_loop import quick_rng_compilation  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The programs behind train.py and eval.py; their shared flags are defined as `run()` does.
cli_flags.define(["prog"])
train_program = cli_train
eval_program = cli_evaluate


@pytest.fixture
def parse(monkeypatch):
  """Parses a command line as `app.run` would (config overrides are read from sys.argv).

  ml_collections defines a flag per `--config.field` override while parsing; they are removed
  between parses, as each program run starts with a fresh process.
  """

  def forget_overrides():
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
      delattr(flags.FLAGS, name)

  def parse_args(*args):
    argv = ["prog", *args]
    monkeypatch.setattr(sys, "argv", argv)
    forget_overrides()
    if not any(str(a).startswith("--config=") for a in args):
      # A process loads the default config (and its override flags) when `define` runs.
      flags.FLAGS["config"].parse(config_lib.resolve_config_path(cli_flags.DEFAULT_CONFIG))
      flags.FLAGS["config"].present = 0
    flags.FLAGS(argv)

  yield parse_args
  forget_overrides()


def _args(workdir, variant="ce"):
  # The settings of test_train_loop.tiny_config, so the compiled programs are cache hits.
  return [f"--config={ROOT}/configs/clutter_objects_cnn.py:{variant}", f"--workdir={workdir}",
          "--config.data.name=digits", "--config.model_kwargs.widths=(4, 8)",
          "--config.num_train_steps=24", "--config.data.batch_size=32",
          "--config.data.eval_batch_size=64", "--config.optimizer.name=sgd",
          "--config.optimizer.learning_rate=0.1", "--config.optimizer.weight_decay=5e-4",
          "--config.schedule.warmup_epochs=0.1",
          "--config.progress_bar=False", "--config.tensorboard=False",
          "--config.checkpoint_every_steps=8", "--config.log_every_steps=8",
          "--config.eval_every_steps=12",
          # 50 resamples of the toolkit's intervals, as tiny_config (its default is 1000).
          "--config.eval.bootstrap_samples=50"]


def _numpy_ece(probs, labels, num_bins=15):
  conf, correct = probs.max(-1), probs.argmax(-1) == labels
  bins = np.clip(np.ceil(conf * num_bins) - 1, 0, num_bins - 1).astype(int)
  total = 0.0
  for b in range(num_bins):
    sel = bins == b
    if sel.any():
      total += sel.sum() / len(conf) * abs(correct[sel].mean() - conf[sel].mean())
  return total


def _numpy_aurc(scores, correct):
  """Tie-aware AURC: tied samples share their group's mean error."""
  order = np.argsort(-scores, kind="stable")
  scores, errors = scores[order], (~correct[order]).astype(float)
  _, starts, counts = np.unique(-scores, return_index=True, return_counts=True)
  for s, c in zip(starts, counts):
    errors[s:s + c] = errors[s:s + c].mean()
  cum = np.cumsum(errors)
  return np.mean(cum / np.arange(1, len(cum) + 1))


def _softmax(z):
  z = z.astype(np.float64) - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _nll(logits, labels):
  return float(-np.mean(np.log(_softmax(logits)[np.arange(len(labels)), labels])))


def _logits_from_checkpoint(config, workdir, split):
  """Logits of a split from the raw checkpoint arrays and model.apply (no eval-program code)."""
  built = experiment.build(config, devices=jax.devices()[:1])
  meta, model = built.meta, built.model
  raw, _ = checkpoint.Checkpointer(workdir, read_only=True).restore(None)
  variables = {"params": raw["params"], "batch_stats": raw["batch_stats"]}
  apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
  logits, labels = [], []
  for batch in data.make_dataset(config.data.name, split, batch_size=50, train=False):
    logits.append(np.asarray(apply(variables, batch["image"]))[batch["mask"]])
    labels.append(batch["label"][batch["mask"]])
  return np.concatenate(logits), np.concatenate(labels)


def test_train_then_eval_commands_and_metrics_against_numpy(tmp_path, capsys, parse):
  workdir = str(tmp_path / "run")
  parse(*_args(workdir))
  train_program.main(["train.py"])
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records if r["split"] == "val"] == [12, 24]
  assert [r["step"] for r in records if r["split"] == "train"] == [8, 16, 24]
  assert json.load(open(os.path.join(workdir, "config.json")))["model_kwargs"]["widths"] == [4, 8]

  # The report without the post-hoc toolkit and the CAM grid (test_evaluation_toolkit.py and
  # test_evaluation_maps.py check those): what is checked here is the report's own.
  parse(*_args(workdir), "--split=test", "--config.eval.toolkit=False",
        "--config.eval.cam_images=0")
  eval_program.main(["eval.py"])
  assert "PreT" in capsys.readouterr().out
  out_dir = evaluation.eval_dir(workdir, "test")
  results = json.load(open(os.path.join(out_dir, evaluation.RESULTS_FILE)))
  for name in (report.RELIABILITY_FILE, report.RISK_COVERAGE_FILE):
    with open(os.path.join(out_dir, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"

  config = config_lib.load_config_file(f"{ROOT}/configs/clutter_objects_cnn.py:ce")
  variants.override(config, {"data.name": "digits", "model_kwargs": {"widths": (4, 8)}})
  logits, labels = _logits_from_checkpoint(config, workdir, "test")
  assert results["step"] == 24 and results["pre_temperature"]["num_samples"] == len(labels) == 300
  probs = _softmax(logits)
  correct = probs.argmax(-1) == labels
  pre = results["pre_temperature"]
  assert pre["accuracy"] == pytest.approx(correct.mean(), abs=1e-6)
  assert pre["ece"] == pytest.approx(_numpy_ece(probs, labels), abs=1e-5)
  assert pre["nll"] == pytest.approx(_nll(logits, labels), rel=1e-4)
  assert results["selective"]["msp"]["aurc"] == pytest.approx(
      _numpy_aurc(probs.max(-1), correct), abs=1e-5)
  assert results["selective"]["max_logit"]["aurc"] == pytest.approx(
      _numpy_aurc(logits.max(-1), correct), abs=1e-5)

  # PosT uses the temperature fitted on the validation split: it minimises the val NLL ...
  t = results["fit"]["temperature"]
  assert 0.05 < t < 20.0, "the fit is interior (not at a search bound) for this check to hold"
  val_logits, val_labels = _logits_from_checkpoint(config, workdir, "val")
  assert results["fit"]["num_samples"] == len(val_labels) == 200
  for other in (0.8 * t, 1.25 * t):
    assert _nll(val_logits / t, val_labels) <= _nll(val_logits / other, val_labels) + 1e-6
  # ... and the test metrics after scaling are those of logits / T.
  assert results["post_temperature"]["ece"] == pytest.approx(
      _numpy_ece(_softmax(logits / t), labels), abs=1e-5)
  assert results["post_temperature"]["accuracy"] == pytest.approx(pre["accuracy"], abs=1e-6)


def test_bad_config_exits_with_the_reason(tmp_path, parse):
  parse(*_args(tmp_path / "bad"), "--config.loss=bogus", "--config.optimizer.learning_rate=-1")
  with pytest.raises(SystemExit, match=r"learning_rate must be > 0(.|\n)*unknown loss 'bogus'"):
    train_program.main(["train.py"])
  parse(f"--config={ROOT}/configs/default.py")
  with pytest.raises(app.UsageError, match="--workdir is required"):
    eval_program.main(["eval.py"])


def test_unknown_variant_is_rejected_when_the_config_loads(parse):
  with pytest.raises(flags.IllegalFlagValueError, match="no_such_loss"):
    parse(f"--config={ROOT}/configs/default.py:no_such_loss")


def test_command_line_adds_keys_to_free_form_dicts_only(parse):
  """`--config.data.options.download=False` adds a key the file leaves out (read as a Python
  literal); a new name outside the free-form dicts is still refused."""
  parse(f"--config={ROOT}/configs/default.py", "--config.data.options.download=False",
        "--config.model_kwargs.hidden=(64,)", "--config.data.splits.val=train[:10]")
  config = cli_flags.config()
  assert config.data.options.download is False
  assert tuple(config.model_kwargs.hidden) == (64,)
  assert config.data.splits.val == "train[:10]"
  with pytest.raises((AttributeError, KeyError, flags.Error)):
    parse(f"--config={ROOT}/configs/default.py", "--config.optimizer.lrate=0.1")


def test_a_sweep_through_the_commands_then_eval_of_one_member_and_of_all(tmp_path, capsys,
                                                                          parse):
  workdir = str(tmp_path / "sweep")
  parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10",
        "--config.num_train_steps=8", "--config.eval_every_steps=0")
  train_program.main(["train.py"])
  assert os.path.exists(os.path.join(workdir, "sweep.json"))
  capsys.readouterr()
  # The members the command picks, not the report (a member's whole report, toolkit and CAMs
  # included, is test_sweep.py's): its evals leave the toolkit and the CAM grid out.
  report_only = ["--config.eval.toolkit=False", "--config.eval.cam_images=0"]
  parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10", "--member=1",
        "--split=val", *report_only)
  eval_program.main(["eval.py"])
  out = capsys.readouterr().out
  assert out.startswith("member 1 (loss_kwargs.margin=10.0) — digits")
  assert os.path.exists(os.path.join(evaluation.eval_dir(workdir, "val", 1), "metrics.json"))
  parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10", "--split=val",
        *report_only)
  eval_program.main(["eval.py"])  # a sweep's default: every member
  out = capsys.readouterr().out
  assert "member 0 (loss_kwargs.margin=5.0)" in out and "member 1 (" in out
  parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10", "--member=2")
  with pytest.raises(SystemExit, match=r"^eval.py: --member='2' is not a member: use 0..1 or "
                     r"'all'$"):
    eval_program.main(["eval.py"])
  # --ensemble: both members as one ensemble (its report is test_sweep.py's; the vector and
  # isotonic calibrators' fits are test_evaluation_predictions.py's): temperature scaling only.
  parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10", "--ensemble",
        "--split=val", "--bootstrap_samples=0", "--config.eval.calibrators=('temperature',)")
  eval_program.main(["eval.py"])
  out = capsys.readouterr().out
  assert out.startswith("ensemble of 2 sweep members [0, 1] — split val")
  assert "mean member" in out and "mutual_information" in out
  assert os.path.exists(os.path.join(evaluation.eval_dir(workdir, "val"), "ensemble",
                                     "metrics.json"))
  parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10", "--ensemble",
        "--members=0,2")
  with pytest.raises(SystemExit, match=r"^eval.py: --members='0,2': member indices must be "
                     r"comma-separated integers in 0..1 \(the sweep has 2 members\)$"):
    eval_program.main(["eval.py"])
  parse(*_args(workdir, "mbls"), "--ensemble")
  with pytest.raises(SystemExit, match=r"^eval.py: --ensemble evaluates a sweep's members "
                     r"together; the config of .* has no sweep \(config.sweep is empty\)$"):
    eval_program.main(["eval.py"])

  # Without --config, the run's own config.json: its loss, model and sweep (--config.* still
  # override it).
  parse(f"--workdir={workdir}", "--member=1", "--split=val", *report_only)
  eval_program.main(["eval.py"])
  header = capsys.readouterr().out.splitlines()[0]
  assert header.startswith("member 1 (loss_kwargs.margin=10.0) — digits / small_cnn / mbls")

  # A config of another model or population: one line with the fields, both values and the
  # run's config.json; the run is left as it is.
  saved = os.path.join(workdir, "config.json")
  before = open(saved).read()
  for program, extra in ((eval_program, ["--member=1"]), (train_program, [])):
    parse(*_args(workdir, "mbls"), "--config.sweep=loss_kwargs.margin=5,10,15", *extra)
    with pytest.raises(SystemExit) as info:
      program.main(["prog"])
    line = str(info.value)
    assert "\n" not in line and "unreadable" not in line
    assert (f"{workdir} was trained with another config: sweep='loss_kwargs.margin=5,10,15' "
            f"here, 'loss_kwargs.margin=5,10' in the run; leave out --config to ") in line
    assert line.endswith(f"with the run's own config, {saved}"
                         + ("" if program is eval_program else
                            ", or train this config in another --workdir")
                         + ". Nothing was changed.")
  parse(f"--workdir={workdir}", "--config.model_kwargs.widths=(4, 16)")
  with pytest.raises(SystemExit, match=r"model_kwargs.widths=\(4, 16\) here, \(4, 8\) in the "
                     r"run; the run's own config is .*config.json: leave out the --config.\* "
                     r"overrides that change it"):
    train_program.main(["train.py"])
  assert open(saved).read() == before
