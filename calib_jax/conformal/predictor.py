"""`fit`: a split-conformal set predictor calibrated on held-out logits.

`fit(name, val_logits, val_labels, alpha)` scores every calibration sample's label, takes the
conformal quantile `q̂` of the scores and returns a `ConformalPredictor`, whose call maps test
logits to the boolean set mask `{y : s(x, y) ≤ q̂}`. With exchangeable calibration and test
data the set holds the true label with probability ≥ 1 − α (Vovk et al. 2005; Lei et al. 2018).
With `conditional="class"` (Mondrian split conformal) each class k gets its own threshold
`q̂_k` from its own calibration samples, and `{y : s(x, y) ≤ q̂_y}` holds the label with
probability ≥ 1 − α given the label, for every class (Vovk 2012).
"""
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax.conformal import _inputs
from calib_jax.conformal import scores as scores_lib
from calib_jax import arrays

ArrayLike = jax.typing.ArrayLike

# Extra keyword arguments of each method beyond the common ones (key, mask, from_logits), with
# defaults. APS and RAPS are randomised by default: see `fit`.
_METHODS: dict[str, dict[str, Any]] = {
    "thr": {},
    "aps": {"randomized": True},
    # λ = 0.01, k_reg = 5: Angelopoulos & Bates' ImageNet RAPS example (a gentle introduction
    # to conformal prediction, 2021); tune them on held-out data for another task.
    "raps": {"randomized": True, "lam": 0.01, "k_reg": 5},
    # λ = 0.2: TorchCP's default rank weight (its `weight`; TorchCP 1.2); Huang et al. tune λ
    # on held-out data per task.
    "saps": {"randomized": True, "lam": 0.2},
}
# None: one marginal threshold; "class": Mondrian, a threshold per class.
CONDITIONAL = (None, "class")
_COMMON = ("key", "mask", "from_logits")


def names() -> list[str]:
  """The conformal methods `fit` accepts."""
  return list(_METHODS)


def _all_scores(name: str, probs: jax.Array, u: Optional[jax.Array], lam: float,
                k_reg: int) -> jax.Array:
  if name == "thr":
    return scores_lib.thr_scores(probs)
  if name == "aps":
    return scores_lib.aps_scores(probs, u)
  if name == "saps":
    return scores_lib.saps_scores(probs, u, lam)
  return scores_lib.raps_scores(probs, u, lam, k_reg)


_STATIC = ("name", "lam", "k_reg", "from_logits")

# Rows scored at a time by the sorting scores: their temporaries (sort, cumulative sums) take a
# few [block, C] arrays instead of [N, C] ones, ~6 × 100 MB at N = 25,000, C = 1,000.
_BLOCK_ROWS = 2048


def _by_rows(fn, blocked: bool, *arrays):
  """`fn(*arrays)` computed on blocks of `_BLOCK_ROWS` rows (arrays `[N, ...]` or None; the
  last block zero-padded), its outputs cut back to N rows. Each row's result is the same."""
  n = arrays[0].shape[0]
  if not blocked or n <= _BLOCK_ROWS:
    return fn(*arrays)
  blocks = -(-n // _BLOCK_ROWS)

  def split(a):
    if a is None:
      return None
    a = jnp.pad(a, [(0, blocks * _BLOCK_ROWS - n)] + [(0, 0)] * (a.ndim - 1))
    return a.reshape((blocks, _BLOCK_ROWS) + a.shape[1:])

  out = lax.map(lambda args: fn(*args), tuple(split(a) for a in arrays))
  return jax.tree.map(lambda o: o.reshape((blocks * _BLOCK_ROWS,) + o.shape[2:])[:n], out)


def _block_scores(x, u, *, name, lam, k_reg, from_logits):
  probs = jax.nn.softmax(x, axis=-1) if from_logits else x
  return _all_scores(name, probs, u, lam, k_reg)


def _uniforms(key, n: int):
  return None if key is None else jax.random.uniform(key, (n,), jnp.float32)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _scores(x, key, *, name, lam, k_reg, from_logits):
  """All-class scores of `x [N, C]`; `key` draws the uniforms of randomised scores (or None)."""
  fn = functools.partial(_block_scores, name=name, lam=lam, k_reg=k_reg, from_logits=from_logits)
  return _by_rows(fn, name != "thr", x, _uniforms(key, x.shape[0]))


@functools.partial(jax.jit, static_argnames=_STATIC)
def _sets(x, key, qhat, *, name, lam, k_reg, from_logits):
  def fn(xb, ub):
    return _block_scores(xb, ub, name=name, lam=lam, k_reg=k_reg, from_logits=from_logits) <= qhat
  return _by_rows(fn, name != "thr", x, _uniforms(key, x.shape[0]))


@functools.partial(jax.jit, static_argnames=_STATIC + ("conditional",))
def _calibrate(x, labels, mask, key, ranks, *, name, lam, k_reg, from_logits, conditional):
  """`q̂` of the label scores, `[]` or `[C]` per class (one compiled program for the whole fit,
  whatever α)."""
  def fn(xb, ub, yb):
    return scores_lib.label_scores(
        _block_scores(xb, ub, name=name, lam=lam, k_reg=k_reg, from_logits=from_logits), yb)
  label_scores = _by_rows(fn, name != "thr", x, _uniforms(key, x.shape[0]), labels)
  if conditional == "class":
    return scores_lib.class_quantiles_from_ranks(label_scores, labels, x.shape[-1], ranks, mask)
  return scores_lib.quantile_from_ranks(label_scores, ranks, mask)


@functools.partial(jax.jit, static_argnames=("methods", "from_logits"))
def _method_scores(x, key, labels, uniforms, *, methods, from_logits):
  def fn(xb, ub, yb=None):
    probs = jax.nn.softmax(xb, axis=-1) if from_logits else xb
    if yb is None:
      return scores_lib.scores_of_methods(probs, ub, methods)
    out, order = scores_lib.sorted_scores_of_methods(probs, ub, methods)
    rank = None if order is None else scores_lib.rank_of(order, yb)  # no scatter back
    return tuple(scores_lib.label_scores(s, yb if name == "thr" else rank)
                 for (name, _, _), s in zip(methods, out))
  return _by_rows(fn, any(name != "thr" for name, _, _ in methods), x,
                  _uniforms(key, x.shape[0]) if uniforms is None else uniforms,
                  *(() if labels is None else (labels,)))


def _methods_of(names: Sequence[str]) -> tuple:  # (name, lam, k_reg) at `fit`'s defaults
  for name in names:
    if name not in _METHODS:
      raise ValueError(f"unknown conformal method {name!r}; valid names: {list(_METHODS)}")
  return tuple((name, float(_METHODS[name].get("lam", 0.0)),
                int(_METHODS[name].get("k_reg", 0))) for name in names)


def method_uniforms(n: int, *, calibration: bool, key: Optional[jax.Array] = None) -> jax.Array:
  """The `[n]` uniforms `method_scores` (and `fit`, or the predictor call with
  `calibration=False`) draw for n rows from `key` (default: the same fixed key as there)."""
  return _uniforms(_randomized_key(True, key, "fit" if calibration else "the predictor call"), n)


def method_scores(x: ArrayLike, names: Sequence[str], *, calibration: bool,
                  labels: Optional[ArrayLike] = None, key: Optional[jax.Array] = None,
                  uniforms: Optional[jax.Array] = None,
                  from_logits: bool = True) -> dict[str, jax.Array]:
  """The scores `[N, C]` of every class under several methods at `fit`'s defaults, the
  sorting ones (APS, RAPS, SAPS) from one sort of each row: several methods cost one. With
  `labels [N]` only each sample's label's score, `[N]` (row blocks: no `[N, C]` array kept).

  `method_scores(x, names, calibration=True, labels=y)[name]` holds the calibration scores
  `fit(name, x, y)` thresholds (`threshold` gives its `q̂`), and with `calibration=False`
  `method_scores(x, names)[name]` those of `fit(name, ...).scores(x)`, the predictor's: the
  same uniforms (`key`, default the same fixed key as there) and the same values, bit for bit.
  `uniforms [N]` replaces the draw (rows of a larger array: a slice of `method_uniforms`).
  Jit-able.
  """
  methods = _methods_of(names)
  if any(name != "thr" for name in names) and not all(
      _METHODS[name].get("randomized", False) for name in names if name != "thr"):
    raise ValueError("method_scores draws one set of uniforms for the sorting methods")
  key = _randomized_key(any(name != "thr" for name in names), key,
                        "fit" if calibration else "the predictor call")
  x, labels = _check_inputs(x, labels, None, "logits")
  if uniforms is not None:
    uniforms = jnp.asarray(uniforms, jnp.float32).reshape(x.shape[0])
  return dict(zip(names, _method_scores(x, key, labels, uniforms, methods=methods,
                                        from_logits=from_logits)))


def sorted_method_scores(probs: jax.Array, names: Sequence[str], uniforms: jax.Array
                         ) -> tuple[dict[str, jax.Array], Optional[jax.Array]]:
  """`method_scores(probs, names, calibration=False, uniforms=uniforms, from_logits=False)`
  before the scatter back to class order: `scores.sorted_scores_of_methods`. Jit-able."""
  scores, order = scores_lib.sorted_scores_of_methods(probs, uniforms, _methods_of(names))
  return dict(zip(names, scores)), order


def threshold(label_scores: jax.Array, labels: jax.Array, num_classes: int, alpha: float,
              conditional: Optional[str] = None) -> jax.Array:
  """`q̂` of calibration scores `[N]` (each sample's label's score) as `fit` computes it: a
  scalar, or `[C]` with `conditional="class"`. Jit-able (`alpha` a Python float)."""
  ranks = scores_lib.quantile_ranks(label_scores.shape[0], float(alpha))
  if conditional == "class":
    return scores_lib.class_quantiles_from_ranks(label_scores, labels, num_classes, ranks)
  return scores_lib.quantile_from_ranks(label_scores, ranks)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["qhat"],
                   meta_fields=["name", "alpha", "num_classes", "randomized", "lam", "k_reg",
                                "from_logits", "conditional"])
@dataclasses.dataclass(frozen=True)
class ConformalPredictor:
  """A fitted split-conformal predictor (a pytree: pass it through `jax.jit` freely).

  Attributes:
    qhat: the fitted threshold `q̂`: a float32 scalar array, or `[C]` (class k's threshold
      `q̂_k` at index k) when `conditional == "class"`.
    name: the method, one of `names()`.
    alpha: the target miscoverage; sets cover the label with probability ≥ 1 − alpha.
    num_classes: C.
    randomized: whether scores draw `u ~ U(0, 1)`, one per sample, from the call's `key`.
    lam, k_reg: the RAPS penalty, or SAPS' rank weight in `lam` (lam = 0 for THR and APS).
    from_logits: inputs are logits (softmax is applied) rather than probabilities.
    conditional: None (marginal coverage) or "class" (Mondrian: per-class thresholds).
  """
  qhat: jax.Array
  name: str
  alpha: float
  num_classes: int
  randomized: bool = False
  lam: float = 0.0
  k_reg: int = 0
  from_logits: bool = True
  conditional: Optional[str] = None

  def scores(self, logits: ArrayLike, key: Optional[jax.Array] = None) -> jax.Array:
    """Scores `s(x, y)` of every class: `[..., C] -> [..., C]` float32."""
    x = _check_inputs(logits, None, self.num_classes, "logits")[0]
    out = _scores(x, self._key(key), **self._static())
    return out.reshape(np.shape(logits))

  def __call__(self, logits: ArrayLike, key: Optional[jax.Array] = None) -> jax.Array:
    """Boolean set mask `[..., C]`: `s(x, y) ≤ q̂` (`≤ q̂_y`, class y's own threshold, when
    `conditional == "class"`).

    Args:
      logits: `[..., C]` test logits (probabilities when fitted with `from_logits=False`).
      key: PRNG key of the uniforms when `randomized` (default `jax.random.key(1)`, so the
        same logits give the same sets); ignored otherwise.
    """
    x = _check_inputs(logits, None, self.num_classes, "logits")[0]
    return _sets(x, self._key(key), self.qhat, **self._static()).reshape(np.shape(logits))

  def _key(self, key):
    return _randomized_key(self.randomized, key, "the predictor call")

  def _static(self) -> dict:
    return {"name": self.name, "lam": self.lam, "k_reg": self.k_reg,
            "from_logits": self.from_logits}


# Keys used when none is given: results are reproducible, and calibration and prediction draw
# independent uniforms (the same key would give test row i the u of calibration row i).
_DEFAULT_SEEDS = {"fit": 0, "the predictor call": 1}


def _randomized_key(randomized: bool, key, where: str):
  """The key of randomised scores (one uniform per sample), None for deterministic ones."""
  if not randomized:
    return None
  if key is None:
    return jax.random.key(_DEFAULT_SEEDS[where])
  dtype, shape = getattr(key, "dtype", None), np.shape(key)
  typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key) and shape == ()
  if not (typed or (dtype == jnp.uint32 and shape == (2,))):
    raise ValueError(f"key must be one PRNG key (jax.random.key(seed) or PRNGKey(seed)), got "
                     f"{type(key).__name__} of shape {shape}.")
  return key


_all_finite = jax.jit(lambda x: jnp.all(jnp.isfinite(x)))


def _check_inputs(x: ArrayLike, labels: Optional[ArrayLike], num_classes: Optional[int],
                  name: str):
  """Validates `x [..., C]` (and `labels [...]`), flattens them; `(x [N, C], labels [N])`."""
  n, c = _inputs.check_class_shape(x, labels, name, num_classes)
  x = arrays.as_float_array(x, name).reshape(n, c)
  if arrays.is_concrete(x) and not bool(_all_finite(x)):
    raise ValueError(f"{name} contain NaN or inf.")
  if labels is not None:
    labels = arrays.as_int_array(labels, "labels").reshape(n)
  return x, labels


def _check_options(name: str, alpha, conditional, kw: dict) -> dict:
  if name not in _METHODS:
    raise ValueError(f"unknown conformal method {name!r}; valid names: {names()}")
  if not any(conditional is c or (isinstance(conditional, str) and conditional == c)
             for c in CONDITIONAL):
    raise ValueError(f"unknown conditional {conditional!r}; valid: None (one marginal "
                     f"threshold) or 'class' (Mondrian: a threshold per class).")
  if isinstance(alpha, bool) or not isinstance(alpha, (float, int)) or not 0 < alpha < 1:
    raise ValueError(f"alpha must be a Python float in (0, 1), got {alpha!r}.")
  valid = list(_METHODS[name]) + list(_COMMON)
  unknown = sorted(set(kw) - set(valid))
  if unknown:
    raise ValueError(f"unknown argument(s) {unknown} for {name!r}; valid: {valid}")
  options = {**_METHODS[name], **{k: v for k, v in kw.items() if k in _METHODS[name]}}
  if not isinstance(options.get("randomized", False), bool):
    raise ValueError(f"randomized must be a bool, got {options['randomized']!r}.")
  lam = options.get("lam", 0.0)
  if isinstance(lam, bool) or not isinstance(lam, (float, int)) or not lam >= 0:
    raise ValueError(f"lam must be a float >= 0, got {lam!r}.")
  if name == "saps" and not lam > 0:  # λ = 0 ties every label below the top one
    raise ValueError(f"lam (the SAPS rank weight) must be a float > 0, got {lam!r}.")
  k_reg = options.get("k_reg", 0)
  if isinstance(k_reg, bool) or not isinstance(k_reg, (int, np.integer)) or k_reg < 0:
    raise ValueError(f"k_reg must be an int >= 0, got {k_reg!r}.")
  options["lam"], options["k_reg"] = float(lam), int(k_reg)
  return options


def check_class_sizes(labels: ArrayLike, num_classes: int, alpha: float,
                      mask: Optional[ArrayLike] = None) -> None:
  """Raises a one-line ValueError when a class has too few calibration samples for Mondrian
  conformal at `alpha`: `n_k < min_calibration_size(alpha)`, i.e. `⌈(n_k + 1)(1 − α)⌉ > n_k`
  (a class without samples included). `labels [N]` ints, `mask [N]` bool (concrete values)."""
  labels = np.asarray(labels).reshape(-1)
  if mask is not None:
    labels = labels[np.asarray(mask).reshape(-1)]
  counts = np.bincount(labels, minlength=num_classes)
  need = scores_lib.min_calibration_size(alpha)
  short = np.flatnonzero(counts < need)
  if short.size:
    k = int(short[np.argmin(counts[short])])
    listed = ", ".join(str(int(c)) for c in short[:8]) + (", ..." if short.size > 8 else "")
    raise ValueError(
        f"class {k} has {int(counts[k])} calibration samples, too few for conditional='class' "
        f"at alpha={alpha}: each class needs n_k >= {need} (⌈(n_k+1)(1−α)⌉ <= n_k); "
        f"{short.size} of {num_classes} classes have fewer ({listed}).")


def fit(name: str, val_logits: ArrayLike, val_labels: ArrayLike, alpha: float = 0.1, *,
        conditional: Optional[str] = None, **kw) -> ConformalPredictor:
  """Fits a split-conformal set predictor on held-out (calibration) logits.

  `q̂` is the k-th smallest calibration score, `k = ⌈(n + 1)(1 − α)⌉` (`conformal_quantile`).
  APS and RAPS are randomised by default. The non-randomised score (`u = 1`, the mass up to and
  including y) saturates on confident models: float32 softmax probabilities reach 1.0, the
  cumulative masses tie at 1.0, so `q̂` lands on 1.0 and the sets fill with every class, or, with
  `q̂ < 1`, the most confident samples get empty sets. Randomising breaks those ties, brings
  coverage closer to exactly 1 − α and gives smaller sets (Angelopoulos et al. 2021). Without a
  `key` a fixed one is used (`jax.random.key(0)` here, `key(1)` in the predictor call), so
  results are reproducible. Sets may be empty; the guarantee counts them as misses.

  `conditional="class"` (Mondrian split conformal, Vovk 2012) fits a threshold per class:
  `q̂_k` is the `⌈(n_k + 1)(1 − α)⌉`-th smallest score among the `n_k` calibration samples
  labelled k, and label k enters a test set when its score is ≤ `q̂_k`. Coverage then holds
  given the label, `P(y ∈ C(x) | y = k) ≥ 1 − α` for every k, at the price of larger sets on
  rare or hard classes; every class needs `n_k ≥ min_calibration_size(alpha)`.

  Args:
    name: one of `names()`: "thr" (LAC), "aps", "raps", "saps".
    val_logits: `[..., C]` calibration logits.
    val_labels: `[...]` int labels in [0, C).
    alpha: miscoverage level in (0, 1); target coverage 1 − alpha.
    conditional: None (default: one threshold, marginal coverage) or "class" (Mondrian: one
      threshold per class, coverage per class).
    **kw: `randomized` (aps, raps, saps; default True), `lam` (raps: λ ≥ 0, default 0.01;
      saps: the rank weight λ > 0, default 0.2), `k_reg`
      (raps, int ≥ 0, default 5), `key` (PRNG key of the uniforms when randomized; default
      `jax.random.key(0)`), `mask` (bool
      `[...]`, the calibration samples to use), `from_logits` (default True; False when the
      inputs are probabilities, e.g. from a post-hoc calibrator).

  Returns:
    A `ConformalPredictor`; `predictor(logits, key=None)` is the `[..., C]` bool set mask.

  Raises:
    ValueError: unknown name, argument or `conditional`, alpha outside (0, 1), shape mismatch,
      labels outside [0, C), NaN logits, a key that is not one PRNG key, or fewer calibration
      samples than `α` needs, overall or (Mondrian) in some class (checked when the values are
      concrete; under `jit` too few samples give `q̂ = inf`, i.e. every set is full, or every
      set holds that class).
  """
  options = _check_options(name, alpha, conditional, kw)
  conditional = None if conditional is None else "class"
  from_logits = kw.get("from_logits", True)
  if not isinstance(from_logits, bool):
    raise ValueError(f"from_logits must be a bool, got {from_logits!r}.")
  x, labels = _check_inputs(val_logits, val_labels, None, "val_logits")
  num_classes = x.shape[-1]
  mask = arrays.flatten_mask(kw.get("mask"), np.shape(val_labels))
  arrays.check_label_values(labels, num_classes, mask)
  if mask is None or arrays.is_concrete(mask):
    n = x.shape[0] if mask is None else int(jnp.sum(mask))
    if scores_lib.quantile_rank(n, alpha) > n:
      raise ValueError(
          f"{n} calibration samples are too few for alpha={alpha}: ⌈(n+1)(1−α)⌉ > n; need n >= "
          f"{scores_lib.min_calibration_size(alpha)}.")
  if conditional == "class" and arrays.is_concrete(labels, mask):
    check_class_sizes(labels, num_classes, alpha, mask)
  randomized = options.get("randomized", False)
  key = _randomized_key(randomized, kw.get("key"), "fit")
  ranks = scores_lib.quantile_ranks(x.shape[0], float(alpha))
  qhat = _calibrate(x, labels, mask, key, ranks, name=name, lam=options["lam"],
                    k_reg=options["k_reg"], from_logits=from_logits, conditional=conditional)
  return ConformalPredictor(qhat=qhat, name=name, alpha=float(alpha), num_classes=num_classes,
                            randomized=randomized, lam=options["lam"],
                            k_reg=options["k_reg"], from_logits=from_logits,
                            conditional=conditional)
