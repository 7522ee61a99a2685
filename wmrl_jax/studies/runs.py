"""The compute study's runs per seed: the arms, the sweeps, the `real` sweep, the variants.

`study_runs(config)` lists `(label, overrides)` of every run a seed makes, in
order; the labels name the runs in `results.json` and `--extend` adds the
labels an earlier study lacks.
"""

from __future__ import annotations

import ast
import re

import ml_collections


def parse_variant(spec: str) -> tuple[str, dict]:
    """`"label: arm=wmrl, correction.wm_var=per_sample"` as `(label, overrides)`.

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
    return label, overrides


def real_cell(groups: int, lr: float) -> tuple[str, dict]:
    """The `real` arm with `groups` groups per update at learning rate `lr`: (label, overrides)."""
    return f"real_g{groups}_lr{lr:g}", {"arm": "real", "tasks_per_step": groups,
                                        "optimizer.lr": lr}  # fmt: skip


def real_cells(config: ml_collections.ConfigDict) -> list[tuple[str, dict]]:
    """The `real` sweep (`study.real_sweep_groups` x `study.real_sweep_lr`, but the config's
    own cell, which is `real`) and `study.best_real` (a cell's label, e.g. "real_g5_lr0.003",
    picked on other seeds) as `real_best`."""
    s, out = config.study, []
    own = (config.tasks_per_step, config.optimizer.lr)
    for groups in s.get("real_sweep_groups", ()):
        for lr in s.get("real_sweep_lr", ()):
            if (groups, lr) != own:
                out.append(real_cell(groups, lr))
    if s.get("best_real", ""):
        match = re.fullmatch(r"real_g(\d+)_lr([0-9.e+-]+)", s.best_real)
        if match is None:
            raise ValueError(f"study.best_real {s.best_real!r}: expected real_g<groups>_lr<lr>")
        out.append(("real_best", real_cell(int(match[1]), float(match[2]))[1]))
    return out


def study_runs(config: ml_collections.ConfigDict) -> list[tuple[str, dict]]:
    """(label, overrides) of every run per seed: the arms, the ρ and WM-quality sweeps, then
    the named variants (`config.study.variants`, see `parse_variant`)."""
    s = config.study
    runs = [(arm, {"arm": arm}) for arm in s.arms]
    for rho in s.rho_sweep:
        if rho != config.anchor_fraction:
            runs.append((f"wmrl_rho{rho:g}", {"arm": "wmrl", "anchor_fraction": rho}))
    for warm in s.warm_sweep:
        if warm != config.agent.recipe.warm_start.steps:
            for arm in s.warm_sweep_arms:
                runs.append(
                    (f"{arm}_warm{warm}", {"arm": arm, "agent.recipe.warm_start.steps": warm})
                )
    runs += real_cells(config)
    for spec in s.get("variants", ()):
        label, overrides = parse_variant(spec)
        for key in overrides:  # A mistyped key would otherwise add a setting nothing reads.
            node = config
            for part in key.split("."):
                if part not in node:
                    raise ValueError(f"study variant {label!r}: config has no field {key!r}")
                node = node[part]
        runs.append((label, overrides))
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"study runs share a label: {labels}")
    return runs
