"""Vector scaling, matrix scaling and Dirichlet calibration: affine maps of the logits (or of
the log-probabilities) fitted by held-out NLL with L-BFGS on device.

* Vector scaling (Guo et al. 2017): `q = softmax(w ⊙ z + b)`, `w, b ∈ R^C`; `w = 1/T, b = 0` is
  temperature scaling.
* Matrix scaling (Guo et al. 2017) with ODIR: `q = softmax(W z + b)`, `W ∈ R^{C×C}`.
* Dirichlet calibration (Kull et al. 2019, "Beyond temperature scaling: obtaining
  well-calibrated multi-class probabilities with Dirichlet calibration", NeurIPS):
  `q = softmax(W log p + b)`, `p = softmax(z)`: matrix scaling of the log-probabilities.

ODIR (off-diagonal and intercept regularisation, Kull et al. 2019 Eq. 5) adds
`λ / (C(C−1)) Σ_{i≠j} W_ij² + μ / C Σ_j b_j²` to the mean NLL. The paper cross-validates λ and μ
per model over powers of ten; the defaults λ = μ = 1 are a middle value of that grid. All maps
start at the identity (`W = I`, `w = 1`, `b = 0`), where `q = softmax(z)`.
"""
import functools
import numbers
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import program_store
from calib_jax.posthoc import _fitting

ArrayLike = jax.typing.ArrayLike

DEFAULT_ODIR_LAMBDA = 1.0
DEFAULT_ODIR_MU = 1.0
DEFAULT_MAX_ITER = 200
DEFAULT_TOL = 1e-5


def apply_vector_scaling(logits: ArrayLike, weights: ArrayLike, bias: ArrayLike) -> jax.Array:
  """Vector-scaled logits `w ⊙ z + b` (`softmax` of them are the calibrated probabilities)."""
  return jnp.asarray(logits, jnp.float32) * weights + bias


def apply_matrix_scaling(logits: ArrayLike, weights: ArrayLike, bias: ArrayLike) -> jax.Array:
  """Matrix-scaled logits `W z + b` for logits `[..., C]`, `W [C, C]`, `b [C]` (at full float32
  precision on every platform: a GPU's default rounds the operands to TF32, a TPU's to bfloat16,
  and the calibrated probabilities would then depend on where they were computed)."""
  return jnp.matmul(jnp.asarray(logits, jnp.float32), jnp.asarray(weights).T,
                    precision=jax.lax.Precision.HIGHEST) + bias


def apply_dirichlet(logits: ArrayLike, weights: ArrayLike, bias: ArrayLike) -> jax.Array:
  """Dirichlet-calibrated logits `W log softmax(z) + b`."""
  return apply_matrix_scaling(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)), weights,
                              bias)


def odir_penalty(weights: jax.Array, bias: jax.Array, odir_lambda, odir_mu) -> jax.Array:
  """`λ / (C(C−1)) Σ_{i≠j} W_ij² + μ / C Σ_j b_j²` (Kull et al. 2019, Eq. 5)."""
  num_classes = bias.shape[-1]
  off_diagonal = weights * (1.0 - jnp.eye(num_classes, dtype=weights.dtype))
  return (odir_lambda * jnp.sum(jnp.square(off_diagonal)) / (num_classes * (num_classes - 1))
          + odir_mu * jnp.sum(jnp.square(bias)) / num_classes)


_BLOCK_ROWS = 256  # rows of the logits per step of the vector-scaling NLL's pass (XLA:CPU)


def vector_nll_and_grad(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                        params: dict) -> tuple[jax.Array, dict]:
  """`_fitting.mean_nll` of the vector-scaled `logits [N, C]` (`labels [N]`, sample `weights
  [N]`) and its gradient in `params` (`{"weights": w [C], "bias": b [C]}`), in one pass.

  With `z = w ⊙ x + b`, `p = softmax(z)` and `r_i = v_i / Σ_j v_j` (the sample weights `v`):
  `∂/∂b_k = Σ_i r_i p_ik − Σ_{i: y_i = k} r_i` and `∂/∂w_k = Σ_i r_i p_ik x_ik − Σ_{i: y_i = k}
  r_i x_ik`. The rows go through in blocks of `_BLOCK_ROWS`, each block's `z`, its row maxima,
  `exp(z − max)` and their sums computed once while the block is in cache, and the column
  sums taken as products with the `r_i / Σ_k exp(z_ik − max_i)` (no one-hot; the label terms
  are sums over the labels). The autodiff gradient of `mean_nll` passed over the `[N, C]`
  array ~5 times, exponentiating twice (XLA:CPU's column sums of it are slow): ~1.7x slower
  at 25,000 x 1,000. The same quantities, summed in another order (float32 rounding; tested).
  """
  n, num_classes = logits.shape
  w, b = params["weights"], params["bias"]
  # A GPU or TPU takes the array in one block: a loop of small products there is a loop of
  # kernel launches.
  block = min(n, _BLOCK_ROWS) if jax.default_backend() == "cpu" else n
  total = jnp.maximum(jnp.sum(weights), 1.0)
  r = weights / total

  def add_block(i, carry):
    # The last block starts at n − block (dynamic_slice clamps it); its rows counted by an
    # earlier block get weight 0.
    start = jnp.minimum(i * block, n - block)
    x = lax.dynamic_slice_in_dim(logits, start, block)
    r_block = jnp.where(start + jnp.arange(block) >= i * block,
                        lax.dynamic_slice_in_dim(r, start, block), 0.0)
    z = x * w + b
    z_max = jnp.max(z, axis=1)
    e = jnp.exp(z - z_max[:, None])
    e_sum = jnp.sum(e, axis=1)
    scaled = r_block / e_sum
    lse, grad_w, grad_b = carry
    # logsumexp as jax.nn.logsumexp takes it (the overlap's rows get the same values again)
    lse = lax.dynamic_update_slice_in_dim(lse, jnp.log(e_sum) + z_max, start, 0)
    return (lse, grad_w + jnp.matmul(scaled, x * e, precision=lax.Precision.HIGHEST),
            grad_b + jnp.matmul(scaled, e, precision=lax.Precision.HIGHEST))

  zeros = jnp.zeros(num_classes, jnp.float32)
  lse, grad_w, grad_b = lax.fori_loop(0, -(-n // block), add_block,
                                      (jnp.zeros(n, jnp.float32), zeros, zeros))
  label_logits = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
  # `mean_nll`'s expression, with the label's logit `z_{i,y_i}` scaled from the logits' own.
  value = jnp.sum(weights * (lse - (label_logits * w[labels] + b[labels]))) / total
  grad_w = grad_w - jax.ops.segment_sum(r * label_logits, labels, num_classes)
  grad_b = grad_b - jax.ops.segment_sum(r, labels, num_classes)
  return value, {"weights": grad_w, "bias": grad_b}


def _vector_nll(logits, labels, weights):
  """`params ↦ mean NLL` of vector scaling whose `jax.value_and_grad` is one
  `vector_nll_and_grad` (the L-BFGS and its line search ask for both at each point)."""

  @jax.custom_vjp
  def nll(params):
    return vector_nll_and_grad(logits, labels, weights, params)[0]

  def forward(params):  # (value, residuals): the gradient is the residual
    return vector_nll_and_grad(logits, labels, weights, params)

  def backward(grad, cotangent):
    return (jax.tree.map(lambda g: cotangent * g, grad),)

  nll.defvjp(forward, backward)
  return nll


@functools.partial(program_store.jit, static_argnames=("kind", "max_iter"))
def _fit_affine(features, labels, weights, odir_lambda, odir_mu, tol, kind: str, max_iter: int):
  """L-BFGS fit of `w ⊙ x + b` (kind "vector") or `W x + b` + ODIR (kind "matrix") on
  `features` (the logits, or their log-softmax for Dirichlet calibration: one compiled fit)."""
  num_classes = features.shape[1]
  if kind == "vector":
    init = {"weights": jnp.ones(num_classes, jnp.float32),
            "bias": jnp.zeros(num_classes, jnp.float32)}
    return _fitting.minimize_lbfgs(_vector_nll(features, labels, weights), init, max_iter, tol)
  init = {"weights": jnp.eye(num_classes, dtype=jnp.float32),
          "bias": jnp.zeros(num_classes, jnp.float32)}

  def loss(params):
    weights_, bias = params["weights"], params["bias"]
    return (_fitting.mean_nll(apply_matrix_scaling(features, weights_, bias), labels, weights)
            + odir_penalty(weights_, bias, odir_lambda, odir_mu))

  return _fitting.minimize_lbfgs(loss, init, max_iter, tol)


def _check_nonnegative(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
    raise ValueError(f"{name} must be a real number >= 0, got {value!r}.")
  return float(value)


def _check_iterations(max_iter, tol) -> tuple[int, float]:
  if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
    raise ValueError(f"max_iter must be a positive int, got {max_iter!r}.")
  return max_iter, _check_nonnegative("tol", tol)


def fit_vector_scaling(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None,
                       *, max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL,
                       min_samples_per_parameter: float = _fitting.SAMPLES_PER_PARAMETER
                       ) -> dict:
  """Vector scaling `softmax(w ⊙ z + b)` minimising the held-out NLL (Guo et al. 2017).

  Unregularised, as in the paper, so it needs `min_samples_per_parameter · 2C` held-out samples
  (set it to 0 to fit anyway).

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    max_iter: L-BFGS steps at most.
    tol: stop when the gradient's l2 norm is below it.
    min_samples_per_parameter: the sample-size rule (default 10).

  Returns:
    `{"weights": [C], "bias": [C], "steps": int32, "nll": float32}` (jax arrays; the NLL is the
    fitted objective).
  """
  max_iter, tol = _check_iterations(max_iter, tol)
  logits, labels, weights = _fitting.fit_inputs(logits, labels, mask)
  num_classes = logits.shape[1]
  _fitting.check_sample_size("vector scaling", logits.shape[0], 2 * num_classes,
                             _check_nonnegative("min_samples_per_parameter",
                                                min_samples_per_parameter),
                             "use temperature scaling (1 parameter)")
  params, steps, value = _fit_affine(logits, labels, weights, 0.0, 0.0, tol, "vector", max_iter)
  return {**params, "steps": steps, "nll": value}


def fit_matrix_scaling(logits: ArrayLike, labels: ArrayLike, mask: Optional[ArrayLike] = None,
                       *, odir_lambda: float = DEFAULT_ODIR_LAMBDA,
                       odir_mu: float = DEFAULT_ODIR_MU, max_iter: int = DEFAULT_MAX_ITER,
                       tol: float = DEFAULT_TOL, log_probs: bool = False,
                       min_samples_per_parameter: float = _fitting.SAMPLES_PER_PARAMETER
                       ) -> dict:
  """Matrix scaling `softmax(W z + b)` with ODIR, minimising held-out NLL + the ODIR penalty.

  With `log_probs=True` the input is `log softmax(z)`: Dirichlet calibration (Kull et al. 2019).
  Free parameters are the C diagonal entries, plus the C(C−1) off-diagonals when
  `odir_lambda = 0` and the C biases when `odir_mu = 0`; a fit with fewer than
  `min_samples_per_parameter` samples per free parameter is refused.

  Args:
    logits: `[..., C]` held-out logits; labels `[...]`; optional bool mask `[...]`.
    odir_lambda: λ, the weight of the mean squared off-diagonal entry (default 1).
    odir_mu: μ, the weight of the mean squared bias (default 1).
    max_iter: L-BFGS steps at most.
    tol: stop when the gradient's l2 norm is below it.
    log_probs: fit on `log softmax(z)` (Dirichlet calibration) instead of `z`.
    min_samples_per_parameter: the sample-size rule (default 10).

  Returns:
    `{"weights": [C, C], "bias": [C], "steps": int32, "nll": float32}` (`nll` is the fitted
    objective, penalty included).
  """
  odir_lambda = _check_nonnegative("odir_lambda", odir_lambda)
  odir_mu = _check_nonnegative("odir_mu", odir_mu)
  max_iter, tol = _check_iterations(max_iter, tol)
  logits, labels, weights = _fitting.fit_inputs(logits, labels, mask)
  num_classes = logits.shape[1]
  free = (num_classes + (num_classes * (num_classes - 1) if odir_lambda == 0 else 0)
          + (num_classes if odir_mu == 0 else 0))
  name = "Dirichlet calibration" if log_probs else "matrix scaling"
  _fitting.check_sample_size(
      name, logits.shape[0], free,
      _check_nonnegative("min_samples_per_parameter", min_samples_per_parameter),
      "keep ODIR on (odir_lambda > 0, odir_mu > 0) or use vector scaling")
  features = jax.nn.log_softmax(logits, axis=-1) if log_probs else logits
  params, steps, value = _fit_affine(features, labels, weights, odir_lambda, odir_mu, tol,
                                     "matrix", max_iter)
  return {**params, "steps": steps, "nll": value}
