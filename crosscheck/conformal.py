"""Cross-check calib_jax.conformal against MAPIE's split-conformal classifier (a bench extra),
and SAPS and class-conditional (Mondrian) sets against TorchCP's.

Run in a venv with MAPIE (not a test dependency; with torch-uncertainty installed its THR and APS
are compared too; with TorchCP installed its SAPS and ClassConditionalPredictor):

    python3 -m venv /work/venvs/conformal
    /work/venvs/conformal/bin/pip install jax mapie
    /work/venvs/conformal/bin/pip install torch==2.13.0 && pip install --no-deps torchcp==1.2.1
    /work/venvs/conformal/bin/pip install --no-deps -e .
    /work/venvs/conformal/bin/python crosscheck/conformal.py

(TorchCP's package imports its graph, LLM and torchsort-based parts on import; `_torchcp` loads
only the classification scores and predictors it needs, so `--no-deps` suffices.)

Both libraries get the same probabilities (MAPIE through a prefit classifier whose
`predict_proba` returns them). Printed per method and α: the thresholds q̂, how many test sets
differ, coverage, mean set size and the worst class's coverage (the
Mondrian rows print the mean of their per-class q̂_k, and `Δq̂`, the largest difference of a
class's threshold from calib_jax's). Synthetic data: logits `2·N(0, 1)` with labels drawn from
their softmax (exchangeable, so every method should cover about 1 − α). The differences and
their causes are in docs/conformal.md ("Cross-check against MAPIE").
"""
import importlib.util
import os
import sys
import types

from absl import app, flags
import jax
import mapie
import numpy as np
from mapie.classification import SplitConformalClassifier
from sklearn.base import BaseEstimator, ClassifierMixin

from calib_jax import conformal

_N_CAL = flags.DEFINE_integer("n_cal", 5000, "calibration samples")
_N_TEST = flags.DEFINE_integer("n_test", 20000, "test samples")
_CLASSES = flags.DEFINE_list("classes", ["10", "100"], "comma-separated class counts C")
_OVERCONFIDENT = flags.DEFINE_boolean("overconfident", False,
                                      "saturated float32 softmax (see _data)")


class _GivenProbabilities(ClassifierMixin, BaseEstimator):
  """A 'fitted' classifier whose inputs are already its probabilities."""

  def __init__(self, num_classes: int = 10):
    self.num_classes = num_classes
    self.classes_ = np.arange(num_classes)
    self.n_features_in_ = num_classes

  def fit(self, x, y):
    return self

  def predict_proba(self, x):
    return np.asarray(x, np.float64)

  def predict(self, x):
    return np.asarray(x).argmax(-1)


def _data(seed: int, n: int, num_classes: int, overconfident: bool):
  """Logits `2·N(0, 1)` with labels drawn from their softmax (a calibrated model), or with
  `--overconfident` logits `20·N(0, 1)` with labels from `softmax(z / 4)` (float32 softmax
  saturates: p_max = 1.0 for about a fifth of the samples)."""
  rng = np.random.default_rng(seed)
  scale, temperature = (20.0, 4.0) if overconfident else (2.0, 1.0)
  logits = (scale * rng.normal(size=(n, num_classes))).astype(np.float32)
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))  # float32, the same for both libraries
  label_probs = np.asarray(jax.nn.softmax(logits / temperature, axis=-1))
  cdf = np.cumsum(label_probs.astype(np.float64), axis=-1)
  cdf /= cdf[:, -1:]
  labels = (rng.uniform(size=(n, 1)) > cdf).sum(-1).clip(0, num_classes - 1).astype(np.int32)
  return probs, labels


def _mapie(score: str, probs, labels, test, alpha, params=None):
  clf = SplitConformalClassifier(_GivenProbabilities(probs.shape[1]), confidence_level=1 - alpha,
                                 conformity_score=score, prefit=True, random_state=0)
  clf.conformalize(probs, labels)
  sets = clf.predict_set(test, conformity_score_params=params)[1][:, :, 0]
  qhat = float(np.ravel(clf._mapie_classifier.conformity_score_function_.quantiles_)[0])
  return qhat, sets


def _torch_uncertainty(probs, labels, test, alpha):
  """torch-uncertainty 0.13's THR and APS (not randomised) on the same probabilities (its
  model is the identity on their logs; its temperature scaling is off): `(name, q̂, sets)`."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
    from torch_uncertainty import post_processing as tu  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"torch-uncertainty unavailable: {e}")
    return []
  loader = [(torch.log(torch.from_numpy(probs)), torch.from_numpy(labels.astype(np.int64)))]
  out = []
  for name, method in (("thr", tu.ConformalClsTHR(alpha, model=torch.nn.Identity(),
                                                  enable_ts=False)),
                       ("aps randomized=False", tu.ConformalClsAPS(
                           alpha, model=torch.nn.Identity(), randomized=False,
                           enable_ts=False))):
    method.fit(loader)
    sets = method.conformal(torch.log(torch.from_numpy(test))).numpy() > 0
    out.append((f"torch-uncertainty {name}", float(method.q_hat), sets))
  return out


def _torchcp():
  """TorchCP's classification scores and predictors, or None. Its `__init__` imports the graph
  (torch_geometric), LLM (transformers) and torchsort-based training parts, which the scores do
  not use: the packages on the way are registered empty, so only the modules named load."""
  spec = importlib.util.find_spec("torchcp")
  if spec is None:
    print("TorchCP unavailable")
    return None
  root = os.path.dirname(spec.origin)
  for name in ("torchcp", "torchcp.classification", "torchcp.classification.score",
               "torchcp.classification.predictor"):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(root, *name.split(".")[1:])]
    sys.modules.setdefault(name, package)
  # pylint: disable=import-outside-toplevel
  from torchcp.classification.predictor.class_conditional import ClassConditionalPredictor
  from torchcp.classification.predictor.split import SplitPredictor
  from torchcp.classification.score.aps import APS
  from torchcp.classification.score.lac import LAC
  from torchcp.classification.score.saps import SAPS
  with open(os.path.join(root, "VERSION"), encoding="utf-8") as f:
    version = f.read().strip()
  return types.SimpleNamespace(version=version, split=SplitPredictor,
                               class_conditional=ClassConditionalPredictor,
                               scores={"thr": LAC, "aps": APS, "saps": SAPS})


def _torchcp_sets(tcp, name, conditional, probs, labels, test, alpha, randomized, seed=0):
  """TorchCP's q̂ (scalar or [C]) and sets on the same float32 probabilities (`score_type=
  "identity"`); its non-randomised APS and SAPS (U = 0) are our u = 1."""
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(seed)
  if name == "thr":
    score = tcp.scores["thr"](score_type="identity")
  else:
    score = tcp.scores[name](score_type="identity", randomized=randomized)
  predictor = (tcp.class_conditional if conditional else tcp.split)(score, alpha=alpha)
  predictor.calculate_threshold(torch.tensor(probs), torch.tensor(labels, dtype=torch.int64),
                                alpha)
  sets = predictor.predict_with_logits(torch.tensor(test)).numpy() > 0
  return np.asarray(predictor.q_hat.numpy() if hasattr(predictor.q_hat, "numpy")
                    else predictor.q_hat, np.float64), sets


def _numpy_class_quantiles(scores, labels, num_classes, alpha):
  """The Mondrian thresholds from their definition: class k's ⌈(n_k + 1)(1 − α)⌉-th smallest
  score (float64 on the host)."""
  out = np.full(num_classes, np.inf)
  for k in range(num_classes):
    s = np.sort(scores[labels == k])
    rank = int(np.ceil((len(s) + 1) * (1 - alpha)))
    if rank <= len(s):
      out[k] = s[rank - 1]
  return out


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  n_cal, n_test, overconfident = _N_CAL.value, _N_TEST.value, _OVERCONFIDENT.value
  tcp = _torchcp()
  print(f"MAPIE {mapie.__version__}, TorchCP {tcp.version if tcp else '-'}, jax "
        f"{jax.__version__}; n_cal={n_cal}, n_test={n_test}, "
        f"{'overconfident' if overconfident else 'calibrated'} model")
  header = (f"{'C':>4} {'alpha':>5}  {'method':<40} {'q̂':>9} {'differ':>7} {'coverage':>9} "
            f"{'size':>6} {'worst':>6} {'Δq̂':>8}")
  print(header)
  for c in (int(x) for x in _CLASSES.value):
    probs, labels = _data(c, n_cal + n_test, c, overconfident)
    cal, test = slice(0, n_cal), slice(n_cal, None)
    for alpha in (0.1, 0.05):
      def row(label, qhat, sets, ref=None, ref_qhat=None):
        differ = "" if ref is None else str(int((sets != ref).any(-1).sum()))
        cov = float(conformal.coverage(sets, labels[test]))
        size = float(conformal.mean_set_size(sets))
        worst = float(conformal.class_conditional_coverage(sets, labels[test]).worst)
        qhat = np.asarray(qhat, np.float64)
        dq = "" if ref_qhat is None else f"{np.max(np.abs(qhat - ref_qhat)):>8.1e}"
        print(f"{c:>4} {alpha:>5}  {label:<40} {float(np.mean(qhat)):>9.6f} {differ:>7} "
              f"{cov:>9.4f} {size:>6.3f} {worst:>6.3f} {dq:>8}")

      ours = conformal.fit("thr", probs[cal], labels[cal], alpha, from_logits=False)
      ours_sets = np.asarray(ours(probs[test]))
      q, sets = _mapie("lac", probs[cal], labels[cal], probs[test], alpha)
      row("calib_jax thr", float(ours.qhat), ours_sets)
      row("mapie lac", q, sets, ours_sets)
      references = _torch_uncertainty(probs[cal], labels[cal], probs[test], alpha)
      for label, q, sets in references[:1]:
        row(label, q, sets, ours_sets)

      for randomized in (False, True):
        p = conformal.fit("aps", probs[cal], labels[cal], alpha, from_logits=False,
                          randomized=randomized, key=jax.random.key(0))
        p_sets = np.asarray(p(probs[test], key=jax.random.key(1)))
        row(f"calib_jax aps randomized={randomized}", float(p.qhat), p_sets)
        if not randomized:
          aps_sets = p_sets
      for label, q, sets in references[1:]:
        row(label, q, sets, aps_sets)
      for last in (True, "randomized", False):
        q, sets = _mapie("aps", probs[cal], labels[cal], probs[test], alpha,
                         {"include_last_label": last})
        row(f"mapie aps include_last_label={last}", q, sets)
      for randomized in (False, True):
        p = conformal.fit("raps", probs[cal], labels[cal], alpha, from_logits=False,
                          randomized=randomized, key=jax.random.key(0))
        row(f"calib_jax raps randomized={randomized}", float(p.qhat),
            np.asarray(p(probs[test], key=jax.random.key(1))))
      _saps_and_mondrian_rows(row, tcp, probs[cal], labels[cal], probs[test], alpha)
    print()


def _saps_and_mondrian_rows(row, tcp, probs, labels, test, alpha):
  """SAPS (marginal) and THR, APS, SAPS with conditional="class" against TorchCP (deterministic
  scores: q̂ and sets must agree; randomised: coverage and size within Monte Carlo error, TorchCP
  drawing one u per class at prediction where we draw one per sample) and the Mondrian thresholds
  against their numpy definition."""
  num_classes = probs.shape[1]
  for name, conditional in (("saps", None), ("thr", "class"), ("aps", "class"),
                            ("saps", "class")):
    for randomized in ((False,) if name == "thr" else (False, True)):
      kw = {} if name == "thr" else {"randomized": randomized}
      p = conformal.fit(name, probs, labels, alpha, conditional=conditional, from_logits=False,
                        key=jax.random.key(0), **kw)
      ours = np.asarray(p(test, key=jax.random.key(1)))
      suffix = ("" if name == "thr" else f" randomized={randomized}") + (
          " class" if conditional else "")
      row(f"calib_jax {name}{suffix}", p.qhat, ours)
      if conditional and not randomized:
        cal_scores = np.asarray(p.scores(probs), np.float64)[np.arange(len(labels)), labels]
        reference = _numpy_class_quantiles(cal_scores, labels, num_classes, alpha)
        row(f"numpy {name}{suffix}", reference, np.asarray(p.scores(test)) <= reference[None],
            ours, np.asarray(p.qhat))
      if tcp is not None:
        qhat, sets = _torchcp_sets(tcp, name, conditional, probs, labels, test, alpha,
                                   randomized)
        row(f"torchcp {name}{suffix}", qhat, sets, None if randomized else ours,
            None if randomized else np.asarray(p.qhat))


if __name__ == "__main__":
  app.run(main)
