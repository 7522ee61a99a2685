"""The controlled regime map's command: run the map, analyse it, render it beside the real one.

`run_and_report` runs `wmrl_jax.studies.controlled_regime.run_map`, writes
``results.json`` (the config, each run's mean curves, the analysis), ``table.md``
and ``regime_controlled.png``, and with a README or a docs page rewrites the
`regime-controlled` section of ``docs/regime.md`` and the README's
``regime-controlled-headline``. The tables and the figure are the real map's
(`wmrl_jax.studies.regime_report`), so the two maps read cell by cell.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
from absl import logging

from wmrl_jax.readme import report_paths, write_report
from wmrl_jax.studies import controlled_regime, regime, regime_report
from wmrl_jax.train import cost
from wmrl_jax.train.summary import write_json

SECTION = "regime-controlled"  # In docs/regime.md, beside the real map's section.
PNG = "regime_controlled.png"


def analyse(results: dict, config) -> dict:
    """`controlled_regime.analyse` with the config's arms, axes, smoothing and margin."""
    model = cost.from_config(config)
    if model is None:
        raise ValueError("the controlled regime map needs config.cost_model (params > 0)")
    r = config.regime
    return controlled_regime.analyse(
        results, arms=tuple(r.arms), model=model, costs=tuple(float(c) for c in r.costs),
        params=tuple(float(n) for n in r.params), smooth=int(config.smooth),
        fraction=float(config.target_fraction), margin=float(config.equivalence_margin),
    )  # fmt: skip


def run_and_report(config, workdir: str, readme: str | None = None, docs: str | None = None):
    """Runs the map, writes `results.json`, renders; returns the analysis."""
    report_paths(SECTION, readme, docs)  # Missing pages fail now, not after the runs.
    start = time.perf_counter()
    results = controlled_regime.run_map(config)
    for label, run in results.items():
        logging.info("%s: final true reward %.3f", label, np.mean(run["true_reward"][:, -1]))
    payload = {
        "config": config.to_dict(),
        "wall_seconds": time.perf_counter() - start,
        "curves": {
            label: {k: np.mean(v, axis=0).tolist() for k, v in run.items()}
            for label, run in results.items()
        },
        "analysis": analyse(results, config),
    }
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "results.json"), payload)
    render(workdir, readme, docs)
    return payload["analysis"]


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> str:
    """The table, the figure (and the docs section, the README headline) from
    `workdir/results.json`; returns the table."""
    readme, docs = report_paths(SECTION, readme, docs)
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    a, config = payload["analysis"], payload["config"]
    png = os.path.join(workdir, PNG)
    regime_report.plot(a, png)
    table = "\n".join([picks_table(a), "", regime_report.tables(a)])
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table + "\n")
    if docs is not None:
        shutil.copy(png, os.path.dirname(os.path.abspath(docs)))
        lines = headline(a, config)
        intro = (
            f"`python -m experiments.controlled_regime` ({config['num_seeds']} seeds, "
            f"{config['num_steps']} updates per run, novel programs of σ = "
            f"{config['env']['novelty']:g} around their candidates; "
            f"{payload['wall_seconds'] / 60:.0f} min on this CPU)."
        )
        body = [intro, "", " ".join(lines), "", table, "", f"![controlled regime map]({PNG})"]
        lead = f"{lines[0].rstrip('.')}; {regime_report.where_in_full(readme, docs)}."
        brief = regime_report.brief(a, lead)
        write_report(SECTION, "\n".join(body), brief, readme=readme, docs=docs)
    return table


def picks_table(a: dict) -> str:
    """Which real-execution cell is the best real (least compute to the target) per cost
    and N, over seeds, with each real cell's final true reward."""
    cells = a["real_cells"]
    lines = [
        "Best real cell per seed (least compute to `real`'s target), by cost and N; final "
        "true reward: " + ", ".join(f"`{c}` {a['real_finals'][c]:.3f}" for c in cells) + ".",
        "",
        "| N | per execution | " + " | ".join(f"`{c}`" for c in cells) + " |",
        "|---|---|" + "---|" * len(cells),
    ]
    for n in a["params"]:
        for c in a["costs"]:
            picks = a["best_real_picks"][f"{regime.cost_key(c)}|N{n:g}"]
            lines.append(
                f"| {n / 1e9:g}B | {c:g} s | "
                + " | ".join(f"{picks.count(cell)}/{len(picks)}" for cell in cells)
                + " |"
            )
    return "\n".join(lines)


def headline(a: dict, config) -> list[str]:
    """The map's answer in sentences (the real map's, every number from the analysis)."""
    lines = regime_report.headline(a)
    lines[0] = (
        f"**In the controlled study** (truth known; every sample a new program, σ = "
        f"{config['env']['novelty']:g}; {config['num_seeds']} seeds), against the best "
        f"real-execution cell per seed and cost (of {', '.join(a['real_cells'])}; `real` ends "
        f"at {a['target_final']:.3f} true reward, `{a['control']}` at "
        f"{a['control_final']:.3f})."
    )
    return lines
