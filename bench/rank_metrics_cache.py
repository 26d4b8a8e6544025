"""Are the rank metrics' programs found in JAX's persistent compilation cache?

Runs the same small report twice, each in a fresh process sharing one new
`jax_compilation_cache_dir`: AECE, AURC, the selective summary, AUROC, AUPR, FPR@95 and the
1,000-resample AURC and AECE bootstraps on n samples. The second process should compile nothing
that the first one cached (a program holding a `pure_callback` is never cached: its callback's
per-process pointer is part of the program). Prints per process the programs it needed, the
cache hits and the programs compiled (`jax.monitoring` events, as bench/eval_predictions_speed.py counts them).

  PYTHONPATH=$PWD python bench/rank_metrics_cache.py --n=540
"""
import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags

_N = flags.DEFINE_integer("n", 540, "samples in the report")

_CHILD = """
import json, sys
import numpy as np
import jax
from jax import monitoring
counts = {"compiled": 0, "cache_hits": 0}
def on_duration(event, seconds, **kw):
  if event == "/jax/core/compile/backend_compile_duration":
    counts["compiled"] += 1
def on_event(event, **kw):
  if event == "/jax/compilation_cache/cache_hits":
    counts["cache_hits"] += 1
monitoring.register_event_duration_secs_listener(on_duration)
monitoring.register_event_listener(on_event)
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import time
from calib_jax import metrics
metrics.use_cacheable_cpu_sorts(True)  # as eval.py's compilation_cache.enable() does
n = int(sys.argv[2])
start = time.perf_counter()
rng = np.random.default_rng(0)
logits = rng.normal(size=(n, 10)).astype(np.float32) * 3
labels = rng.integers(0, 10, n)
probs = jax.nn.softmax(logits)
conf, correct = metrics.confidence_and_correct(probs, labels)
values = [metrics.aece(probs, labels), metrics.aurc(conf, correct),
          metrics.selective_summary(conf, correct)["aurc"], metrics.auroc(conf, ~correct),
          metrics.aupr(conf, ~correct), metrics.fpr_at_tpr(conf, ~correct),
          metrics.bootstrap(metrics.aurc, conf, correct)["std"],
          metrics.bootstrap(metrics.aece, probs, labels)["std"]]
jax.block_until_ready(values)
counts["seconds"] = time.perf_counter() - start
print(json.dumps(counts))
"""


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as cache_dir:
    for run in ("first", "second"):
      out = subprocess.run([sys.executable, "-c", _CHILD, cache_dir, str(_N.value)],
                           check=True, capture_output=True, text=True,
                           env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
      counts = json.loads(out.strip().splitlines()[-1])
      # The compile-duration event fires for cache hits too: misses are the difference.
      print(f"n={_N.value} {run} process: {counts['compiled']} programs, "
            f"{counts['cache_hits']} cache hits, "
            f"{counts['compiled'] - counts['cache_hits']} compiled, "
            f"{counts['seconds']:.1f} s (data, metrics and their compilation)")


if __name__ == "__main__":
  app.run(main)
