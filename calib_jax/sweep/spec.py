"""`config.sweep`: which members a population has, parsed and checked before anything is built.

    "loss_kwargs.margin=5,10;seed=0,1"   ->  4 members, in this order:
        {margin 5, seed 0}, {margin 5, seed 1}, {margin 10, seed 0}, {margin 10, seed 1}

The text is `;`-separated `field=v1,v2,...` entries of dotted config fields; the members are
the product of the lists, the first field varying slowest. Only fields that leave every array's
shape and the program's structure alone can differ between the members of one program:

* `seed`: each member's initialisation, dropout keys and (unless `sweep_shared_order`) batch
  order, as its single run with that seed;
* `loss_kwargs.<name>`: a real hyper-parameter of the config's loss (traced, see
  `losses.traced`); a string one (ACLS's `winner_term`) picks another formula and cannot vary;
* `optimizer.learning_rate` (the schedule's peak) and `optimizer.weight_decay`.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from typing import Any

import ml_collections

from calib_jax import losses
from calib_jax.losses.hparams import Real

OPTIMIZER_FIELDS = ("optimizer.learning_rate", "optimizer.weight_decay")
MEMBERS_AS = ("auto", "vmap", "map", "unroll")  # config.sweep_members_as (see `population`)


class SweepError(ValueError):
  """`config.sweep` cannot be run; the message is one line naming the problem."""


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The members of a population.

  Attributes:
    fields: the swept dotted fields, in the text's order.
    members: one `{field: value}` per member (the product of the value lists, the first field
      varying slowest).
  """
  fields: tuple[str, ...]
  members: tuple[dict[str, Any], ...]

  @property
  def size(self) -> int:
    return len(self.members)

  def values(self, field: str) -> list[Any]:
    """`field`'s value for each member, in member order."""
    return [m[field] for m in self.members]

  def seeds(self, default: int) -> list[int]:
    """Each member's seed (`default`, the config's, where the sweep does not set one)."""
    return [int(m.get("seed", default)) for m in self.members]

  def label(self, index: int) -> str:
    """Member `index` as `field=value` pairs, e.g. `loss_kwargs.margin=5.0 seed=1`."""
    return overrides_label(self.members[index])


def overrides_label(overrides: dict[str, Any]) -> str:
  """A member's (or a setting's) overrides as `field=value` pairs, e.g.
  `loss_kwargs.margin=5.0 seed=1`; the one way a member is named on the console."""
  return " ".join(f"{k}={v}" for k, v in overrides.items())


def _loss_specs(loss: str) -> dict[str, Any]:
  """The loss's hyper-parameter specs (`losses.hparam_specs`); {} for an unknown loss, which
  `experiment.build` reports through the loss registry."""
  try:
    return losses.hparam_specs(loss)
  except ValueError:
    return {}


def _sweepable(specs: dict[str, Any]) -> list[str]:
  return ["seed", *(f"loss_kwargs.{k}" for k, v in specs.items() if isinstance(v, Real)),
          *OPTIMIZER_FIELDS]


def sweepable_fields(loss: str) -> list[str]:
  """The fields `config.sweep` may name for a config with this loss."""
  return _sweepable(_loss_specs(loss))


def _number(field: str, text: str) -> float | int:
  try:
    value = int(text) if field == "seed" else float(text)
  except ValueError:
    kind = "an integer" if field == "seed" else "a number"
    raise SweepError(f"sweep: {field} value {text!r} is not {kind}") from None
  if isinstance(value, float) and not math.isfinite(value):
    raise SweepError(f"sweep: {field} value {text!r} is not finite")
  return value


def _check_value(loss: str, specs: dict[str, Any], field: str, value: Any) -> None:
  if field.startswith("loss_kwargs."):
    key = field.split(".", 1)[1]
    try:
      specs[key].check(loss, key, value)
    except (ValueError, TypeError) as e:
      raise SweepError(f"sweep: {e}") from None
  elif field == "optimizer.learning_rate" and not value > 0:
    raise SweepError(f"sweep: optimizer.learning_rate must be > 0, got {value}")
  elif field == "optimizer.weight_decay" and not value >= 0:
    raise SweepError(f"sweep: optimizer.weight_decay must be >= 0, got {value}")
  elif field == "seed" and value < 0:
    raise SweepError(f"sweep: seed must be >= 0, got {value}")


def _check_field(config: ml_collections.ConfigDict, specs: dict[str, Any], field: str) -> None:
  allowed = _sweepable(specs)
  if field in allowed:
    return
  exists = True
  node: Any = config
  for part in field.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      exists = False
      break
    node = node[part]
  if field.startswith("loss_kwargs.") and field.split(".", 1)[1] in specs:
    why = "picks another formula (a string choice), which changes the program"
  elif field.startswith("loss_kwargs."):
    why = f"is not a hyper-parameter of loss {config.loss!r}"
  elif exists:
    why = "changes shapes or the program's structure"
  else:
    why = "is not a config field"
  raise SweepError(f"sweep: {field!r} {why}; sweepable fields: {', '.join(allowed)}")


def parse(config: ml_collections.ConfigDict) -> Sweep | None:
  """The population of `config.sweep` (None for a single run).

  Raises:
    SweepError: one line naming the first problem (syntax, an unknown or structural field, an
      empty or repeated list, a value out of range).
  """
  text = config.sweep.strip() if isinstance(config.sweep, str) else config.sweep
  if not isinstance(text, str):
    raise SweepError(f"sweep must be a string like 'seed=0,1;loss_kwargs.margin=5,10', got "
                     f"{config.sweep!r}")
  if not text:
    return None
  fields: list[str] = []
  lists: list[list[Any]] = []
  specs = _loss_specs(config.loss)  # the loss registry, asked once
  for entry in filter(None, (e.strip() for e in text.split(";"))):
    field, sep, values = entry.partition("=")
    field = field.strip()
    if not sep or not field:
      raise SweepError(f"sweep: {entry!r} is not field=v1,v2,... (entries are separated by ';')")
    _check_field(config, specs, field)
    if field in fields:
      raise SweepError(f"sweep: {field} is listed twice")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
      raise SweepError(f"sweep: {field} has an empty list of values")
    parsed = [_number(field, v) for v in items]
    if len(set(parsed)) < len(parsed):
      raise SweepError(f"sweep: {field} repeats a value ({values.strip()})")
    for value in parsed:
      _check_value(config.loss, specs, field, value)
    fields.append(field)
    lists.append(parsed)
  if not fields:
    raise SweepError("sweep: no field=v1,v2,... entry")
  members = tuple(dict(zip(fields, combo)) for combo in itertools.product(*lists))
  return Sweep(tuple(fields), members)


def check(config: ml_collections.ConfigDict, num_devices: int | None = None,
          num_processes: int = 1) -> tuple[list[str], int]:
  """The sweep's problems, one line each, and the mesh's member shards
  (`config.sweep_member_shards` where it is valid, else 1): what `experiment.build` needs of
  the sweep, in one pass. Across `num_processes` > 1 processes each member shard takes an
  equal share of every process's devices (`parallel.make_mesh`), so the shards must also
  divide each process's devices."""
  try:
    parsed = parse(config)
  except SweepError as e:
    return [str(e)], 1
  if config.sweep_members_as not in MEMBERS_AS:
    return [f"sweep_members_as must be one of {', '.join(MEMBERS_AS)}, got "
            f"{config.sweep_members_as!r}"], 1
  shards = config.sweep_member_shards
  if not (isinstance(shards, int) and shards >= 1):
    return [f"sweep_member_shards must be an integer >= 1, got {shards!r}"], 1
  if shards > 1 and parsed is None:
    return ["sweep_member_shards > 1 needs a sweep (config.sweep)"], 1
  problems = []
  if parsed is not None and parsed.size % shards:
    problems.append(f"sweep_member_shards={shards} does not divide the sweep's {parsed.size} "
                    "members")
  if num_devices is not None and num_devices % shards:
    problems.append(f"sweep_member_shards={shards} does not divide the {num_devices} devices")
  elif num_devices is not None and num_processes > 1 and (num_devices // num_processes) % shards:
    problems.append(f"sweep_member_shards={shards} does not divide each of the {num_processes} "
                    f"processes' {num_devices // num_processes} devices")
  return problems, 1 if problems else shards


def sweep_problems(config: ml_collections.ConfigDict, num_devices: int | None = None
                   ) -> list[str]:
  """The sweep's problems, one line each (`check`'s first half)."""
  return check(config, num_devices)[0]


def member_config(config: ml_collections.ConfigDict, overrides: dict[str, Any]
                  ) -> ml_collections.ConfigDict:
  """`config` as member `overrides`' single run: the overrides set, `sweep` cleared."""
  single = copy.deepcopy(config)
  single.sweep = ""
  for field, value in overrides.items():
    *parents, leaf = field.split(".")
    node = single
    for part in parents:
      node = node[part]
    node[leaf] = value
  return single
