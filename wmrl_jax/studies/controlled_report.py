"""The controlled study's command: run it with its blind-spot sweep, and render its report.

`run_and_report` writes ``results.json`` (config, per-arm summary, per-step
mean curves, the blind-spot sweep), ``table.md`` and ``controlled.png`` and
prints the tables; with a README or a docs page, it rewrites the controlled
section of ``docs/controlled_study.md`` (between its markers) with the
tables, and the README's ``controlled-headline`` section with the headline
(`headline`).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from absl import logging

from wmrl_jax.core import arms as arms_lib
from wmrl_jax.core import ppi
from wmrl_jax.readme import report_paths, write_report
from wmrl_jax.studies import analysis, controlled, report
from wmrl_jax.train.summary import write_json

_COMMAND = "python -m experiments.controlled --config=experiments/configs/controlled.py"
SECTION = "controlled"  # <!-- controlled:begin --> in docs/controlled_study.md.


def headline(
    summary: dict, fractions, *, fraction: float, seeds: int, steps: int,
    estimators: list[dict] = (), margin: float | None = None,
) -> str:  # fmt: skip
    """The README's headline: where `real`, `wmrl` and its control end, the arms that win
    among those executing no more than `wmrl` (within two standard errors of the best),
    and, given `estimators`, whether `wmrl_ppi` kept to its control.

    Args:
      summary: arm -> `controlled.summarize` row at the config's blind-spot fraction.
      fractions: the blind-spot fractions of the sweep (named in the last sentence).
      fraction, seeds, steps: the config's blind-spot fraction, seeds and updates per arm.
      estimators: `against_control` rows; margin: the equivalence margin they used.
    """

    def cell(arm: str) -> str:
        row = summary[arm]
        return f"{row['final_true_reward']:.3f} ± {row['final_true_reward_se']:.3f}"

    first = (
        f"At blind-spot fraction {fraction:.0%} ({seeds} seeds, {steps} updates per arm) `real` "
        f"ends at {cell('real')} true reward with {summary['real']['total_executions']:.0f} "
        "executions per seed"
    )
    if "wmrl" not in summary:
        return first + "."
    budget = summary["wmrl"]["total_executions"]
    first += f"; `wmrl` at {cell('wmrl')} with {budget:.0f}"
    if "anchors_only" in summary:
        first += f", its control `anchors_only` at {cell('anchors_only')}"
    cheap = {a: r for a, r in summary.items() if r["total_executions"] <= budget}
    wins = ", ".join(f"`{a}` ({cell(a)})" for a in controlled.winners(cheap))
    swept = ", ".join(f"{float(f):.0%}" for f in sorted(fractions))
    return (
        f"{first}. Best among the arms executing no more than `wmrl` (within two standard "
        f"errors): {wins}.{_ppi_sentence(estimators, margin, fraction)} The tables give every "
        f"arm and the sweep over blind-spot fractions {swept}."
    )


def _ppi_sentence(rows, margin: float | None, fraction: float) -> str:
    """Whether `wmrl_ppi` stayed within the margin of `anchors_only` at every fraction, and
    whether it still rises where `wmrl` flattens (at the config's `fraction`); "" without it."""
    ppi_rows = [r for r in rows if r["arm"] == "wmrl_ppi"]
    if not ppi_rows:
        return ""

    def fractions(rs):
        return ", ".join(f"{r['fraction']:.0%}" for r in rs)

    diffs = ", ".join(f"{r['paired']['mean']:+.3f} at {r['fraction']:.0%}" for r in ppi_rows)
    held = [r for r in ppi_rows if r["not_below"]]
    lost = [r for r in ppi_rows if not r["not_below"]]
    text = (
        f" `wmrl_ppi` against `anchors_only` (paired over seeds, margin {margin:g}): "
        f"{diffs}; not below it by more than the margin at "
        f"{fractions(held) if held else 'no fraction'}"
        + (f", not shown at {fractions(lost)}" if lost else "")
        + "."
    )
    here = {r["arm"]: r for r in rows if r["fraction"] == fraction}
    if "wmrl_ppi" in here and "wmrl" in here:
        a, b = here["wmrl_ppi"], here["wmrl"]
        text += (
            f" At {fraction:.0%} its last quarter gains {a['late_gain']:+.3f} ± "
            f"{a['late_gain_se']:.3f} over the quarter before, `wmrl`'s {b['late_gain']:+.3f} ± "
            f"{b['late_gain_se']:.3f}."
        )
    return text


# The arms set against their control, `anchors_only`, in the estimator table.
ESTIMATORS = ("wmrl", "wmrl_ppi", "wmrl_weighted")


def against_control(sweep: dict, *, margin: float, anchors: int, groups: int) -> list[dict]:
    """Each estimator arm against `anchors_only` at each blind-spot fraction, paired over seeds.

    Args:
      sweep: `{fraction: summary}` (`controlled.run_sweep`), with per-seed finals.
      margin: the equivalence margin declared in the config before the run.
      anchors, groups: anchor groups n and sampled groups B per step (PPI's prediction).

    Returns one row per (fraction, arm): the paired difference of final true reward
    (`analysis.paired`, 90% interval), the verdict against the margin
    (`analysis.equivalence`), `not_below` (the interval's lower end above −margin:
    not below the control by more than the margin), the late gain (still rising or
    flat), the measured r and λ of the last quarter, PPI's effective anchor groups
    n_eff at that r (`core.ppi.effective_anchors`), its predicted gradient-error
    ratio to `anchors_only` at the best λ (1 − r²), and the measured ratio.
    """
    rows = []
    for fraction, summary in sweep.items():
        if "anchors_only" not in summary:
            continue
        control = summary["anchors_only"]
        for arm in ESTIMATORS:
            if arm not in summary:
                continue
            row = summary[arm]
            p = analysis.paired(row["final_true_reward_seeds"], control["final_true_reward_seeds"])
            r = row["wm_correlation_last_quarter"]
            r_known = r is not None and np.isfinite(r)
            rows.append({
                "fraction": float(fraction), "arm": arm, "paired": p.to_dict(),
                "verdict": analysis.equivalence(p, margin),
                "not_below": bool(p.n >= 2 and p.lo > -margin),
                "late_gain": row["late_gain"], "late_gain_se": row["late_gain_se"],
                "r": r if r_known else None, "lam": row["reliability_last_quarter"],
                "n_eff": float(ppi.effective_anchors(r, anchors, groups)) if r_known else None,
                "predicted_error_ratio": 1.0 - r * r if r_known else None,
                "error_ratio": row["gradient_error"] / control["gradient_error"],
            })  # fmt: skip
    return rows


def format_against_control(rows: list[dict], *, margin: float, anchors: int, groups: int) -> str:
    """The estimator table (`against_control`) in markdown."""

    def num(x, spec=".3f"):
        return "n/a" if x is None or not np.isfinite(x) else format(x, spec)

    lines = [
        f"| WM blind spots | arm | final − anchors_only (90% CI, n) | vs margin {margin:g} "
        "| not below by > margin | late gain (± s.e.) | r | λ "
        f"| n_eff of n = {anchors} (B = {groups}) | gradient error ÷ anchors_only's: "
        "PPI's best (1 − r²) / measured |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p = row["paired"]
        lines.append(
            f"| {row['fraction']:.0%} | {row['arm']} | {num(p['mean'], '+.3f')} "
            f"[{num(p['lo'], '+.3f')}, {num(p['hi'], '+.3f')}], {p['n']} | {row['verdict']} "
            f"| {'yes' if row['not_below'] else 'no'} "
            f"| {num(row['late_gain'], '+.3f')} ± {num(row['late_gain_se'])} "
            f"| {num(row['r'], '.2f')} | {num(row['lam'], '.2f')} | {num(row['n_eff'], '.1f')} "
            f"| {num(row['predicted_error_ratio'], '.2f')} / {num(row['error_ratio'], '.2f')} |"
        )
    return "\n".join(lines)


def _shape(config) -> dict:
    """The estimator table's margin, n and B from a config (dict or ConfigDict)."""
    groups = int(config["tasks_per_step"])
    anchors = arms_lib.get("anchors_only").num_anchor_groups(
        groups, float(config["anchor_fraction"])
    )
    return dict(margin=float(config["equivalence_margin"]), anchors=int(anchors), groups=groups)


def _tables(summary: dict, sweep: dict, config, *, fraction: float, seeds: int, steps: int) -> str:
    text = (
        f"At blind-spot fraction {fraction:.0%}, {seeds} seeds, "
        f"{steps} updates per arm:\n\n{controlled.format_table(summary)}\n\n"
        f"Final true reward over the blind-spot sweep (same seeds and updates):\n\n"
        f"{controlled.format_sweep(sweep)}"
    )
    shape = _shape(config)
    rows = against_control(sweep, **shape)
    if rows:
        text += (
            "\n\nEach estimator against its control `anchors_only` (same executions), paired "
            f"over the {seeds} seeds; r and λ over the last quarter of updates; late gain: the "
            "last quarter's mean true reward over the quarter before:\n\n"
            + format_against_control(rows, **shape)
        )
    return text


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> str:
    """Rewrites `workdir/table.md` (and the docs section, the README's headline) from
    `workdir/results.json`; `docs` defaults to the study's page beside `readme`."""
    readme, docs = report_paths(SECTION, readme, docs)
    workdir = pathlib.Path(workdir)
    payload = json.loads((workdir / "results.json").read_text())
    config = payload["config"]
    sweep = {float(f): s for f, s in payload["blind_spot_sweep"].items()}
    shape = dict(
        fraction=float(config["world_model"]["blind_spot_fraction"]),
        seeds=config["num_seeds"], steps=config["num_steps"],
    )  # fmt: skip
    table = _tables(payload["summary"], sweep, config, **shape)
    (workdir / "table.md").write_text(table + "\n")
    if docs is not None:
        control = _shape(config)
        top = headline(
            payload["summary"], list(sweep), **shape,
            estimators=against_control(sweep, **control), margin=control["margin"],
        )  # fmt: skip
        write_report(SECTION, f"`{_COMMAND}`\n\n{table}", top, readme=readme, docs=docs)
    return table


def run_and_report(
    config, workdir: str, readme: str | None = None, docs: str | None = None
) -> dict:
    """Runs the study and its blind-spot sweep, writes the outputs; returns the summary."""
    report_paths(SECTION, readme, docs)  # Missing pages fail now, not after the study.
    results = controlled.run_study(config)
    summary = controlled.summarize(results, config)
    fraction = float(config.world_model.blind_spot_fraction)
    sweep = controlled.run_sweep(config, known={fraction: summary})
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    curves = {arm: {k: v.mean(0) for k, v in out.items()} for arm, out in results.items()}
    write_json(
        workdir / "results.json",
        {
            "config": config.to_dict(),
            "summary": summary,
            "mean_curves": curves,
            "blind_spot_sweep": {str(f): s for f, s in sweep.items()},
        },
    )
    table = render(workdir, readme, docs)
    report.plot_study(results, config, workdir / "controlled.png")
    print(table)
    logging.info("Wrote %s", workdir)
    return summary
