"""Any model's predictions: `evaluate_predictions` against the metrics it is made of, its
one-line errors, and `eval.py --predictions` as a user runs it."""
import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import flags as absl_flags

import calib_jax
from calib_jax import conformal, metrics, posthoc
from calib_jax.cli import evaluate as cli_evaluate
from calib_jax.cli import flags as cli_flags
from calib_jax.evaluation import predictions, predictions_intervals, predictions_plots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _logits(rng, n, c=5, signal=2.5, scale=3.0):
  labels = rng.integers(0, c, n)
  z = rng.normal(size=(n, c))
  z[np.arange(n), labels] += signal
  return (scale * z).astype(np.float32), labels


@pytest.fixture(scope="module")
def arrays():
  rng = np.random.default_rng(0)
  val_x, val_y = _logits(rng, 1500)
  test_x, test_y = _logits(rng, 1500)
  ood = (0.3 * rng.normal(size=(500, 5))).astype(np.float32)  # flat logits: low confidence
  return {"val_logits": val_x, "val_labels": val_y, "test_logits": test_x,
          "test_labels": test_y, "ood_logits": ood}


@pytest.fixture(scope="module")
def results(arrays):
  return calib_jax.evaluate_predictions(**arrays, bootstrap_samples=100)


@pytest.fixture(scope="module")
def dispatched(arrays):
  """`_dispatched`'s report without intervals (still on the device), its fitted calibrators
  and each calibrator's test `(confidence, correct)`, read by several tests (none changes
  them)."""
  return predictions._dispatched(
      **{k: arrays.get(k) for k in predictions.REQUIRED + predictions.OPTIONAL},
      calibrators=predictions.DEFAULT_CALIBRATORS, alphas=(0.1, 0.05), num_bins=15,
      bootstrap_samples=0)


def test_each_number_is_the_metric_it_names(arrays, results):
  test_x, test_y = arrays["test_logits"], arrays["test_labels"]
  raw = jax.nn.softmax(test_x, -1)
  got = results["calibrators"]["raw"]["test"]
  assert got["ece"] == pytest.approx(float(metrics.ece(raw, test_y)), abs=1e-6)
  assert got["smooth_ece"] == pytest.approx(float(metrics.smooth_ece(raw, test_y)), abs=1e-6)
  assert got["accuracy"] == pytest.approx(float(np.mean(test_x.argmax(-1) == test_y)))
  ece = got["intervals"]["ece"]
  assert ece["value"] == pytest.approx(got["ece"]) and ece["lower"] <= ece["upper"]
  scaled = posthoc.fit_calibrator("temperature", arrays["val_logits"], arrays["val_labels"])
  assert results["calibrators"]["temperature"]["test"]["nll"] == pytest.approx(
      float(metrics.nll(scaled(test_x), test_y)), abs=1e-6)
  # These logits are overconfident (scaled by 3): temperature scaling lowers the ECE.
  assert results["calibrators"]["temperature"]["test"]["ece"] < got["ece"]
  sets = conformal.fit("thr", jax.nn.softmax(arrays["val_logits"], -1), arrays["val_labels"],
                       0.1, from_logits=False)(raw)
  thr = results["calibrators"]["raw"]["conformal"]["thr@0.1"]
  assert thr["mean_set_size"] == pytest.approx(float(conformal.mean_set_size(sets)))
  for entry in results["calibrators"].values():  # split conformal: coverage near 1 - alpha
    for name, c in entry["conformal"].items():
      assert abs(c["coverage"] - (1 - c["alpha"])) < 0.03, name


# Two programs' bits (the report's test metrics and the interval metric's own): equal with
# either of the suite's compilers now that each compiles a program as one LLVM module (with the
# program split over threads, the fast one put the vector-scaled smooth ECE one ulp apart).
def test_the_intervals_values_taken_from_the_test_numbers_are_the_metrics_on_the_data(
    dispatched):
  """`_VALUES_FROM_TEST`: the bootstrap is given the test split's number as its `value`; it is
  the bits the interval's own metric gives on each calibrator's `(confidence, correct)`."""
  pending, _, resampled = dispatched
  assert set(resampled) == {"raw", *predictions.DEFAULT_CALIBRATORS}
  for name, (confidence, correct) in resampled.items():
    test = pending["calibrators"][name]["test"]
    for key in predictions_intervals.VALUES_FROM_TEST:
      metric = predictions_intervals.interval_metric(key, 15)
      assert np.asarray(test[key]).tobytes() == np.asarray(
          metric(confidence, correct)).tobytes(), (name, key)


def test_detection_scores_find_wrong_predictions_and_the_ood_set(arrays, results):
  wrong = arrays["test_logits"].argmax(-1) != arrays["test_labels"]
  msp = posthoc.msp(arrays["test_logits"])
  assert results["failure"]["msp"]["auroc"] == pytest.approx(
      float(metrics.auroc(msp, wrong)), abs=1e-6)
  assert results["failure"]["msp"]["auroc"] > 0.7
  assert results["ood"]["max_logit"]["auroc"] > 0.95
  assert results["num_ood"] == 500
  assert set(results["failure"]) == {"msp", "max_logit", "neg_entropy", "energy", "pnorm"}


def _without(arrays, key):
  return {k: v for k, v in arrays.items() if k != key}


@pytest.mark.parametrize("change, message", [
    (lambda a: _without(a, "test_labels"), r"^predictions: missing array 'test_labels' \(needed"),
    (lambda a: {**a, "test_labels": a["test_labels"][:-1]},
     r"^predictions: test_labels has 1499 samples, test_logits 1500$"),
    (lambda a: {**a, "ood_logits": a["ood_logits"][:, :3]},
     r"^predictions: ood_logits has 3 classes, val_logits 5"),
    (lambda a: {**a, "val_logits": np.where(np.arange(5) == 2, np.nan, a["val_logits"])},
     r"^predictions: val_logits has 1500 NaN or infinite value\(s\)$"),
    (lambda a: {**a, "val_labels": a["val_labels"] + 1},
     r"^predictions: val_labels holds 5, outside \[0, 5\)"),
    (lambda a: {**a, "val_labels": a["val_labels"].astype(np.float32)},
     r"^predictions: val_labels must be integers \[N\]"),
])
def test_bad_predictions_are_one_line_each(arrays, change, message):
  with pytest.raises(predictions.PredictionsError, match=message):
    predictions.evaluate_predictions(**{k: change(arrays).get(k) for k in
                                        predictions.REQUIRED + predictions.OPTIONAL})


def _eval_in_process(*args: str) -> str:
  """eval.py's `main` on the command line `args`, in this process (flags parsed as `app.run`
  parses them; `evaluate.run`'s process set-up is test_eval_command_reports_a_file_of_
  predictions' part); returns what it printed. A process costs ~5 s of imports and compiles
  afresh, and these tests check the command's report, not its process."""
  argv = ["eval.py", *args]
  cli_flags.define(argv)
  printed = io.StringIO()
  try:
    with contextlib.redirect_stdout(printed):
      cli_evaluate.main(absl_flags.FLAGS(argv))
  finally:
    absl_flags.FLAGS.unparse_flags()  # the next command line starts from the defaults
  return printed.getvalue()


# What a predictions file does not need: the data pipeline's TensorFlow, and flax (models only).
_UNNEEDED = ('tensorflow', 'tensorflow_datasets', 'flax')
# eval.py's program, which also writes to $IMPORTED at exit which of those were imported.
_EVAL_NOTING_IMPORTS = (
    "import atexit, os, sys; atexit.register(lambda: open(os.environ['IMPORTED'], 'w').write("
    f"str(sorted(m for m in {_UNNEEDED!r} if m in sys.modules))));"
    f"sys.path.insert(0, {ROOT!r}); from calib_jax.cli import evaluate; evaluate.run()")


def _unneeded_imports(*statements: str) -> list[list[str]]:
  """Which of `_UNNEEDED` one fresh process has imported after running each of `statements`,
  one after the other."""
  noted = f"print(sorted(m for m in {_UNNEEDED!r} if m in sys.modules))"
  code = "import sys; " + "; ".join(f"{s}; {noted}" for s in statements)
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
  assert done.returncode == 0, done.stderr[-2000:]
  return [ast.literal_eval(line) for line in
          done.stdout.strip().splitlines()[-len(statements):]]


def test_the_predictions_path_imports_neither_tensorflow_nor_flax():
  """Every module `eval.py --predictions` imports before it draws (the drawing adds matplotlib
  alone): flax would cost ~1.5 s of start-up, TensorFlow ~4 s (issue 46)."""
  path = ("from calib_jax.cli import evaluate; "
          "from calib_jax.evaluation import predictions, predictions_plots; "
          "from calib_jax import metrics, posthoc, conformal, plotting_data")
  after_path, after_flax = _unneeded_imports(path, "import flax.struct")
  assert after_path == []
  # The check sees them when they are imported (in the same process, next).
  assert after_flax == ["flax"]


def test_eval_command_reports_a_file_of_predictions(arrays, tmp_path):
  small = {k: v[:300] for k, v in arrays.items()}
  np.savez(tmp_path / "preds.npz", **small)
  env = {**os.environ, "IMPORTED": str(tmp_path / "imported.txt"),
         "CALIB_JAX_COMPILATION_CACHE": str(tmp_path / "cache")}
  done = subprocess.run(
      [sys.executable, "-c", _EVAL_NOTING_IMPORTS, f"--predictions={tmp_path / 'preds.npz'}",
       f"--workdir={tmp_path / 'out'}", "--bootstrap_samples=40"],
      capture_output=True, text=True, timeout=600, env=env)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "temperature" in done.stdout and "OOD vs test" in done.stdout
  # The console carries the report alone: jax's backend probing is logged to the workdir.
  assert done.stderr == "", done.stderr[-2000:]
  assert "Unable to initialize backend" not in done.stdout  # nor on stdout (issue 46)
  assert (tmp_path / "out" / "log.txt").exists()
  # A file of logits needs no data pipeline nor models: neither TensorFlow nor flax is imported.
  assert (tmp_path / "imported.txt").read_text() == "[]"
  # The compiled programs went to the cache directory named by the environment.
  assert len(list((tmp_path / "cache").iterdir())) > 10
  out = tmp_path / "out" / predictions.PREDICTIONS_DIR
  written = json.loads((out / "metrics.json").read_text())
  assert written["bootstrap_samples"] == 40
  # The raw row's ECE is the metric of the file's test logits (as test_each_number_is_the_
  # metric_it_names checks it for evaluate_predictions).
  assert written["calibrators"]["raw"]["test"]["ece"] == pytest.approx(
      float(metrics.ece(jax.nn.softmax(small["test_logits"], -1), small["test_labels"])),
      abs=1e-6)
  assert (out / "reliability.png").stat().st_size > 0
  np.savez(tmp_path / "bad.npz", val_logits=small["val_logits"])
  # A bad file: exit status 1 with one line on stderr (Python's exit with a message, here in
  # this process: the line is the exit's message).
  with pytest.raises(SystemExit) as bad:
    _eval_in_process(f"--predictions={tmp_path / 'bad.npz'}", f"--workdir={tmp_path / 'out2'}")
  assert bad.value.code == (
      "eval.py: predictions: missing array 'val_labels' (needed: val_logits, val_labels, "
      "test_logits, test_labels; optional: ood_logits)")


def test_evaluate_and_write_is_fit_and_evaluate_then_write_report(arrays, results, dispatched,
                                                                  tmp_path):
  """`evaluate_and_write` (eval.py's: plots drawn while the intervals compute) gives the same
  numbers, in the same order (the console's rows), and the same files as `fit_and_evaluate`
  then `write_report` (`results` is `fit_and_evaluate`'s report; its calibrators, fitted on the
  validation logits alone, are those `_dispatched` fits whatever the alphas and resamples)."""
  got, files = predictions.evaluate_and_write(str(tmp_path / "out"), arrays,
                                              bootstrap_samples=100)
  assert got == results
  assert list(got["calibrators"]) == ["raw", "temperature", "vector", "isotonic"]
  assert all(type(v) is float for v in got["calibrators"]["raw"]["test"]["intervals"]["ece"]
             .values())
  _, fitted, _ = dispatched
  assert list(fitted) == ["temperature", "vector", "isotonic"]
  expected = predictions.write_report(str(tmp_path / "then"), arrays, results, fitted)
  assert [os.path.basename(f) for f in files.values()] == [
      os.path.basename(f) for f in expected.values()]
  with open(files["metrics"]) as f:
    written = json.load(f)
  assert written == json.loads(json.dumps({**results, "files": files}))


def test_the_plots_numbers_from_each_calibrators_confidences_are_those_of_its_probabilities(
    arrays, dispatched):
  """`evaluate_and_write` draws from the confidences the report keeps (`plot_numbers_of`);
  `plot_report` from the probabilities (`plot_numbers`): the same numbers, to the bit."""
  pending, fitted, resampled = dispatched
  of_probs = predictions_plots.plot_numbers(arrays, pending, fitted)
  of_confidences = predictions_plots.plot_numbers_of(pending, resampled)
  assert list(of_probs["reliability"]) == list(of_confidences["reliability"])
  assert len(of_probs["reliability"]) == 2  # the raw logits and the best calibrator
  for got, expected in ((of_confidences["smooth"], of_probs["smooth"]),
                        *zip(of_confidences["reliability"].values(),
                             of_probs["reliability"].values())):
    assert list(got) == list(expected)
    for key, value in expected.items():
      np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_calibrator_with_too_few_samples_is_skipped_with_its_reason(arrays):
  """Vector scaling needs 10 validation samples per free parameter (2C): on 60 of them the
  report leaves it out, says why, and reports the others."""
  small = {**arrays, "val_logits": arrays["val_logits"][:60],
           "val_labels": arrays["val_labels"][:60]}
  results = predictions.evaluate_predictions(**small, calibrators=("temperature", "vector"),
                                             bootstrap_samples=0)
  assert set(results["calibrators"]) == {"raw", "temperature"}
  assert "only 60 held-out samples" in results["skipped"]["vector"]
  assert "vector        skipped: vector scaling has" in predictions.format_table(results)
  tiny = {**arrays, "val_logits": arrays["val_logits"][:15],
          "val_labels": arrays["val_labels"][:15]}
  results = predictions.evaluate_predictions(**tiny, calibrators=(), alphas=(0.1, 0.05),
                                             bootstrap_samples=0)
  assert set(results["calibrators"]["raw"]["conformal"]) == {"thr@0.1", "aps@0.1", "raps@0.1",
                                                             "saps@0.1"}
  assert "need >= 19" in results["skipped"]["conformal@0.05"]
  assert "calibration samples, too few for conditional='class' at alpha=0.1" in results[
      "skipped"]["conformal-class@0.1"]
  with pytest.raises(posthoc.TooFewSamplesError, match="would overfit"):
    posthoc.fit_calibrator("vector", small["val_logits"], small["val_labels"])


def test_class_conditional_sets_are_mondrian_fits_and_skipped_per_alpha(arrays):
  """The `-class` sets are `conformal.fit(..., conditional="class")` on the validation
  probabilities, with the worst class's coverage; where a class has too few samples for an α
  (class 2: 12, and α = 0.05 needs 19) only that α's class-conditional sets are left out."""
  val_y = arrays["val_labels"]
  keep = np.concatenate([np.flatnonzero(val_y == k)[:12 if k == 2 else 25] for k in range(5)])
  val_x, val_y = arrays["val_logits"][keep], val_y[keep]
  results = predictions.evaluate_predictions(val_x, val_y, arrays["test_logits"],
                                             arrays["test_labels"], calibrators=(),
                                             alphas=(0.1, 0.05), bootstrap_samples=0)
  got = results["calibrators"]["raw"]["conformal"]
  assert list(got) == ["thr@0.1", "thr@0.05", "thr-class@0.1", "aps@0.1", "aps@0.05",
                       "aps-class@0.1", "raps@0.1", "raps@0.05", "raps-class@0.1", "saps@0.1",
                       "saps@0.05", "saps-class@0.1"]
  assert results["skipped"]["conformal-class@0.05"].startswith(
      "class 2 has 12 calibration samples, too few for conditional='class' at alpha=0.05")
  # A name wider than the table's column keeps a space before its reason.
  assert "\nconformal-class@0.05 skipped: class 2 has 12" in predictions.format_table(results)
  test_p, test_y = jax.nn.softmax(arrays["test_logits"], -1), arrays["test_labels"]
  for key, kw in (("thr-class@0.1", {"conditional": "class"}), ("saps@0.05", {}),
                  ("raps@0.1", {}), ("raps-class@0.1", {"conditional": "class"})):
    name, alpha = key.split("-")[0].split("@")[0], float(key.rsplit("@", 1)[1])
    sets = conformal.fit(name, jax.nn.softmax(val_x, -1), val_y, alpha, from_logits=False,
                         **kw)(test_p)
    assert got[key]["coverage"] == pytest.approx(float(conformal.coverage(sets, test_y)))
    assert got[key]["mean_set_size"] == pytest.approx(float(conformal.mean_set_size(sets)))
    assert got[key]["worst_class_coverage"] == pytest.approx(
        float(conformal.class_conditional_coverage(sets, test_y).worst))
  table = predictions.format_table(results)
  assert re.search(r"raw +thr-class +0\.\d{3} +\d\.\d\d +0\.\d\d +-\n", table)
  assert re.search(r"raw +raps-class +0\.\d{3} +\d\.\d\d +0\.\d\d +-\n", table)
  assert "worst class's coverage" in table


# Member-stacked logits [M, N, C]: an ensemble.


@pytest.fixture(scope="module")
def stacked(arrays):
  """Three members: the fixture's logits with member noise (300 val, 300 test, 100 OOD)."""
  rng = np.random.default_rng(1)
  out = {k: v[:300] if k.endswith("labels") else
         np.stack([v[:300 if k != "ood_logits" else 100]
                   + 1.5 * rng.normal(size=v[:300 if k != "ood_logits" else 100].shape)
                   for _ in range(3)]).astype(np.float32)
         for k, v in arrays.items()}
  return out


def test_member_stacked_logits_are_reported_as_their_ensemble(stacked):
  results = predictions.evaluate_predictions(**stacked, calibrators=("temperature",),
                                             bootstrap_samples=0)
  test_x, test_y = stacked["test_logits"], stacked["test_labels"]
  p_bar = np.mean(jax.nn.softmax(test_x, -1), 0)
  raw = results["calibrators"]["raw"]["test"]
  assert raw["ece"] == pytest.approx(float(metrics.ece(p_bar, test_y)), abs=1e-6)
  assert raw["nll"] == pytest.approx(-np.mean(np.log(p_bar[np.arange(300), test_y])), abs=1e-5)
  # The temperature is fitted on log p̄ of the validation members.
  log_p_val = np.log(np.mean(jax.nn.softmax(stacked["val_logits"], -1), 0))
  scaled = posthoc.fit_calibrator("temperature", log_p_val, stacked["val_labels"])
  assert results["calibrators"]["temperature"]["test"]["nll"] == pytest.approx(
      float(metrics.nll(scaled(np.log(p_bar)), test_y)), abs=1e-4)
  part = results["ensemble"]
  assert part["num_members"] == 3 and len(part["members"]) == 3
  eces = [float(metrics.ece(jax.nn.softmax(z, -1), test_y)) for z in test_x]
  assert [m["ece"] for m in part["members"]] == pytest.approx(eces, abs=1e-6)
  assert part["mean_member"]["ece"] == pytest.approx(np.mean(eces), abs=1e-6)
  assert part["ensemble"]["nll"] == raw["nll"] < part["mean_member"]["nll"]  # Jensen
  # The ensemble's scores detect its wrong predictions and the OOD set.
  wrong = p_bar.argmax(-1) != test_y
  mi = results["failure"]["mutual_information"]
  assert mi["auroc"] == pytest.approx(float(metrics.auroc(
      -np.asarray(calib_jax.ensemble.mutual_information(test_x)), wrong)), abs=1e-6)
  assert {"predictive_entropy", "expected_entropy", "disagreement", "msp"} <= set(
      results["failure"])
  # energy is logsumexp(log p̄) = 0 up to rounding for every sample: not a score of an ensemble.
  assert "energy" not in results["failure"] and "energy" not in results["ood"]
  assert results["ood"]["predictive_entropy"]["auroc"] > 0.9
  table = predictions.format_table(results)
  assert "mean member" in table and "member 2" in table
  assert "95 % interval" not in table  # bootstrap_samples=0: no intervals, no empty column


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "test_logits": a["test_logits"][:2]},
     r"^predictions: the members disagree in shape: val_logits 3, test_logits 2, ood_logits 3 "
     r"members"),
    (lambda a: {**a, "test_logits": a["test_logits"][0]},
     r"^predictions: val_logits is member-stacked \[M, N, C\] but test_logits is not"),
    (lambda a: {**a, "val_logits": [a["val_logits"][0], a["val_logits"][1][:, :3]]},
     r"^predictions: val_logits: ensemble members disagree in shape: member 1 has logits "
     r"\(300, 3\) but member 0 has \(300, 5\)"),
])
def test_bad_member_stacked_predictions_are_one_line_each(stacked, change, message):
  with pytest.raises(predictions.PredictionsError, match=message) as info:
    predictions.evaluate_predictions(**change(stacked))
  assert "\n" not in str(info.value)


def test_eval_command_reports_a_file_of_member_stacked_predictions(stacked, tmp_path):
  np.savez(tmp_path / "members.npz", **stacked)
  printed = _eval_in_process(f"--predictions={tmp_path / 'members.npz'}",
                             f"--workdir={tmp_path / 'out'}", "--bootstrap_samples=0")
  assert "mean member" in printed and "mutual_information" in printed
  written = json.loads((tmp_path / "out" / predictions.PREDICTIONS_DIR / "metrics.json")
                       .read_text())
  assert written["ensemble"]["num_members"] == 3


# Rows ranked by XLA's CPU sort (n <= 2048 with the cacheable sorts on) and by numpy's. Last in
# the module: it clears JAX's caches (the sort is chosen when a program is traced), which made
# every test after it trace again the programs `results` and `dispatched` had traced.
@pytest.mark.parametrize("n, cacheable", [(540, False), (540, True), (5000, False)])
def test_the_test_splits_aece_and_aurc_are_those_metrics_to_the_bit(n, cacheable):
  """`_rank_test_metrics` ranks once (`metrics.rank_summary`); `metrics.aece` and
  `metrics.aurc` rank once each: the same bits, on a random forest's kind of probabilities
  (vote fractions floored at 1e-4: many exact ties, which the groups and the AURC share)."""
  rng = np.random.default_rng(3)
  votes = np.stack([rng.multinomial(100, p) for p in rng.dirichlet(np.full(10, 0.3), n)])
  logits = np.log(np.maximum(votes / 100, 1e-4)).astype(np.float32)
  labels = np.where(rng.random(n) < 0.8, votes.argmax(1), rng.integers(0, 10, n))
  metrics.use_cacheable_cpu_sorts(cacheable)  # (conftest switches it back off)
  jax.clear_caches()  # the sort is chosen when a program is traced
  try:
    probs = jax.nn.softmax(logits, -1)
    confidence, correct = metrics.confidence_and_correct(probs, labels)
    got = predictions._rank_test_metrics(confidence, correct, 15)
    want = {"aece": metrics.aece(probs, labels, 15), "aurc": metrics.aurc(confidence, correct)}
  finally:
    jax.clear_caches()
  for key in want:
    assert np.asarray(got[key]).tobytes() == np.asarray(want[key]).tobytes(), key
