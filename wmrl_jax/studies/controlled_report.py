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

from absl import logging

from wmrl_jax.readme import report_paths, write_report
from wmrl_jax.studies import controlled, report
from wmrl_jax.train.summary import write_json

_COMMAND = "python -m experiments.controlled --config=experiments/configs/controlled.py"
SECTION = "controlled"  # <!-- controlled:begin --> in docs/controlled_study.md.


def headline(summary: dict, fractions, *, fraction: float, seeds: int, steps: int) -> str:
    """The README's headline: where `real`, `wmrl` and its control end, and the arms that win
    among those executing no more than `wmrl` (within two standard errors of the best).

    Args:
      summary: arm -> `controlled.summarize` row at the config's blind-spot fraction.
      fractions: the blind-spot fractions of the sweep (named in the last sentence).
      fraction, seeds, steps: the config's blind-spot fraction, seeds and updates per arm.
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
        f"errors): {wins}. The tables give every arm and the sweep over blind-spot "
        f"fractions {swept}."
    )


def _tables(summary: dict, sweep: dict, *, fraction: float, seeds: int, steps: int) -> str:
    return (
        f"At blind-spot fraction {fraction:.0%}, {seeds} seeds, "
        f"{steps} updates per arm:\n\n{controlled.format_table(summary)}\n\n"
        f"Final true reward over the blind-spot sweep (same seeds and updates):\n\n"
        f"{controlled.format_sweep(sweep)}"
    )


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
    table = _tables(payload["summary"], sweep, **shape)
    (workdir / "table.md").write_text(table + "\n")
    if docs is not None:
        write_report(
            SECTION, f"`{_COMMAND}`\n\n{table}", headline(payload["summary"], list(sweep), **shape),
            readme=readme, docs=docs,
        )  # fmt: skip
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
