"""Named variants of a config file: the one way every file in `configs/` offers its `:arg`.

A config file declares `VARIANTS`, a mapping from a variant's name to its *overrides* (dotted
field -> value), and ends `get_config(arg)` with `apply_variant(config, arg, VARIANTS, default)`:

    VARIANTS = variants.loss_variants(("ce", "ls", "mbls"), margin=6.0)

    def get_config(arg=None):
      config = base_config()
      ...  # the paper's recipe
      return variants.apply_variant(config, arg, VARIANTS, default="mbls")

so `python train.py --config=configs/x.py:ls` and `--config=configs/x.py` (the default) differ
only by those overrides, an unknown name is one line listing the valid ones, and tools (the
tests, the studies in `bench/`) list a file's variants from `VARIANTS` alone. Tables here give
the overrides the papers' columns share: the loss columns of MbLS/ACLS (`loss_variants`) and the
smoothing levels of LS-vs-SC (`smoothing_variants`).
"""
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from calib_jax.config import schema as config_lib

Overrides = Mapping[str, Any]

# Per-loss hyper-parameters used by the papers' tables (MbLS Sec. 5 "Baselines", ACLS Sec. 4.1
# "Hyperparameters"): LS eps=0.05, FL gamma=3, FLSD gamma 5/3, ECP beta=0.1, MbLS alpha=0.1 with
# a per-dataset margin; ACLS lambda_1=0.1, lambda_2=0.01 with the same margin; CRL weight 1.
LOSS_COLUMNS = ("ce", "ls", "focal", "flsd", "ecp", "mbls", "mbls_m0", "acls", "crl", "mdca",
                "cpc", "mmce", "lr")
# LS-vs-SC varies only the smoothing level alpha (its Figs. 1 and 4 use 0.1 to 0.4); other
# levels through `--config.loss_kwargs.epsilon=`.
SMOOTHING_LEVELS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def override(config: ml_collections.ConfigDict, overrides: Overrides) -> ml_collections.ConfigDict:
  """Sets each dotted field of `overrides` in `config` (returned for chaining).

  A mapping value replaces a free-form sub-dict (`loss_kwargs`, `data.splits`, ...) whole; the
  locked schema still refuses an unknown field or a value of the wrong type.
  """
  for dotted, value in overrides.items():
    parent = dotted.rsplit(".", 1)[0] if "." in dotted else ""
    message = config_lib.unknown_field_message(config, parent) if parent else None
    if message is None and parent not in config_lib.FREE_FORM_FIELDS:
      message = config_lib.unknown_field_message(config, dotted)
    if message:
      raise config_lib.ConfigError(f"override {dotted!r}: {message}")
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
      node = node[part]
    if isinstance(value, Mapping):
      if dotted not in config_lib.FREE_FORM_FIELDS:
        raise ValueError(f"override {dotted!r}: only the free-form fields "
                         f"({', '.join(config_lib.FREE_FORM_FIELDS)}) take a mapping")
      value = ml_collections.ConfigDict(dict(value))
    node[leaf] = value
  return config


def variant_name(arg: str | None, variants: Iterable[str], default: str) -> str:
  """The variant named by a config file's `:arg` (`default` when empty), checked."""
  names = tuple(variants)
  name = arg or default
  if name not in names:
    raise ValueError(f"Unknown config variant {name!r}; valid: {', '.join(names)}")
  return name


def apply_variant(config: ml_collections.ConfigDict, arg: str | None,
                  variants: Mapping[str, Overrides], default: str) -> ml_collections.ConfigDict:
  """`config` with the overrides of the variant `arg` names (`default` when empty)."""
  return override(config, variants[variant_name(arg, variants, default)])


def loss_overrides(column: str, *, margin: float) -> dict[str, Any]:
  """Overrides for one loss column of the MbLS/ACLS tables, with the papers' settings.

  Args:
    column: one of `LOSS_COLUMNS`; `mbls_m0` is MbLS with margin 0 ("Ours (m=0)"), `crl` is CE
      with the CRL ranking term.
    margin: the dataset's margin for MbLS and ACLS (6 for CIFAR-10 and 20 Newsgroups, else 10).
  """
  if column not in LOSS_COLUMNS:
    raise ValueError(f"Unknown loss column {column!r}; valid: {', '.join(LOSS_COLUMNS)}")
  kwargs = {
      "ls": {"epsilon": 0.05},
      "focal": {"gamma": 3.0},
      "flsd": {"gamma": 3.0},
      "ecp": {"beta": 0.1},
      "mbls": {"margin": float(margin), "alpha": 0.1},
      "mbls_m0": {"margin": 0.0, "alpha": 0.1},
      "acls": {"margin": float(margin), "lambda_pos": 0.1, "lambda_neg": 0.01},
      "lr": {"alpha": 0.1},
  }.get(column, {})
  return {"loss": {"crl": "ce", "mbls_m0": "mbls"}.get(column, column), "loss_kwargs": kwargs,
          "crl_weight": 1.0 if column == "crl" else 0.0}


def loss_variants(columns: Iterable[str], *, margin: float) -> dict[str, dict[str, Any]]:
  """`{column: loss_overrides(column, margin=margin)}` for each of `columns`."""
  return {column: loss_overrides(column, margin=margin) for column in columns}


def smoothing_variants(levels: Iterable[float] = SMOOTHING_LEVELS) -> dict[str, dict[str, Any]]:
  """LS-vs-SC's runs: `ce` (alpha = 0) and `ls<alpha>` (e.g. `ls0.2`) for each level."""
  table: dict[str, dict[str, Any]] = {"ce": {"loss": "ce", "loss_kwargs": {}}}
  for alpha in levels:
    if not 0.0 < alpha < 1.0:
      raise ValueError(f"label smoothing alpha must be in (0, 1), got {alpha}")
    table[f"ls{alpha:g}"] = {"loss": "ls", "loss_kwargs": {"epsilon": float(alpha)}}
  return table
