"""The shift pictures render valid PNGs from results["shift"] dicts, and refuse wrong input in
one line."""
import matplotlib.image
import numpy as np
import pytest

from calib_jax import plotting_shift
from test_plotting import _check_png

CORRUPTIONS = ("gaussian_noise", "defocus_blur", "fog", "contrast", "jpeg_compression")
METHODS = ("pre_temperature", "post_temperature", "isotonic")


def _cell(rng, accuracy):
  """{METHOD: {METRIC: value}} with metrics that worsen as `accuracy` drops."""
  return {method: {"accuracy": accuracy, "ece": (1 - accuracy) * rng.uniform(0.2, 0.6),
                   "aece": (1 - accuracy) * rng.uniform(0.2, 0.6),
                   "nll": -np.log(accuracy) * rng.uniform(1, 2),
                   "brier": (1 - accuracy) * rng.uniform(1, 1.5),
                   "aurc": (1 - accuracy) ** 2}
          for method in METHODS}


def corruption_results(seed, clean_accuracy=0.92):
  """A results["shift"] dict of kind "corruptions" (synthetic numbers, for pictures only)."""
  rng = np.random.default_rng(seed)
  corruptions = {
      name: {str(s): _cell(rng, clean_accuracy - 0.08 * s * rng.uniform(0.5, 1.5))
             for s in range(1, 6)} for name in CORRUPTIONS}
  return {"table": "cifar10", "kind": "corruptions", "clean": _cell(rng, clean_accuracy),
          "corruptions": corruptions, "summary": {}}


def rotation_results(seed):
  rng = np.random.default_rng(seed)
  return {"table": "", "kind": "rotate", "clean": _cell(rng, 0.9),
          "rotate": {str(a): _cell(rng, 0.9 - 0.7 * np.sin(np.radians(a)) ** 2 * rng.uniform(
              0.8, 1.0)) for a in range(0, 181, 15)}}


def test_boxplots_of_several_runs(tmp_path):
  runs = {"CE": corruption_results(0), "CE + TS": corruption_results(1, 0.91),
          "MbLS": corruption_results(2, 0.93)}
  path = plotting_shift.shift_boxplots(runs, str(tmp_path / "sub" / "boxes.png"))
  _check_png(path, min_width=600)
  one = plotting_shift.shift_boxplots({"CE": runs["CE"]}, str(tmp_path / "one.png"),
                                      metrics=("nll", "brier", "aurc"),
                                      method="post_temperature")
  _check_png(one, min_width=900)


def test_boxes_are_drawn_over_the_corruptions_values(tmp_path, monkeypatch):
  """Each severity's box holds the 5 corruptions' values of that severity (in %), per run."""
  drawn = []
  import matplotlib.axes
  original = matplotlib.axes.Axes.boxplot

  def noting(self, x, *args, **kwargs):
    drawn.append(([np.asarray(v) for v in x], list(kwargs["positions"])))
    return original(self, x, *args, **kwargs)
  monkeypatch.setattr(matplotlib.axes.Axes, "boxplot", noting)
  runs = {"A": corruption_results(0), "B": corruption_results(1)}
  plotting_shift.shift_boxplots(runs, str(tmp_path / "b.png"), metrics=("ece",))
  assert len(drawn) == 2  # one call per run, 5 boxes each
  (values_a, positions_a), (_, positions_b) = drawn
  expected = [100 * runs["A"]["corruptions"][c]["3"]["pre_temperature"]["ece"]
              for c in sorted(CORRUPTIONS)]
  np.testing.assert_allclose(np.sort(values_a[2]), np.sort(expected))
  assert np.all(np.array(positions_a) < np.array(positions_b))  # side by side, A left of B
  np.testing.assert_allclose(np.array(positions_a) + np.array(positions_b), 2 * np.arange(1, 6))


def test_rotation_curves(tmp_path):
  runs = {"CE": rotation_results(0), "ensemble": rotation_results(1)}
  path = plotting_shift.rotation_curves(runs, str(tmp_path / "rot.png"), method="isotonic")
  _check_png(path, min_width=900)
  image = matplotlib.image.imread(path)
  assert image.shape[0] < image.shape[1]  # a row of panels


@pytest.mark.parametrize("draw,runs,kwargs,message", [
    ("shift_boxplots", {}, {}, "at least one label"),
    ("rotation_curves", {}, {}, "at least one label"),
    ("shift_boxplots", {"CE": corruption_results(0)}, {"metrics": ("ece", "acc")},
     r"unknown metric\(s\) \['acc'\]; valid metrics: accuracy, ece"),
    ("shift_boxplots", {"CE": corruption_results(0)}, {"metrics": "ece"}, "sequence of names"),
    ("shift_boxplots", {"CE": rotation_results(0)}, {},
     "holds a 'rotate' shift, not 'corruptions'; draw it with plotting_shift.rotation_curves"),
    ("rotation_curves", {"CE": corruption_results(0)}, {},
     "holds a 'corruptions' shift, not 'rotate'; draw it with plotting_shift.shift_boxplots"),
    ("shift_boxplots", {"CE": {"accuracy": 0.9}}, {}, "not a results\\['shift'\\] dict"),
    ("shift_boxplots", {"CE": corruption_results(0)}, {"method": "vector"},
     "no method 'vector' at the clean test set; its methods: pre_temperature, post_temperature"),
    ("rotation_curves", {"CE": rotation_results(0)}, {"method": "vector"},
     "no method 'vector' at 0°"),
])
def test_wrong_input_is_one_line(tmp_path, draw, runs, kwargs, message):
  path = tmp_path / "x.png"
  with pytest.raises(ValueError, match=message) as info:
    getattr(plotting_shift, draw)(runs, str(path), **kwargs)
  assert len(str(info.value).splitlines()) == 1
  assert not path.exists()


def test_a_run_without_some_severities_or_values_still_draws(tmp_path):
  """Severities a run lacks leave its boxes out; missing or NaN values are not drawn."""
  partial = corruption_results(3)
  for by_severity in partial["corruptions"].values():
    del by_severity["5"]
  partial["corruptions"]["fog"]["2"]["pre_temperature"]["ece"] = float("nan")
  del partial["corruptions"]["fog"]["1"]["pre_temperature"]["aurc"]
  path = plotting_shift.shift_boxplots({"full": corruption_results(4), "partial": partial},
                                       str(tmp_path / "p.png"), metrics=("ece", "aurc"))
  _check_png(path)
