"""Plots render to valid, non-trivial PNG files."""
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from calib_jax import plotting

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _data(seed, n=400, c=5):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, c)) * 2.5
  probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
  labels = np.where(rng.random(n) < 0.6, probs.argmax(1), rng.integers(0, c, n))
  return probs.astype(np.float32), labels


def _check_png(path, min_width=300):
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[1] >= min_width and image.shape[0] >= 300
  assert image[..., :3].std() > 0.05  # not a blank canvas


def test_reliability_diagram(tmp_path):
  probs, labels = _data(0)
  path = plotting.reliability_diagram(probs, labels, str(tmp_path / "sub" / "rel.png"),
                                      num_bins=10, title="CE")
  _check_png(path)


def test_side_by_side_reliability_diagrams(tmp_path):
  models = {name: _data(seed) for seed, name in enumerate(("CE", "MbLS", "ACLS"))}
  path = plotting.reliability_diagrams(models, str(tmp_path / "three.png"), title="CIFAR")
  _check_png(path, min_width=900)
  with pytest.raises(ValueError, match="at least one"):
    plotting.reliability_diagrams({}, str(tmp_path / "none.png"))


def test_risk_coverage_plot(tmp_path):
  probs, labels = _data(1)
  correct = probs.argmax(1) == labels
  curves = {"msp": (probs.max(1), correct),
            "rounded (ties)": (np.round(probs.max(1), 1), correct)}
  path = plotting.risk_coverage_plot(curves, str(tmp_path / "rc.png"), title="RC",
                                     risk_levels=(0.05,))
  _check_png(path)


def test_smooth_reliability_diagram(tmp_path):
  probs, labels = _data(3)
  path = plotting.smooth_reliability_diagram(probs, labels, str(tmp_path / "smooth.png"),
                                             title="CE")
  _check_png(path)
  with pytest.raises(ValueError, match="bandwidth"):
    plotting.smooth_reliability_diagram(probs, labels, str(tmp_path / "x.png"), bandwidth=2.0)


def test_a_long_title_wraps_to_a_single_columns_width(tmp_path, monkeypatch):
  """One reliability column is 4.5 in wide; a longer title is wrapped, not cut at the edges."""
  titles, save = [], plotting.save_png

  def save_noting_the_title(fig, path):
    titles.append(fig._suptitle.get_text())
    return save(fig, path)
  monkeypatch.setattr(plotting, "save_png", save_noting_the_title)
  rng = np.random.default_rng(0)
  probs, labels = rng.dirichlet(np.ones(10), 50), rng.integers(0, 10, 50)
  title = "Fashion-MNIST test, seed 0, before temperature scaling"
  plotting.reliability_diagrams({"CE": (probs, labels)}, str(tmp_path / "one.png"), title=title)
  plotting.reliability_diagrams({"CE": (probs, labels), "LS": (probs, labels)},
                                str(tmp_path / "two.png"), title=title)
  assert "\n" in titles[0] and titles[0].replace("\n", " ") == title
  assert titles[1] == title


_WITHOUT_PYPLOT = (
    "import sys, numpy as np; from calib_jax import plotting; "
    "rng = np.random.default_rng(0); p = rng.dirichlet(np.ones(4), 200); "
    "y = rng.integers(0, 4, 200); "
    "plotting.reliability_diagrams({{'a': (p, y)}}, {out!r} + '/r.png', title='t'); "
    "plotting.smooth_reliability_diagram(p, y, {out!r} + '/s.png'); "
    "plotting.risk_coverage_plot({{'a': (p.max(-1), p.argmax(-1) == y)}}, {out!r} + '/c.png'); "
    "print('matplotlib.pyplot' in sys.modules)")


def test_the_diagrams_are_drawn_without_pyplot_and_its_figures_are_still_closed(tmp_path):
  """`plotting`'s figures never import pyplot (its start-up is eval.py's time) nor enter its
  registry; `save_png` closes a pyplot figure (`plotting_maps`, `plotting_shift` make them)."""
  # Deferred: only this test makes pyplot figures.
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", _WITHOUT_PYPLOT.format(out=str(tmp_path))],
                        capture_output=True, text=True, timeout=300, cwd=root,
                        env={**os.environ, "PYTHONPATH": root})
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().splitlines()[-1] == "False"
  for name in ("r", "s", "c"):
    _check_png(tmp_path / f"{name}.png")
  before = plt.get_fignums()
  probs, labels = _data(3)
  plotting.reliability_diagram(probs, labels, str(tmp_path / "one.png"))
  assert plt.get_fignums() == before
  fig = plt.figure()
  plotting.save_png(fig, str(tmp_path / "pyplot.png"))
  assert plt.get_fignums() == before
