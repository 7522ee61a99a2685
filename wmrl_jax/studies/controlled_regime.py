"""The regime map in the controlled study: where truth is known and programs are novel.

The real-program map (`wmrl_jax.studies.regime`) replays a recorded table whose
recipes recur; here the same question is asked of the simulated environment of
`wmrl_jax.studies.controlled`, where every sample can be a new program
(``config.env.novelty``: its quality is its candidate's plus fresh noise that
only its own execution or the world model sees) and the policy's expected true
reward is known exactly at every step. Cell for cell the same as the real map:

* **runs**: the world-model arms with the synthetic world model scrambled to a
  target within-group Spearman q (``world_model.kind=copula``, no blind spots:
  the replay map's synthetic world model) at each q of ``regime.q``, and the
  real-execution cells: ``real`` (every group of ``tasks_per_step`` executed),
  ``real_g<B>`` (real GRPO at B groups per update, ``regime.real_groups``) and
  ``anchors_only`` (the anchor groups alone: real GRPO at round(ρ·B) groups);
  every run at ``num_steps`` updates on the same seeds;
* **compute**: each update's samples, world-model rows, trained rows and
  executions priced afterwards with `wmrl_jax.train.cost.CostModel` (the
  compute study's token lengths) at each execution cost and model size N;
  ``anchors_only`` and ``real_g<B>`` sample only the groups they execute;
* **the target**: per seed, ``real``'s start plus ``target_fraction`` of its
  gain (the controlled study's definition), on curves smoothed over
  ``smooth`` updates;
* **best real, per seed and cost**: the least compute-to-target among the
  real-execution cells (``real``, ``real_g<B>``, ``anchors_only``): the batch
  size a user would pick at that cost, chosen after the fact (it favours the
  baseline);
* **ratios, paired difference, q realised, break-even**: as in the real map
  (`regime.censored_ratios`, `regime.ratio_summary`, `analysis.paired` on the final
  smoothed true reward against ``anchors_only``, the world model's realised
  within-group Spearman averaged over steps and seeds, `regime.break_even`).

The analysis has the real map's schema, so `regime_report.tables` and `plot`
render it.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np

from wmrl_jax.core import arms as arms_lib
from wmrl_jax.studies import analysis, controlled, regime
from wmrl_jax.studies.compute_paired import smoothed
from wmrl_jax.train.config import override
from wmrl_jax.train.cost import CostModel
from wmrl_jax.train.ledger import Ledger

BEST = "real_best"
CONTROL = "anchors_only"
REAL = "real"


def real_label(groups: int) -> str:
    """The label of real GRPO at `groups` groups per update, e.g. `real_g5`."""
    return f"{REAL}_g{groups}"


def real_runs(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
    """`{label: config}` of the real-execution cells: `real`, `real_g<B>`, `anchors_only`."""
    out = {REAL: config, CONTROL: config}
    for groups in config.regime.real_groups:
        if groups != config.tasks_per_step:
            out[real_label(groups)] = override(config, tasks_per_step=int(groups))
    return out


def wm_runs(config: ml_collections.ConfigDict) -> dict[str, tuple[str, ml_collections.ConfigDict]]:
    """`{label: (arm, config)}` of the world-model cells: each arm at each target q."""
    return {
        regime.cell_label(arm, q): (arm, override(config, **{"world_model.q": float(q)}))
        for arm in config.regime.arms
        for q in config.regime.q
    }


def run_map(config: ml_collections.ConfigDict) -> dict[str, dict[str, np.ndarray]]:
    """Every run of the map, the real-execution cells first: `{label: {name: [seeds,
    steps]}}`, `controlled.run_arm`'s metrics and the update's counts (`counts_of`)."""
    keys = jax.random.split(jax.random.key(config.seed), config.num_seeds)
    runs = {label: (CONTROL if label == CONTROL else REAL, c)
            for label, c in real_runs(config).items()}  # fmt: skip
    runs.update(wm_runs(config))
    out = {}
    for label, (arm, c) in runs.items():
        # The same keys for every run: a seed's environment is the same in each.
        run = jax.jit(jax.vmap(lambda key, c=c, arm=arm: controlled.run_arm(c, arm, key)))
        metrics = {k: np.asarray(v, np.float64) for k, v in run(keys).items()}
        metrics.update(counts_of(arm, c, metrics["executions"]))
        out[label] = metrics
    return out


def counts_of(arm: str, config: ml_collections.ConfigDict, executions: np.ndarray) -> dict:
    """Per-update counts `{samples, wm_rows, train_rows, executions}` ([seeds, steps])
    of `arm`: an arm without a world model that does not execute every group samples
    and trains on the groups it executes; the others sample, score (world-model arms)
    and train on every group."""
    spec = arms_lib.get(arm)
    rows = float(config.tasks_per_step * config.group_size)
    full = np.full_like(executions, rows)
    alone = not spec.world_model and spec.executes != "all"
    sampled = executions if alone else full
    return {
        "samples": sampled,
        "wm_rows": full if spec.world_model else np.zeros_like(executions),
        "train_rows": sampled,
        "executions": executions,
    }


def priced(run: dict, model: CostModel, execution_seconds: float) -> np.ndarray:
    """[seeds, steps] cumulative modelled seconds of `run`'s counts: its tokens at
    `model`'s lengths and N, and `execution_seconds` per execution."""
    model = dataclasses.replace(model, execution_seconds=float(execution_seconds))
    units = {f: model.seconds(Ledger(**{f: 1.0})) for f in ("samples", "wm_rows", "train_rows",
                                                            "executions")}  # fmt: skip
    per_step = sum(units[f] * np.asarray(run[f], np.float64) for f in units)
    return np.cumsum(per_step, axis=-1)


def targets(results: dict, *, smooth: int, fraction: float) -> np.ndarray:
    """[seeds]: `real`'s smoothed start plus `fraction` of its gain to its final level."""
    curve = smoothed(results[REAL]["true_reward"], smooth)
    return curve[:, 0] + fraction * (curve[:, -1] - curve[:, 0])


def analyse(
    results: dict,
    *,
    arms,
    model: CostModel,
    costs,
    params,
    smooth: int,
    fraction: float,
    level: float = 0.9,
    margin: float = 0.02,
) -> dict:
    """The map, in `regime.analyse`'s schema: rows per (arm, q, cost, N), the break-even
    q per (arm, cost, N), and `anchors_only` against the best real cell.

    Args:
      results: `run_map`'s output (real-execution cells and `<arm>_q<q>` cells).
      arms: the world-model arms of the map.
      model: the token costs (its N replaced by each of `params`).
      costs: seconds per execution; params: model sizes N.
      smooth: updates in the trailing mean; fraction: the target's share of `real`'s gain.
      level, margin: the paired interval's coverage and the equivalence margin.
    """
    target = targets(results, smooth=smooth, fraction=fraction) - 1e-9
    curves = {label: smoothed(r["true_reward"], smooth) for label, r in results.items()}
    finals = {label: c[:, -1] for label, c in curves.items()}
    real_cells = [label for label in results if label == REAL or label == CONTROL
                  or label.startswith(f"{REAL}_g")]  # fmt: skip
    cells = {label: regime.parse_label(label, arms) for label in results}
    cells = {label: c for label, c in cells.items() if c is not None}
    qinfo = {label: regime.mean_over_steps(results[label]["wm_q_realised"]) for label in cells}
    rows, control, picks = [], {}, {}
    for n in params:
        for cost in costs:
            m = dataclasses.replace(model, params=float(n))
            x = {label: priced(r, m, cost) for label, r in results.items()}
            reach = {label: analysis.reach_rows(x[label], curves[label], target) for label in x}
            total = {label: v[:, -1] for label, v in x.items()}
            best = np.min([reach[label] for label in real_cells], axis=0)
            key = f"{regime.cost_key(cost)}|N{n:g}"
            picks[key] = [real_cells[int(i)] for i in np.argmin([reach[r] for r in real_cells], 0)]
            # `real` reaches its own target (the reference of the "lower bound" case).
            vs_best = {label: _ratio(best, total[REAL], reach[label], total[label]) for label in x}
            control[key] = vs_best[CONTROL]
            for label, (arm, q) in cells.items():
                p = analysis.paired(finals[label], finals[CONTROL], level=level)
                rows.append({
                    "label": label, "arm": arm, "q": q, "learned": False, "cost": cost,
                    "params": float(n), "q_realised": qinfo[label][0],
                    "q_realised_seeds": qinfo[label][1],
                    "ratio_vs_best_real": vs_best[label],
                    "ratio_vs_anchors_only": _ratio(
                        reach[CONTROL], total[CONTROL], reach[label], total[label]
                    ),
                    "vs_anchors_only": {**p.to_dict(), "verdict": analysis.equivalence(p, margin)},
                    "heldout_final": float(np.mean(finals[label])),
                })  # fmt: skip
    axes = regime.Axes(model=model, costs=tuple(costs), params=tuple(params))
    return {
        "target": BEST, "control": CONTROL, "arms": list(arms), "smooth": smooth,
        "level": level, "margin": margin, "costs": list(costs),
        "params": [float(n) for n in params], "rows": rows,
        "break_even": regime.break_evens(rows, arms, axes),
        "anchors_only_vs_best_real": control, "best_real_picks": picks,
        "real_cells": real_cells,
        "real_finals": {label: float(np.mean(finals[label])) for label in real_cells},
        "target_final": float(np.mean(finals[REAL])),
        "control_final": float(np.mean(finals[CONTROL])),
        "measure": "final true reward",
        "literature": regime.literature_points(),
        "target_level": f"`{REAL}`'s target ({fraction:.0%} of its gain)",
    }  # fmt: skip


def _ratio(base, base_total, own, own_total) -> dict:
    return regime.ratio_summary(regime.censored_ratios(base, own, base_total, own_total))
