"""Ensembles in the evaluation: a population's member-stacked logits `[M, N, C]`.

`predictions.evaluate_predictions` (and `eval.py --predictions`, `eval.py --ensemble`) takes
member-stacked logits `[M, N, C]` in every logits array (or lists of M per-member arrays;
`member_arrays` checks them). The ensemble is reported as one model whose logits are `log p̄`,
the log of its members' averaged softmax probabilities (`calib_jax.ensemble`): the whole
report (`calibrators`, fitted on `log p̄`; `conformal`; `failure`; `ood`). `add_to_report`
adds

* `ensemble`: `num_members`, `members` (each member's test `accuracy`, `ece`, `nll`, `brier`,
  `aurc`), `mean_member` (their means over the members) and `ensemble` (the same keys of the
  ensemble, from the raw row);
* to `failure` (and `ood`): the ensemble's uncertainty scores `predictive_entropy`,
  `expected_entropy`, `mutual_information` and `disagreement`, negated (a high uncertainty
  flags a wrong prediction / an OOD sample).

`parse_members` reads `--members=0,2,4`; `select_members` slices a stacked tree. (The split's
stacked logits come from `validation.stacked_split_logits`.)
"""
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import ensemble, metrics

# The ensemble's uncertainty scores, negated for detection (higher = more confident).
ENSEMBLE_SCORES = ("predictive_entropy", "expected_entropy", "mutual_information",
                   "disagreement")
MEMBER_KEYS = ("accuracy", "ece", "nll", "brier", "aurc")


def ensemble_logits(stacked: Any) -> np.ndarray:
  """`log p̄` `[..., C]` (float32, numpy) of member-stacked logits `[M, ..., C]`."""
  return np.asarray(ensemble.ensemble_log_probs(stacked))


def ensemble_scores(stacked: Any) -> dict[str, np.ndarray]:
  """The negated ensemble scores (higher = more confident), `[...]` each, for failure and OOD
  detection; `disagreement` only with M >= 2 members. (Each the bits of its
  `calib_jax.ensemble` function; negated on the host, exactly, rather than by a program.)"""
  total, expected, mutual = ensemble.uncertainty.decomposition(stacked)
  scores = {"predictive_entropy": total, "expected_entropy": expected,
            "mutual_information": mutual}
  if np.shape(stacked)[0] >= 2:
    scores["disagreement"] = ensemble.disagreement(stacked)
  return {name: -np.asarray(score) for name, score in scores.items()}


def member_results(stacked: Any, labels: Any, num_bins: int) -> dict[str, Any]:
  """Each member's `MEMBER_KEYS` on `(stacked [M, N, C], labels [N])` and the mean member:
  `{"num_members": M, "members": [{key: float}], "mean_member": {key: float}}`."""
  per_member, _ = ensemble.member_metrics(stacked, labels, num_bins)  # checks the labels
  per_member = {**per_member, "aurc": _member_aurcs(stacked, labels)}
  per_member = {k: np.asarray(v) for k, v in jax.device_get(per_member).items()}
  num = len(per_member["aurc"])
  return {"num_members": num,
          "members": [{k: float(per_member[k][m]) for k in MEMBER_KEYS} for m in range(num)],
          "mean_member": {k: float(np.mean(per_member[k])) for k in MEMBER_KEYS}}


# Jitted, as `_select` below: outside `jit`, each member's softmax, confidence and correctness
# would compile one-operation programs of their own per shape (~20-60 ms each).
@jax.jit
def _member_aurcs(stacked: Any, labels: Any) -> jax.Array:
  """Each member's AURC of its maximum probability, `[M]` (one member at a time)."""
  labels = jnp.asarray(labels, jnp.int32)

  def one(logits):
    return metrics.aurc(*metrics.confidence_and_correct(jax.nn.softmax(logits, -1), labels))
  return jax.lax.map(one, jnp.asarray(stacked, jnp.float32))


def format_lines(results: dict[str, Any]) -> list[str]:
  """The members' table of `member_results` (with `member_indices` when given)."""
  part = results.get("ensemble")
  if not part:
    return []
  indices = part.get("member_indices", list(range(part["num_members"])))
  lines = ["", f"{part['num_members']} members (test split; the ensemble averages their "
               "probabilities)", f"{'':<14}" + "".join(f"{k:>9}" for k in MEMBER_KEYS)]
  for index, row in zip(indices, part["members"]):
    lines.append(f"{'member ' + str(index):<14}" + "".join(f"{row[k]:>9.4f}" for k in MEMBER_KEYS))
  lines.append(f"{'mean member':<14}" + "".join(f"{part['mean_member'][k]:>9.4f}"
                                                for k in MEMBER_KEYS))
  if "ensemble" in part:
    lines.append(f"{'ensemble':<14}" + "".join(f"{part['ensemble'][k]:>9.4f}"
                                               for k in MEMBER_KEYS))
  return lines


def parse_members(text: str | None, num_members: int) -> list[int]:
  """`--members=0,2,4` as indices (all members when `text` is None or 'all'); a one-line
  ValueError names the valid range."""
  if text is None or text == "all":
    return list(range(num_members))
  parts = [p.strip() for p in text.split(",")]
  if not parts or not all(p.isdigit() for p in parts) or any(int(p) >= num_members
                                                             for p in parts):
    raise ValueError(f"--members={text!r}: member indices must be comma-separated integers in "
                     f"0..{num_members - 1} (the sweep has {num_members} members)")
  indices = [int(p) for p in parts]
  if len(set(indices)) != len(indices):
    raise ValueError(f"--members={text!r} names a member twice")
  return indices


def select_members(indices: Sequence[int], tree: Any) -> Any:
  """The members `indices` of a stacked tree (leading axis M)."""
  return _select(tree, np.asarray(indices))


# One program for the whole tree: outside `jit`, each leaf's gather would compile a program of
# its own per shape (a model's variables hold tens of leaves).
@jax.jit
def _select(tree: Any, index: jax.Array) -> Any:
  return jax.tree.map(lambda leaf: leaf[index], tree)


# The member-stacked side of `predictions.fit_and_evaluate` (`eval.py --predictions`).


def member_arrays(arrays: Mapping[str, Any], names: Sequence[str],
                  error: type[ValueError]) -> dict[str, np.ndarray]:
  """The arrays `names` of `arrays` (None left out) as numpy, a list of per-member logits
  stacked `[M, N, C]`; member-stacked logits must be in every logits array or none, with one
  M (else `error`, one line, `predictions.PredictionsError`)."""
  out = {}
  for name in names:
    value = arrays.get(name)
    if isinstance(value, (list, tuple)) and name.endswith("_logits"):
      try:
        value = ensemble.stack_members(value)
      except ValueError as e:
        raise error(f"predictions: {name}: {e}") from None
    if value is not None:
      out[name] = np.asarray(value)
  logits = {k: v for k, v in out.items() if k.endswith("_logits")}
  stacked = {k: v.shape[0] for k, v in logits.items() if v.ndim == 3}
  if stacked and len(stacked) != len(logits):
    flat = next(k for k in logits if k not in stacked)
    raise error(f"predictions: {next(iter(stacked))} is member-stacked [M, N, C] but {flat} "
                "is not; stack every logits array or none")
  if len(set(stacked.values())) > 1:
    sizes = ", ".join(f"{k} {m}" for k, m in stacked.items())
    raise error(f"predictions: the members disagree in shape: {sizes} members (every "
                "member-stacked logits array needs the same M)")
  return out


def split_members(arrays: dict[str, np.ndarray]
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """`(arrays with each member-stacked logits array replaced by its log p̄, the member-stacked
  arrays)`; the second is empty for a single model's `[N, C]` logits."""
  members = {k: v for k, v in arrays.items() if k.endswith("_logits") and v.ndim == 3}
  return {**arrays, **{k: ensemble_logits(v) for k, v in members.items()}}, members


def one_model(logits: Any) -> np.ndarray:
  """`[N, C]` logits as they are; member-stacked `[M, N, C]` as the ensemble's `log p̄`."""
  return ensemble_logits(logits) if np.ndim(logits) == 3 else np.asarray(logits)


def add_to_report(results: dict[str, Any], members: Mapping[str, np.ndarray], test_labels: Any,
                  wrong: Any, num_bins: int, detect: Callable) -> dict[str, Any]:
  """Adds an ensemble's part to `predictions.fit_and_evaluate`'s `results` (returned; as they
  are without `members`): `ensemble` (each member and the mean member on the test split beside
  the ensemble's row) and the ensemble scores in `failure` (and `ood`), by `detect(scores,
  positives)`."""
  if not members:
    return results
  raw = results["calibrators"]["raw"]["test"]
  results["ensemble"] = {**member_results(members["test_logits"], test_labels, num_bins),
                         "ensemble": {k: raw[k] for k in MEMBER_KEYS}}
  results["failure"].update(detect(ensemble_scores(members["test_logits"]), wrong))
  if "ood_logits" in members:
    both = np.concatenate([members["test_logits"], members["ood_logits"]], axis=1)
    is_ood = np.arange(both.shape[1]) >= members["test_logits"].shape[1]
    results["ood"].update(detect(ensemble_scores(both), is_ood))
  return results
