"""The compute study's runs per seed: the arms, the sweeps, the `real` sweep, the variants.

Every run is a `Variant`: a label, an arm, and the config fields set for it,
as `(dotted field, value)` pairs a reader (and `grep`) can follow. A config
names its extra runs in `config.study.variants` as `Variant`s; the string form
``"label: arm=wmrl, correction.wm_var=per_sample"`` (a flag's
``--config.study.variants='("…",)'``) is read too (`Variant.parse`).
`study_runs(config)` lists `(label, overrides)` of every run a seed makes, in
order; the labels name the runs in `results.json` and `--extend` adds the
labels an earlier study lacks.

Example:
    >>> Variant("wmrl_pervar", "wmrl", (("correction.wm_var", "per_sample"),)).overrides()
    {'arm': 'wmrl', 'correction.wm_var': 'per_sample'}
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import ml_collections

__all__ = ["Variant", "parse_variant", "real_cell", "real_cells", "study_runs", "study_variants"]


class Variant(NamedTuple):
    """One run of a seed: `label` (its name in `results.json`), `arm`, and `fields`, the
    config fields set for it as `(dotted field, value)` pairs (e.g.
    `(("agent.recipe.warm_start.steps", 600),)`).

    A tuple, so a config holds it and its JSON (`results.json`, the checkpoints)
    keeps it as a list that `Variant.of` reads back.
    """

    label: str
    arm: str
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, entry: Variant | str | Sequence) -> Variant:
        """A variant from a `Variant`, its JSON list, or the string form (`parse`).

        Raises:
          ValueError: a malformed entry, naming it.
        """
        if isinstance(entry, str):
            return cls.parse(entry)
        try:
            label, arm, fields = entry
            fields = tuple((str(key), value) for key, value in fields)
        except (TypeError, ValueError):
            raise ValueError(
                f"study variant {entry!r}: expected Variant(label, arm, ((field, value), ...))"
            ) from None
        if not label or not arm or any(key == "arm" for key, _ in fields):
            raise ValueError(f"study variant {entry!r}: needs a label and an arm (not a field)")
        return cls(str(label), str(arm), fields)

    @classmethod
    def parse(cls, spec: str) -> Variant:
        """`"label: arm=wmrl, correction.wm_var=per_sample"` as a `Variant`.

        Values are Python literals where they parse as one (`600`, `0.2`, `True`),
        else strings. A variant must name its arm.

        Raises:
          ValueError: a malformed spec, naming it.
        """
        label, sep, body = spec.partition(":")
        label = label.strip()
        overrides = {}
        for item in body.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"study variant {spec!r}: expected 'label: key=value, ...'")
            try:
                overrides[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                overrides[key.strip()] = value.strip()
        if not sep or not label or "arm" not in overrides:
            raise ValueError(f"study variant {spec!r}: expected 'label: arm=<arm>, key=value, ...'")
        arm = overrides.pop("arm")
        return cls(label, arm, tuple(overrides.items()))

    def overrides(self) -> dict[str, Any]:
        """`{"arm": arm, field: value, ...}`, as `train.config.override` takes them."""
        return {"arm": self.arm, **dict(self.fields)}


def parse_variant(spec: str) -> tuple[str, dict]:
    """`Variant.parse(spec)` as `(label, overrides)`."""
    variant = Variant.parse(spec)
    return variant.label, variant.overrides()


def real_cell(groups: int, lr: float) -> tuple[str, dict]:
    """The `real` arm with `groups` groups per update at learning rate `lr`: (label, overrides)."""
    variant = _real_cell(groups, lr)
    return variant.label, variant.overrides()


def _real_cell(groups: int, lr: float, label: str = "") -> Variant:
    fields = (("tasks_per_step", groups), ("optimizer.lr", lr))
    return Variant(label or f"real_g{groups}_lr{lr:g}", "real", fields)


def real_cells(config: ml_collections.ConfigDict) -> list[tuple[str, dict]]:
    """The `real` sweep (`study.real_sweep_groups` x `study.real_sweep_lr`, but the config's
    own cell, which is `real`) and `study.best_real` (a cell's label, e.g. "real_g5_lr0.003",
    picked on other seeds) as `real_best`."""
    return [(v.label, v.overrides()) for v in _real_variants(config)]


def _real_variants(config: ml_collections.ConfigDict) -> list[Variant]:
    s, out = config.study, []
    own = (config.tasks_per_step, config.optimizer.lr)
    for groups in s.get("real_sweep_groups", ()):
        for lr in s.get("real_sweep_lr", ()):
            if (groups, lr) != own:
                out.append(_real_cell(groups, lr))
    if s.get("best_real", ""):
        match = re.fullmatch(r"real_g(\d+)_lr([0-9.e+-]+)", s.best_real)
        if match is None:
            raise ValueError(f"study.best_real {s.best_real!r}: expected real_g<groups>_lr<lr>")
        out.append(_real_cell(int(match[1]), float(match[2]), label="real_best"))
    return out


def study_variants(config: ml_collections.ConfigDict) -> list[Variant]:
    """Every run per seed as a `Variant`: the arms, the ρ and WM-quality sweeps, the `real`
    sweep, then the named variants (`config.study.variants`).

    Raises:
      ValueError: a variant sets a field the config does not have, or two runs share a
        label.
    """
    s = config.study
    runs = [Variant(arm, arm) for arm in s.arms]
    for rho in s.rho_sweep:
        if rho != config.anchor_fraction:
            runs.append(Variant(f"wmrl_rho{rho:g}", "wmrl", (("anchor_fraction", rho),)))
    for warm in s.warm_sweep:
        if warm != config.agent.recipe.warm_start.steps:
            for arm in s.warm_sweep_arms:
                fields = (("agent.recipe.warm_start.steps", warm),)
                runs.append(Variant(f"{arm}_warm{warm}", arm, fields))
    runs += _real_variants(config)
    for entry in s.get("variants", ()):
        variant = Variant.of(entry)
        for key, _ in variant.fields:  # A mistyped key would otherwise add a setting nothing reads.
            node = config
            for part in key.split("."):
                if part not in node:
                    raise ValueError(
                        f"study variant {variant.label!r}: config has no field {key!r}"
                    )
                node = node[part]
        runs.append(variant)
    labels = [v.label for v in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"study runs share a label: {labels}")
    return runs


def study_runs(config: ml_collections.ConfigDict) -> list[tuple[str, dict]]:
    """(label, overrides) of every run per seed (`study_variants`), in order."""
    return [(v.label, v.overrides()) for v in study_variants(config)]
