"""One entry point for the post-hoc calibrators: `fit_calibrator(name, val_logits, val_labels)`
returns a `Calibrator`, a callable mapping logits `[..., C]` to probabilities `[..., C]`.

Names (`calibrator_names()`): `temperature`, `vector`, `matrix`, `dirichlet` (affine maps of
the logits, `calib_jax.posthoc.temperature` and `.scaling`), `isotonic`, `isotonic_ovr`
(`.isotonic`), `histogram`, `histogram_ovr` (`.binning`), `bbq` (`.bbq`) and `beta` (`.beta`).
"""
import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.posthoc import bbq, beta, binning, isotonic, scaling, scores, temperature

ArrayLike = jax.typing.ArrayLike


def _fit_temperature(logits, labels, mask, **kw):
  return {"temperature": jnp.float32(temperature.fit_temperature(logits, labels, mask, **kw))}


def _apply_temperature(logits, params):
  return jax.nn.softmax(logits / params["temperature"], axis=-1)


def _softmax_of(apply_logits: Callable) -> Callable:
  return lambda logits, params: jax.nn.softmax(
      apply_logits(logits, params["weights"], params["bias"]), axis=-1)


def _fit_dirichlet(logits, labels, mask, **kw):
  return scaling.fit_matrix_scaling(logits, labels, mask, log_probs=True, **kw)


def _compressed(fit: Callable) -> Callable:
  """An isotonic fit whose tables keep only the ends of each block (`isotonic.compress`)."""
  def fit_and_compress(logits, labels, mask, **kw):
    params = fit(logits, labels, mask, **kw)
    scores_, fitted = isotonic.compress(params["scores"], params["fitted"])
    return {**params, "scores": jnp.asarray(scores_), "fitted": jnp.asarray(fitted)}
  return fit_and_compress


def _binning(mode: str) -> Callable:
  return lambda logits, labels, mask, **kw: binning.fit_histogram_binning(
      logits, labels, mask, mode=mode, **kw)


@dataclasses.dataclass(frozen=True)
class _Entry:
  fit: Callable  # (logits, labels, mask, **kw) -> dict of arrays
  apply: Callable  # (logits [N, C], params) -> probabilities [N, C]
  options: tuple  # the keyword arguments `fit` accepts
  summary: str


_AFFINE = ("max_iter", "tol", "min_samples_per_parameter")
_ODIR = ("odir_lambda", "odir_mu") + _AFFINE
_CALIBRATORS = {
    "temperature": _Entry(_fit_temperature, _apply_temperature, ("bounds", "iterations"),
                         "softmax(z / T)"),
    "vector": _Entry(scaling.fit_vector_scaling, _softmax_of(scaling.apply_vector_scaling),
                    _AFFINE, "softmax(w * z + b)"),
    "matrix": _Entry(scaling.fit_matrix_scaling, _softmax_of(scaling.apply_matrix_scaling),
                    _ODIR, "softmax(W z + b), ODIR"),
    "dirichlet": _Entry(_fit_dirichlet, _softmax_of(scaling.apply_dirichlet), _ODIR,
                       "softmax(W log p + b), ODIR"),
    "isotonic": _Entry(_compressed(isotonic.fit_isotonic),
                      lambda z, p: isotonic.apply_isotonic(z, p["scores"], p["fitted"]), (),
                      "top-label isotonic regression"),
    "isotonic_ovr": _Entry(_compressed(isotonic.fit_isotonic_ovr),
                          lambda z, p: isotonic.apply_isotonic_ovr(z, p["scores"], p["fitted"]),
                          (), "one-vs-rest isotonic regression"),
    "histogram": _Entry(_binning("top_label"),
                       lambda z, p: binning.apply_histogram_binning(z, p["bin_values"]),
                       ("num_bins",), "top-label histogram binning"),
    "histogram_ovr": _Entry(_binning("ovr"),
                           lambda z, p: binning.apply_histogram_binning(z, p["bin_values"]),
                           ("num_bins",), "one-vs-rest histogram binning"),
    "bbq": _Entry(bbq.fit_bbq,
                  lambda z, p: bbq.apply_bbq(z, p["edges"], p["bin_values"], p["model_weights"],
                                             p["num_bins"]),
                  ("bin_factor", "equivalent_sample_size"),
                  "top-label Bayesian binning into quantiles"),
    "beta": _Entry(beta.fit_beta, lambda z, p: beta.apply_beta(z, p["a"], p["b"], p["c"]),
                   ("max_iter", "tol", "min_samples_per_parameter"),
                   "top-label beta calibration, sigmoid(a ln s - b ln(1 - s) + c) of s = max p"),
}


def calibrator_names() -> list[str]:
  """The names `fit_calibrator` accepts."""
  return list(_CALIBRATORS)


def _describe(value) -> str:
  if isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) > 0:
    return f"{value.dtype}{list(value.shape)}"
  if isinstance(value, (jax.Array, np.ndarray, np.generic)):
    return f"{np.asarray(value).item():.6g}"
  return repr(value)


@jax.tree_util.register_pytree_node_class
class Calibrator:
  """A fitted post-hoc calibrator: `calibrator(logits [..., C]) -> probabilities [..., C]`.

  Its fitted arrays are attributes (`.temperature`; `.weights`, `.bias`; `.scores`, `.fitted`;
  `.bin_values`, ...) and in `.params`; `.name` and `.options` (the fit's keyword arguments)
  say how it was made. It is a pytree (the arrays are its leaves), so it can be passed into
  `jax.jit`-ed functions, and calling it is jit-able.
  """

  def __init__(self, name: str, params: dict, num_classes: int, options: Optional[dict] = None):
    self.name = name
    self.params = dict(params)
    self.num_classes = num_classes
    self.options = dict(options or {})

  def __getattr__(self, key):
    params = self.__dict__.get("params", {})
    if key in params:
      return params[key]
    raise AttributeError(f"{type(self).__name__} {self.__dict__.get('name')!r} has no "
                         f"attribute {key!r}; fitted parameters: {sorted(params)}.")

  def __call__(self, logits: ArrayLike) -> jax.Array:
    logits = scores.logits_array(logits)
    if logits.shape[-1] != self.num_classes:
      raise ValueError(f"logits have {logits.shape[-1]} classes; the {self.name!r} calibrator "
                       f"was fitted on {self.num_classes}.")
    flat = logits.reshape(-1, self.num_classes)
    return _CALIBRATORS[self.name].apply(flat, self.params).reshape(logits.shape)

  def __repr__(self) -> str:
    fields = [f"num_classes={self.num_classes}"]
    fields += [f"{k}={_describe(v)}" for k, v in self.params.items()]
    fields += [f"{k}={v!r}" for k, v in self.options.items()]
    return f"Calibrator({self.name!r}: {_CALIBRATORS[self.name].summary}; {', '.join(fields)})"

  def tree_flatten(self):
    keys = tuple(self.params)
    return tuple(self.params[k] for k in keys), (self.name, keys, self.num_classes,
                                                 tuple(self.options.items()))

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    name, keys, num_classes, options = aux
    return cls(name, dict(zip(keys, leaves)), num_classes, dict(options))


def fit_calibrator(name: str, val_logits: ArrayLike, val_labels: ArrayLike,
                   mask: Optional[ArrayLike] = None, **kw) -> Calibrator:
  """Fits the calibrator `name` on held-out logits `[..., C]` and labels `[...]`.

  Args:
    name: one of `calibrator_names()`.
    val_logits: held-out logits `[..., C]` (finite).
    val_labels: held-out integer labels `[...]`.
    mask: optional bool `[...]`; False entries are ignored.
    **kw: the named calibrator's options (e.g. `odir_lambda` for `matrix`, `num_bins` for
      `histogram`); see docs/posthoc.md.

  Returns:
    A `Calibrator` mapping logits to calibrated probabilities.
  """
  entry = _CALIBRATORS.get(name)
  if entry is None:
    raise ValueError(f"unknown calibrator {name!r}; choose one of {', '.join(_CALIBRATORS)}.")
  unknown = sorted(set(kw) - set(entry.options))
  if unknown:
    valid = ", ".join(entry.options) if entry.options else "none"
    raise ValueError(f"calibrator {name!r} has no option {unknown[0]!r}; valid options: "
                     f"{valid}.")
  params = entry.fit(val_logits, val_labels, mask, **kw)
  return Calibrator(name, params, int(np.shape(val_logits)[-1]), kw)
