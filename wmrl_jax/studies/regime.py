"""The regime map: where a world model pays, by its quality and the cost of an execution.

Every run of the map is a compute-study run (`wmrl_jax.studies.compute`) stopped
at an update cap, with the policy's exact expected held-out percentile after
every update (`wmrl_jax.studies.exact`). Its trajectory therefore does not
depend on what an execution or a token costs, and one run gives its compute
curve under every cost: `wmrl_jax.train.cost.reprice` charges each execution
a fixed number of seconds (or its recorded ones) and the tokens of an
N-parameter model. The world-model arms run with the synthetic world model
(`config.world_model.kind=synthetic`) at target qualities q, and with the
learned one, beside `anchors_only` (its control: the same executions per
update) and `real_best` (the `real` cell the real sweep picked on other seeds).

Per cell (arm, q, execution cost, N) and seed:

* **the target** is `real_best`'s own final level on that seed (the trailing
  mean of its exact held-out curve over `smooth` updates);
* **compute-to-target** is where the run's smoothed exact curve first reaches
  it under that cost (`analysis.reach`, interpolated); a run that never reaches
  it within its updates is "never";
* **ratio_vs_best_real** is real_best's compute-to-target over the run's, and
  **ratio_vs_anchors_only** anchors_only's over the run's, per seed; the cell
  reports the median and the 5%–95% quantiles over seeds (a 90% interval) and
  the seeds where both reached it; a seed where the run never reaches the
  target counts as 0 (no saving shown), one where only the other never does as
  a lower bound;
* **the paired difference to anchors_only** of the final level (the same at
  every cost), with its Student-t interval;
* **q_realised**: the world model's within-group Spearman correlation with the
  truth on programs never executed in the run so far
  (`oracle/wm_oos_group_rank_corr`, the one definition for the synthetic and
  the learned world model), averaged over steps and seeds.

Per (arm, cost, N), **q_break_even** is the realised q at which the median
ratio against `real_best`, linearly interpolated between the synthetic cells
ordered by realised q, first reaches 1 (None: no cell reaches it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wmrl_jax.studies import analysis
from wmrl_jax.studies.compute import last_finite, step_series
from wmrl_jax.studies.compute_paired import exact_curves, smoothed
from wmrl_jax.train.cost import CostModel

TARGET = "real_best"
CONTROL = "anchors_only"
Q_KEY = "oracle/wm_oos_group_rank_corr"


def spearman_from_pairwise_accuracy(accuracy: float) -> dict[str, float]:
    """A judge's pairwise accuracy as the map's q, under a Gaussian copula.

    Pairwise accuracy p (the share of pairs a judge orders as the truth does, no
    ties) is the concordance probability, so Kendall's τ = 2p − 1. For a
    bivariate normal with correlation r, τ = (2/π)·arcsin(r) and Spearman's
    ρ_S = (6/π)·arcsin(r/2); so r = sin(π·τ/2) and ρ_S follows.

    Example:
      >>> {k: round(v, 2) for k, v in spearman_from_pairwise_accuracy(0.615).items()}
      {'kendall_tau': 0.23, 'pearson': 0.35, 'spearman': 0.34}
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"pairwise accuracy must be in [0, 1], got {accuracy}")
    tau = 2.0 * accuracy - 1.0
    r = float(np.sin(np.pi * tau / 2.0))
    return {"kendall_tau": tau, "pearson": r, "spearman": float(6.0 / np.pi * np.arcsin(r / 2.0))}


# Published world-model qualities placed on the map, as (name, pairwise accuracy).
LITERATURE = (("ForeAgent: a frontier LLM judging ML solutions", 0.615),)


def literature_points() -> list[dict]:
    """`LITERATURE`, each point with its Kendall τ and Spearman q (the map's x-axis)."""
    return [{"name": name, "pairwise_accuracy": acc, **spearman_from_pairwise_accuracy(acc)}
            for name, acc in LITERATURE]  # fmt: skip


def cell_label(arm: str, q: float) -> str:
    """The run label of `arm` with the synthetic world model at target q, e.g. `wmrl_q0.4`."""
    return f"{arm}_q{q:g}"


def variants(arms, qs) -> tuple[str, ...]:
    """The study variants (`studies.runs.parse_variant`) of every (arm, target q) cell."""
    return tuple(
        f"{cell_label(arm, q)}: arm={arm}, world_model.kind=synthetic, "
        f"world_model.synthetic.q={q:g}"
        for arm in arms
        for q in qs
    )


def parse_label(label: str, arms) -> tuple[str, float | None] | None:
    """`(arm, target q)` of a map run: q None for the learned world model; None for a
    run that is not a world-model cell (the target, the control)."""
    for arm in sorted(arms, key=len, reverse=True):
        if label == arm:
            return arm, None
        if label.startswith(f"{arm}_q"):
            try:
                return arm, float(label[len(arm) + 2 :])
            except ValueError:
                return None
    return None


@dataclasses.dataclass(frozen=True)
class Axes:
    """The map's cost axes: seconds per execution (None: the recorded seconds) and the
    model sizes N, priced with `model`'s accelerator and token lengths; with
    `charge_repeats`, every cached repeat is charged as an execution too
    (`CostModel.charge_repeats`; the recorded-seconds cost is then left out)."""

    model: CostModel
    costs: tuple[float | None, ...]
    params: tuple[float, ...]
    charge_repeats: bool = False

    def priced(self):
        """(cost, N, CostModel) of every cell of the cost axes."""
        for n in self.params:
            for c in self.costs:
                if c is None and self.charge_repeats:
                    continue
                yield c, n, dataclasses.replace(
                    self.model, params=float(n), execution_seconds=c,
                    charge_repeats=self.charge_repeats,
                )  # fmt: skip

    def repeats_charged(self) -> Axes:
        """The same axes with every repeat charged, at the fixed costs only."""
        costs = tuple(c for c in self.costs if c is not None)
        return dataclasses.replace(self, costs=costs, charge_repeats=True)


def censored_ratios(base: np.ndarray, own: np.ndarray, base_total, own_total) -> dict:
    """Per seed base / own compute-to-target, the censored seeds decided conservatively.

    A seed where the run never reaches the target within its updates counts as
    ratio 0: it showed no saving (the run might reach it later, for more than
    its whole compute, so base / (its whole compute) would only bound the ratio
    from above). A seed where only the base never reaches it gives the lower
    bound (the base's whole compute) / own. NaN where neither reaches it.
    """
    out = np.full(base.shape, np.nan)
    both = np.isfinite(base) & np.isfinite(own)
    out[both] = base[both] / np.maximum(own[both], 1e-12)
    never = ~np.isfinite(own) & np.isfinite(base)
    out[never] = 0.0
    lower = ~np.isfinite(base) & np.isfinite(own)
    out[lower] = base_total[lower] / np.maximum(own[lower], 1e-12)
    return {"ratios": out, "upper": never, "lower": lower, "both": both}


def ratio_summary(r: dict) -> dict:
    """Median and 5%-95% quantiles (a 90% interval) of per-seed ratios, the seeds, the
    seeds where both reached the target, and how many are bounds (`censored_ratios`)."""
    ratios = r["ratios"]
    ok = np.isfinite(ratios)
    out = {
        "seeds": int(ok.sum()), "reached": int(np.sum(r["both"])),
        "run_never": int(np.sum(r["upper"])), "other_never": int(np.sum(r["lower"])),
    }  # fmt: skip
    if not ok.any():
        return {"median": None, "lo": None, "hi": None, **out}
    med, lo, hi = np.quantile(ratios[ok], [0.5, 0.05, 0.95])
    return {"median": float(med), "lo": float(lo), "hi": float(hi), **out}


def q_realised(summaries: list[dict]) -> tuple[float | None, list]:
    """The runs' mean realised q (mean over steps, then seeds) and each seed's."""
    return mean_over_steps(step_series(summaries, Q_KEY))


def mean_over_steps(per_step) -> tuple[float | None, list]:
    """Of a [seeds, steps] series (NaN: no value): the mean over steps, then over seeds,
    and each seed's mean (None for a seed without a value)."""
    per_seed = [analysis.finite(np.nanmean(row)) if np.isfinite(row).any() else None
                for row in np.asarray(per_step, np.float64)]  # fmt: skip
    got = [v for v in per_seed if v is not None]
    return (float(np.mean(got)) if got else None), per_seed


def break_even(qs: list[float], medians: list[float | None]) -> float | None:
    """The first q at which the piecewise-linear median ratio(q) reaches 1 (`analysis.reach`
    over the cells ordered by realised q); None where none reaches it."""
    pts = sorted(
        (q, 0.0 if m is None else m) for q, m in zip(qs, medians, strict=True) if q is not None
    )
    if not pts:
        return None
    x, y = np.array(pts).T
    return analysis.finite(analysis.reach(x, y, 1.0))


LEDGER_KEYS = ("samples", "executions", "cached")


def ledger_totals(summaries: list[dict]) -> dict[str, float | None]:
    """Mean over seeds of a run's final cumulative samples, charged executions and cached
    ones (repeats of a program already executed on its task, answered free)."""
    return {k: analysis.finite(np.nanmean(last_finite(step_series(summaries, f"ledger/{k}"))))
            for k in LEDGER_KEYS}  # fmt: skip


def flatness(summaries: list[dict], smooth: int, model: CostModel) -> dict:
    """How flat the target's exact curve ends: the rise of its smoothed held-out curve over
    its last quarter of updates, paired over seeds (mean and 90% t interval)."""
    _, y = exact_curves(summaries, "heldout_percentile", model)
    y = smoothed(y, smooth)
    ends, quarter = [], []
    for row in y:
        ok = np.flatnonzero(np.isfinite(row))
        if ok.size < 4:
            continue
        ends.append(row[ok[-1]])
        quarter.append(row[ok[-1 - ok.size // 4]])
    p = analysis.paired(np.array(ends), np.array(quarter))
    return {"rise_last_quarter": p.to_dict()}


def analyse(
    results: dict[str, list[dict]],
    *,
    arms,
    axes: Axes,
    smooth: int = 5,
    level: float = 0.9,
    margin: float = 0.02,
) -> dict:
    """The map: one row per (arm, q, cost, N), `q_break_even` per (arm, cost, N).

    Args:
      results: `{label: [summary per seed]}` holding `real_best`, `anchors_only` and
        the world-model runs (`cell_label` labels, and the arms themselves: the
        learned world model), every summary with the exact curves.
      arms: the world-model arms of the map (e.g. `("wmrl", "wmrl_ppi")`).
      axes: the execution costs and model sizes.
      smooth: updates in the trailing mean of a final level.
      level: the paired interval's coverage.
      margin: the equivalence margin of the paired difference to anchors_only.

    The analysis also holds, under `repeats_charged`, the same map priced as if
    every cached repeat were executed again (`Axes.repeats_charged`): its rows,
    break-evens and the control against the target. Pricing only: the runs are
    the same, where a benchmark without repeats would also give other outcomes
    (a repeat draws a fresh replicate instead of the remembered one).

    Raises:
      ValueError: `real_best` or `anchors_only` is missing.
    """
    for need in (TARGET, CONTROL):
        if need not in results:
            raise ValueError(f"the regime map needs the {need!r} runs; got {sorted(results)}")
    finals = {
        label: last_finite(smoothed(exact_curves(s, "heldout_percentile", axes.model)[1], smooth))
        for label, s in results.items()
    }
    # Less a rounding margin: the moving average's float error must not keep a curve, the
    # target's own included, from a level it holds.
    targets = finals[TARGET] - 1e-9
    cells = {label: parse_label(label, arms) for label in results}
    cells = {label: c for label, c in cells.items() if c is not None}
    base = {}  # What a cell is at every cost: its q, its final level against the control.
    for label, (arm, q) in cells.items():
        p = analysis.paired(finals[label], finals[CONTROL], level=level)
        realised, per_seed = q_realised(results[label])
        base[label] = {
            "label": label, "arm": arm, "q": q, "learned": q is None,
            "q_realised": realised, "q_realised_seeds": per_seed,
            "vs_anchors_only": {**p.to_dict(), "verdict": analysis.equivalence(p, margin)},
            "heldout_final": float(np.nanmean(finals[label])),
        }  # fmt: skip
    rows, control = _priced_rows(results, base, axes, targets, smooth)
    out = {
        "target": TARGET, "control": CONTROL, "arms": list(arms), "smooth": smooth,
        "level": level, "margin": margin, "costs": list(axes.costs),
        "params": [float(n) for n in axes.params], "rows": rows,
        "break_even": break_evens(rows, arms, axes),
        "anchors_only_vs_best_real": control,
        "target_final": float(np.nanmean(finals[TARGET])),
        "control_final": float(np.nanmean(finals[CONTROL])),
        "target_flatness": flatness(results[TARGET], smooth, axes.model),
        "measure": "final exact held-out",
        "literature": literature_points(),
        "ledger": {label: ledger_totals(s) for label, s in results.items()},
        "target_level": f"`{TARGET}`'s final level",
    }  # fmt: skip
    if any(c is not None for c in axes.costs):
        again = axes.repeats_charged()
        rows, control = _priced_rows(results, base, again, targets, smooth)
        out["repeats_charged"] = {
            "costs": list(again.costs), "rows": rows,
            "break_even": break_evens(rows, arms, again), "anchors_only_vs_best_real": control,
        }  # fmt: skip
    return out


def _priced_rows(results: dict, base: dict, axes: Axes, targets: np.ndarray, smooth: int):
    """The map's rows (each cell of `base` at every priced cost and N) and the control
    against the target per `cost_key|N`."""
    rows, control = [], {}
    for cost, n, model in axes.priced():
        ratios = _priced_ratios(results, model, targets, smooth)
        control[f"{cost_key(cost)}|N{n:g}"] = ratios(TARGET, CONTROL)
        for label, cell in base.items():
            rows.append({
                **cell, "cost": cost, "params": float(n),
                "ratio_vs_best_real": ratios(TARGET, label),
                "ratio_vs_anchors_only": ratios(CONTROL, label),
            })  # fmt: skip
    return rows, control


def _priced_ratios(results: dict, model: CostModel, targets: np.ndarray, smooth: int):
    """`ratios(base, own)` (a `ratio_summary`) of two runs' compute-to-target under `model`."""
    reach, total = {}, {}
    for label, summaries in results.items():
        x, y = exact_curves(summaries, "heldout_percentile", model)
        reach[label] = analysis.reach_rows(x, smoothed(y, smooth), targets)
        total[label] = last_finite(x)

    def ratios(base: str, own: str) -> dict:
        return ratio_summary(censored_ratios(reach[base], reach[own], total[base], total[own]))

    return ratios


def cost_key(cost: float | None) -> str:
    return "recorded" if cost is None else f"{cost:g}s"


def break_evens(rows: list[dict], arms, axes: Axes) -> list[dict]:
    """`q_break_even` (against the best real cell) and `q_break_even_vs_anchors_only` per
    (arm, cost, N), from the synthetic cells of `rows`."""
    out = []
    for arm in arms:
        for cost, n, _ in axes.priced():
            cells = [r for r in rows if r["arm"] == arm and not r["learned"]
                     and r["cost"] == cost and r["params"] == float(n)]  # fmt: skip
            out.append({
                "arm": arm, "cost": cost, "params": float(n),
                "q_break_even": break_even(
                    [r["q_realised"] for r in cells],
                    [r["ratio_vs_best_real"]["median"] for r in cells],
                ),
                "q_break_even_vs_anchors_only": break_even(
                    [r["q_realised"] for r in cells],
                    [r["ratio_vs_anchors_only"]["median"] for r in cells],
                ),
            })  # fmt: skip
    return out
