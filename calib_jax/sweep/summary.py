"""A sweep's results: each member's validation and test metrics, the best members, and the mean
± standard deviation over seeds of each hyper-parameter setting, in `<workdir>/sweep.json`.

    {"fields": [...], "members": [{"member": 0, "overrides": {...}, "val": {...},
                                   "test": {...}}, ...],
     "best": {"val_accuracy": {"member": i, "overrides": ...}, "val_ece": {...}},
     "settings": [{"overrides": {...without seed...}, "seeds": [...], "members": [...],
                   "val": {"ece": {"mean": m, "std": s}, ...}, "test": {...}}, ...]}

`val` and `test` hold `accuracy`, `ece` (15 equal-width bins, the config's `eval.num_bins`),
`nll`, and, after temperature scaling with the temperature fitted on the validation split
(held-out NLL, `posthoc.fit_temperature`), `ece_ts` and `nll_ts`; `val` also holds that
`temperature`. The standard deviation over seeds is the sample one (ddof = 1; 0 for one seed),
as the papers' tables report.
"""
import json
import os
from typing import Any

import jax
import numpy as np

from calib_jax import metrics, posthoc
from calib_jax.sweep import spec

SWEEP_FILE = "sweep.json"
REPORTED = ("accuracy", "ece", "nll", "ece_ts", "nll_ts")


def _scores(logits: np.ndarray, labels: np.ndarray, temperature: float,
            num_bins: int) -> dict[str, float]:
  probs = jax.nn.softmax(logits, -1)
  scaled = jax.nn.softmax(posthoc.apply_temperature(logits, temperature), -1)
  return {"accuracy": float(metrics.accuracy(probs, labels)),
          "ece": float(metrics.ece(probs, labels, num_bins)),
          "nll": float(metrics.nll(logits, labels, from_logits=True)),
          "ece_ts": float(metrics.ece(scaled, labels, num_bins)),
          "nll_ts": float(metrics.nll(logits / temperature, labels, from_logits=True))}


def member_results(val_logits: np.ndarray, val_labels: np.ndarray, test_logits: np.ndarray,
                   test_labels: np.ndarray, num_bins: int) -> dict[str, dict[str, float]]:
  """One member's `{"val": {...}, "test": {...}}` (see the module docstring) from its logits
  `[N, C]` and labels `[N]` on the validation and test splits; classification only."""
  temperature = posthoc.fit_temperature(val_logits, val_labels)
  val = _scores(val_logits, val_labels, temperature, num_bins)
  val["temperature"] = temperature
  return {"val": val, "test": _scores(test_logits, test_labels, temperature, num_bins)}


def _mean_std(values: list[float]) -> dict[str, float]:
  values = np.asarray(values, np.float64)
  std = float(np.std(values, ddof=1)) if values.size > 1 else 0.0
  return {"mean": float(np.mean(values)), "std": std}


def summarize(sweep: Any, results: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
  """The content of `sweep.json` from the members' `member_results`, in member order."""
  members = [{"member": i, "overrides": sweep.members[i], **r} for i, r in enumerate(results)]
  by_accuracy = max(members, key=lambda m: m["val"]["accuracy"])
  by_ece = min(members, key=lambda m: m["val"]["ece"])
  settings: dict[str, dict[str, Any]] = {}
  for m in members:
    setting = {k: v for k, v in m["overrides"].items() if k != "seed"}
    entry = settings.setdefault(json.dumps(setting, sort_keys=True),
                                {"overrides": setting, "members": [], "seeds": []})
    entry["members"].append(m["member"])
    entry["seeds"].append(m["overrides"].get("seed"))
  for entry in settings.values():
    chosen = [members[i] for i in entry["members"]]
    for split in ("val", "test"):
      entry[split] = {k: _mean_std([c[split][k] for c in chosen]) for k in REPORTED}
  return {
      "fields": list(sweep.fields),
      "members": members,
      "best": {"val_accuracy": {"member": by_accuracy["member"],
                                "overrides": by_accuracy["overrides"]},
               "val_ece": {"member": by_ece["member"], "overrides": by_ece["overrides"]}},
      "settings": list(settings.values()),
  }


def write(workdir: str, sweep: Any, results: list[dict[str, dict[str, float]]]
          ) -> dict[str, Any]:
  """Writes `summarize(...)` to `<workdir>/sweep.json` (process 0 only); returns it."""
  content = summarize(sweep, results)
  path = os.path.join(workdir, SWEEP_FILE)
  if jax.process_index() == 0:
    with open(path + ".tmp", "w") as f:
      json.dump(content, f, indent=1)
    os.replace(path + ".tmp", path)
  return content


def _label(overrides: dict[str, Any]) -> str:
  return spec.overrides_label(overrides) or "(no hyper-parameter)"


def format_table(content: dict[str, Any]) -> str:
  """A plain-text view of `sweep.json`'s content: per hyper-parameter setting, the mean ± std
  over its seeds of accuracy and ECE on val and test (and test ECE after temperature scaling),
  then the best members on validation."""
  columns = (("val", "accuracy", "val acc"), ("val", "ece", "val ECE"),
             ("test", "accuracy", "test acc"), ("test", "ece", "test ECE"),
             ("test", "ece_ts", "test ECE (T)"))
  labels = [_label(entry["overrides"]) for entry in content["settings"]]
  width = max(len("setting"), *map(len, labels))
  lines = [f"{'setting':<{width}}  seeds" + "".join(f"  {title:>15}" for *_, title in columns)]
  for label, entry in zip(labels, content["settings"]):
    cells = "".join(f"  {entry[split][key]['mean']:>7.4f} ± {entry[split][key]['std']:.4f}"
                    .rjust(17) for split, key, _ in columns)
    lines.append(f"{label:<{width}}  {len(entry['seeds']):>5}{cells}")
  best = content["best"]
  lines.append(
      "best on validation: accuracy member "
      f"{best['val_accuracy']['member']} ({_label(best['val_accuracy']['overrides'])}), "
      f"ECE member {best['val_ece']['member']} ({_label(best['val_ece']['overrides'])})")
  return "\n".join(lines)


def read(workdir: str) -> dict[str, Any]:
  """`<workdir>/sweep.json`."""
  with open(os.path.join(workdir, SWEEP_FILE)) as f:
    return json.load(f)
