"""calib_jax's smooth ECE against relplot's `smECE` (a `bench` extra; not a test dependency).

Top-label confidences built as `[N, 10]` rows whose max is `f`, on synthetic cases: over-
confident, calibrated, half the confidences at exactly 1, and sigmoid-shaped. Prints both
values, both automatic bandwidths and the relative difference, and torch-uncertainty's
`SmoothCalibrationError(kernel_type="reflected")` (relplot's kernel) where it is installed. relplot evaluates bandwidths
below 0.01 on a per-bandwidth grid that calib_jax replaces by one 5121-point grid, so cases
whose smooth ECE is below 0.01 differ by the grid's discretisation (~1e-3 relative); the rest
agree to float32 rounding.

  python crosscheck/relplot_smece.py
"""
from absl import app
import numpy as np

from calib_jax import metrics


def _rows(f, y, c=10):
  rest = (1.0 - f)[:, None] / (c - 1) * np.ones((1, c - 1))
  probs = np.concatenate([f[:, None], rest], 1).astype(np.float32)
  return probs, np.where(y, 0, 1)


def cases(n, rng):
  f = rng.uniform(0.15, 1, n)
  yield "over-confident, acc(f) = f²", f, rng.random(n) < f ** 2
  f = rng.uniform(0.15, 1, n)
  yield "calibrated", f, rng.random(n) < f
  f = np.where(rng.random(n) < 0.5, 1.0, rng.uniform(0.15, 1, n))
  yield "half at f = 1, acc(f) = 0.97 f", f, rng.random(n) < 0.97 * f
  f = np.clip(1 / (1 + np.exp(-rng.normal(3, 2, n))), 0.15, 1)
  yield "sigmoid-shaped, calibrated", f, rng.random(n) < f


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  import relplot  # pylint: disable=import-outside-toplevel
  try:
    import torch  # pylint: disable=import-outside-toplevel
    from torch_uncertainty.metrics import SmoothCalibrationError  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"torch-uncertainty unavailable: {e}")
    torch = None
  rng = np.random.default_rng(0)
  print("| case | N | calib_jax smECE (σ) | relplot smECE (σ) | relative difference | "
        "torch-uncertainty (reflected) | relative difference |")
  print("|---|---|---|---|---|---|---|")
  for n in (1000, 100_000):
    for name, f, y in cases(n, rng):
      probs, labels = _rows(f, y)
      value, sigma = metrics.smooth_ece(probs, labels, return_bandwidth=True)
      conf = probs.max(1).astype(np.float64)
      want, want_sigma = relplot.smECE(conf, (probs.argmax(1) == labels) * 1.0,
                                       return_width=True)
      tu_text = "– | –"
      if torch is not None:
        metric = SmoothCalibrationError(kernel_type="reflected")
        metric.update(torch.from_numpy(probs), torch.from_numpy(labels))
        tu_value = float(metric.compute())
        tu_text = f"{tu_value:.6f} | {abs(float(value) - tu_value) / tu_value:.1e}"
      print(f"| {name} | {n:.0e} | {float(value):.6f} ({float(sigma):.6f}) | "
            f"{want:.6f} ({want_sigma:.6f}) | {abs(float(value) - want) / want:.1e} | "
            f"{tu_text} |")


if __name__ == "__main__":
  app.run(main)
