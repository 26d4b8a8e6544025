"""User mistakes in configs and overrides: one line on stderr, exit status 1, no traceback."""
import os

import ml_collections
import pytest

from calib_jax import config as config_lib
from fixtures import forked_programs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


MISTAKES = [
    (["--config.lr=0.1"], "unknown config field 'lr'; did you mean 'optimizer.learning_rate'?"),
    # A field of the flat schema that moved into a sub-config names its new place.
    (["--config.batch_size=64"], "unknown config field 'batch_size'; did you mean "
                                 "'data.batch_size'?"),
    (["--config.eval.num_binz=3"], "unknown config field 'eval.num_binz'; did you mean "
                                   "'eval.num_bins'?"),
    (["--config.optimizer.learning_rate=abc"], "could not convert string to float: 'abc'"),
    (["--config=configs/no_such_file.py"], "config file 'configs/no_such_file.py' does not exist"),
    (["--config=configs/default.py:bogus"], "Unknown config variant 'bogus'; valid: ce,"),
    # A key added to a free-form dict is checked by the code it reaches.
    (["--config.data.options.downlaod=False"],
     "data.options: Unknown make_dataset option(s) ['downlaod']"),
]


@pytest.fixture(scope="module")
def train_py_runs(tmp_path_factory):
  """train.py once per mistake, each a fresh train.py process forked from one that imported
  TensorFlow and JAX once (tests/fixtures/forked_programs.py): {args: (process, workdir)}."""
  workdirs = [tmp_path_factory.mktemp("mistake") for _ in MISTAKES]
  runs = [("calib_jax.cli.train:run", ["train.py", "--config=configs/default.py",
                                      f"--workdir={workdir}", *args])
          for (args, _), workdir in zip(MISTAKES, workdirs)]
  done = forked_programs.run_programs(runs, cwd=ROOT,
                                      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                                           "PYTHONPATH": ROOT})
  return {tuple(args): (proc, workdir)
          for (args, _), proc, workdir in zip(MISTAKES, done, workdirs)}


@pytest.mark.parametrize("args,expected", MISTAKES)
def test_train_py_reports_config_mistakes_in_one_line(args, expected, train_py_runs):
  proc, tmp_path = train_py_runs[tuple(args)]
  assert proc.returncode == 1
  lines = [l for l in proc.stderr.splitlines() if l.startswith("train.py:")]
  # One line, or for value problems the one `Invalid config:` list (a line per problem).
  assert len(lines) == 1 and expected in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  # Nothing was started: at most the log, which records the error (value problems are found
  # once the console is set up, before anything is built).
  assert set(os.listdir(tmp_path)) <= {"log.txt"}


def test_config_file_with_an_unknown_field_fails_where_it_is_set(tmp_path):
  path = tmp_path / "typo.py"
  path.write_text("from calib_jax.config import base_config\n"
                  "def get_config():\n  c = base_config()\n  c.optimizer.weight_decy = 0.1\n"
                  "  return c\n")
  with pytest.raises(config_lib.ConfigError,
                     match=r"sets unknown config field 'weight_decy'; did you mean "
                           r"'optimizer.weight_decay'\?"):
    config_lib.load_config_file(str(path))


def test_free_form_sub_dicts_stay_open_and_the_rest_is_locked():
  config = config_lib.base_config()
  config.model_kwargs.widths = (4, 8)
  config.loss_kwargs = ml_collections.ConfigDict({"margin": 6.0})
  config.data.splits.train = "train[:100]"
  with pytest.raises(AttributeError):
    config.eval.num_binz = 3
  assert config_lib.unknown_field_message(config, "eval.num_bins") is None
  assert "fields of eval" in config_lib.unknown_field_message(config, "eval.zzz")


@pytest.mark.parametrize("spec", ["configs/default.py:mbls", "configs/cifar10_resnet50.py:mbls",
                                  "configs/newsgroups20_gpool_cnn.py:mbls",
                                  "configs/imagenet_vit_s16_sam.py",
                                  "configs/cityscapes_deeplabv3plus_resnet101.py"])
def test_a_saved_config_reads_back_as_the_same_config(spec, tmp_path):
  """What train.py writes as config.json (`reporting.save_config`: `to_json_best_effort`) reads
  back as a config that writes the same JSON and differs in no field (tuples stay tuples)."""
  config = config_lib.load_config_file(spec)
  path = tmp_path / "config.json"
  path.write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  read = config_lib.saved.read_saved_config(str(path))
  assert read.to_json_best_effort(indent=2, sort_keys=True) + "\n" == path.read_text()
  assert config_lib.saved.differences(read, config) == []
  assert read.eval.calibrators == tuple(config.eval.calibrators)


def test_differences_name_each_field_with_both_values():
  run = config_lib.load_config_file("configs/default.py:ce")
  other = config_lib.load_config_file("configs/default.py:mbls")
  other.optimizer.learning_rate = run.optimizer.learning_rate * 2
  assert config_lib.saved.differences(run, other, ("model", "model_kwargs")) == []
  changed = dict((name, (a, b)) for name, a, b in config_lib.saved.differences(run, other))
  assert changed["loss"] == ("ce", "mbls")
  assert changed["optimizer.learning_rate"] == (run.optimizer.learning_rate,
                                                other.optimizer.learning_rate)
  assert changed["loss_kwargs.margin"] == (None, other.loss_kwargs.margin)  # a free-form key


@pytest.mark.parametrize("text,expected", [
    ("{not json", r"is not a config saved by train.py \("),
    ('{"no_such_field": 1}', r"does not fit this version's config fields \(.*no_such_field"),
])
def test_a_damaged_saved_config_is_one_line(text, expected, tmp_path):
  path = tmp_path / "config.json"
  path.write_text(text)
  with pytest.raises(config_lib.ConfigError, match=expected) as info:
    config_lib.saved.read_saved_config(str(path))
  assert "\n" not in str(info.value)
