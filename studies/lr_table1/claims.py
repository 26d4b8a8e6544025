"""The papers' claims about the label-relaxation Table 1 study and their verdicts on our runs:
one rule for every claim (two rows differ when their means are more than 2 sample std apart
with at least two seeds each).
"""
from __future__ import annotations

import dataclasses

from studies.lr_table1.summaries import DISPLAY, PAPER, rows


@dataclasses.dataclass(frozen=True)
class Claim:
  """A claim of a paper about ``metric`` among ``candidates`` (row key, selection target;
  unclipped rows): ``expected`` is the best (kind 'best') or no worse than any other beyond
  the seed spread (kind 'not_worse')."""
  text: str
  metric: str  # 'acc' (higher is better) or 'ece' (lower is better)
  candidates: tuple[tuple[str, str | None], ...]
  expected: tuple[str, str | None]
  kind: str = "best"


_ACC_TUNED = (("ce", None), ("ls", "acc"), ("ecp", "acc"), ("focal", "acc"), ("lr", "acc"))
_ECE_TUNED = (("ce", None), ("ls", "ece"), ("ecp", "ece"), ("focal", "ece"), ("lr", "ece"))
CLAIMS = (
    Claim("LR paper: LR has the lowest ECE of the losses tuned for accuracy", "ece",
          _ACC_TUNED, ("lr", "acc")),
    Claim("LR paper: LR has the lowest ECE of the losses tuned for ECE (its Table 1 has FL "
          "lower on Fashion-MNIST, the 'single exception')", "ece", _ECE_TUNED, ("lr", "ece")),
    Claim("LR paper: LS has the highest accuracy (losses tuned for accuracy)", "acc",
          _ACC_TUNED, ("ls", "acc")),
    Claim("LR paper: LR (tuned for ECE) is better calibrated than CE + temperature scaling",
          "ece", (("lr", "ece"), ("ce_ts", None)), ("lr", "ece")),
    Claim("LR paper: FL (tuned for ECE) generalises worse than LR (tuned for ECE)", "acc",
          (("lr", "ece"), ("focal", "ece")), ("lr", "ece")),
    Claim("MbLS paper: MbLS has a lower ECE than CE, LS and FL (tuned for ECE)", "ece",
          (("mbls", "ece"), ("ce", None), ("ls", "ece"), ("focal", "ece")), ("mbls", "ece")),
    Claim("ACLS paper: ACLS has a lower ECE than CE, LS and FL (tuned for ECE)", "ece",
          (("acls", None), ("ce", None), ("ls", "ece"), ("focal", "ece")), ("acls", None)),
    Claim("MbLS paper: MbLS keeps the accuracy of CE", "acc", (("mbls", "ece"), ("ce", None)),
          ("mbls", "ece"), kind="not_worse"),
    Claim("ACLS paper: ACLS keeps the accuracy of CE", "acc", (("acls", None), ("ce", None)),
          ("acls", None), kind="not_worse"),
)


def _name(row_id: tuple[str, str | None]) -> str:
  key, target = row_id
  name = "CE + T" if key == "ce_ts" else DISPLAY[key]
  return name + (f" ({'acc.' if target == 'acc' else 'ECE'})" if target else "")


def _ranked(values: dict, metric: str) -> list:
  return sorted(values, key=lambda r: values[r][0], reverse=metric == "acc")


def verdict(claim: Claim, stats: dict[tuple[str, str | None], tuple[float, float, int]]
            ) -> tuple[str, str]:
  """(ours, verdict) of one claim from ``stats``: row id -> (mean, std, finished seeds).

  Two rows differ when their means are more than 2 sample std (the larger) apart with at least
  two seeds each; otherwise the order is within the seed spread."""
  missing = [_name(r) for r in claim.candidates if r not in stats]
  if missing:
    return "–", f"pending ({', '.join(missing)})"
  order = _ranked({r: stats[r] for r in claim.candidates}, claim.metric)
  ours = ", ".join(f"{_name(r)} {stats[r][0]:.3f} ± {stats[r][1]:.3f}" for r in order[:2])

  def apart(a, b) -> bool | None:
    """Whether a and b differ beyond the seed spread (None: a single seed has no spread)."""
    (ma, sa, na), (mb, sb, nb) = stats[a], stats[b]
    return None if min(na, nb) < 2 else abs(ma - mb) > 2 * max(sa, sb)

  best, expected = order[0], claim.expected
  if best == expected:
    differs = apart(best, order[1])
    if differs is None:
      return ours, "holds on one seed (no spread yet)"
    return ours, ("holds" if differs else
                  f"holds, but {_name(order[1])} is within the seed spread")
  differs = apart(best, expected)
  if differs is None and claim.kind == "not_worse":  # 'within the spread' needs a spread
    return ours, f"undecided on one seed: {_name(best)} is ahead"
  if differs is None:
    return ours, f"does not hold on one seed: {_name(best)} is better"
  if differs:
    return ours, f"does not hold: {_name(best)} is better"
  if claim.kind == "not_worse":
    return ours, f"holds: {_name(best)} is better within the seed spread"
  return ours, f"undecided: {_name(best)} and {_name(expected)} within the seed spread"


def verdict_table(out_dir: str, seeds: list[int]) -> list[str]:
  """The claims, what the paper's Table 1 gives (where it has the rows) and what we measure."""
  stats = {}
  for row in rows(out_dir, seeds):
    if row.finished and not row.clipped:
      stats[("acc", row.key, row.target)] = (*row.acc, row.finished)
      stats[("ece", row.key, row.target)] = (*row.ece, row.finished)
  lines = ["| claim | paper's Table 1 (Fashion-MNIST) | ours (best, next) | verdict |",
           "|---|---|---|---|"]
  for claim in CLAIMS:
    index = 0 if claim.metric == "acc" else 2
    paper = {r: (PAPER[r][index], PAPER[r][index + 1], 10) for r in claim.candidates
             if r in PAPER}
    if len(paper) == len(claim.candidates):
      best = _ranked(paper, claim.metric)[0]
      paper_text = f"{_name(best)} {paper[best][0]:.3f}"
    else:
      paper_text = "not in this table"
    ours, text = verdict(claim, {r: stats[(claim.metric, *r)] for r in claim.candidates
                                 if (claim.metric, *r) in stats})
    lines.append(f"| {claim.text} | {paper_text} | {ours} | {text} |")
  return lines
