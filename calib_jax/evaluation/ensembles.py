"""Ensembles in the evaluation: a population's member-stacked logits `[M, N, C]`.

An ensemble is reported as one model whose logits are `log p̄`, the log of its members'
averaged softmax probabilities (`calib_jax.ensemble`): the whole calibration report, the
post-hoc calibrators fitted on `log p̄`, conformal sets and failure / OOD detection. Beside
it: each member's own accuracy, ECE, NLL, Brier and AURC, and the mean member (the mean of
those over the members), and the ensemble's uncertainty scores (predictive entropy, expected
entropy, mutual information, member disagreement) as failure- and OOD-detection scores.

`parse_members` reads `--members=0,2,4`; `select_members` slices a stacked tree. (The split's
stacked logits come from `validation.stacked_split_logits`.)
"""
from collections.abc import Sequence
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


def ensemble_scores(stacked: Any) -> dict[str, jax.Array]:
  """The negated ensemble scores (higher = more confident), `[...]` each, for failure and OOD
  detection; `disagreement` only with M >= 2 members."""
  scores = {"predictive_entropy": -ensemble.predictive_entropy(stacked),
            "expected_entropy": -ensemble.expected_entropy(stacked),
            "mutual_information": -ensemble.mutual_information(stacked)}
  if np.shape(stacked)[0] >= 2:
    scores["disagreement"] = -ensemble.disagreement(stacked)
  return scores


def member_results(stacked: Any, labels: Any, num_bins: int) -> dict[str, Any]:
  """Each member's `MEMBER_KEYS` on `(stacked [M, N, C], labels [N])` and the mean member:
  `{"num_members": M, "members": [{key: float}], "mean_member": {key: float}}`."""
  per_member, _ = ensemble.member_metrics(stacked, labels, num_bins)
  labels = jnp.asarray(labels, jnp.int32)
  aurcs = []
  for logits in jnp.asarray(stacked, jnp.float32):
    probs = jax.nn.softmax(logits, -1)
    aurcs.append(metrics.aurc(jnp.max(probs, -1), jnp.argmax(probs, -1) == labels))
  per_member = {**{k: np.asarray(v) for k, v in per_member.items()}, "aurc": np.asarray(aurcs)}
  num = len(aurcs)
  return {"num_members": num,
          "members": [{k: float(per_member[k][m]) for k in MEMBER_KEYS} for m in range(num)],
          "mean_member": {k: float(np.mean(per_member[k])) for k in MEMBER_KEYS}}


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
  index = np.asarray(indices)
  return jax.tree.map(lambda leaf: leaf[index], tree)
