"""The embodied study's report: a markdown table, a plot, the docs section and the headline.

Everything here is a function of `wmrl_jax.embodied.study.analyse`'s output,
so neither docs/embodied.md nor the README carries hand-typed numbers: the
section between ``<!-- embodied:begin -->`` and ``<!-- embodied:end -->`` of
the docs page and the README's ``embodied-headline`` section are replaced
whole (`wmrl_jax.readme.write_report(MARKER, body, headline(...), ...)`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time

from absl import logging

from wmrl_jax.embodied import study
from wmrl_jax.readme import report_paths, write_report

MARKER = "embodied"  # <!-- embodied:begin --> ... <!-- embodied:end --> in docs/embodied.md


def _fmt_ratio(a: dict, key: str) -> str:
    t = a[key]
    if not a["measurable"]:
        return "not measurable"
    if t["ratio"] is None:
        return f"never ({t['seeds_reaching']}/{a['seeds']})"
    return (
        f"{_fmt_steps(t['steps'])}: {t['ratio']:.2f}× [{t['ratio_lo']:.2f}, {t['ratio_hi']:.2f}] "
        f"({t['seeds_reaching']}/{a['seeds']})"
    )


def _fmt_steps(steps: float) -> str:
    return "never" if not math.isfinite(steps) else f"{steps / 1000:.0f}k"


def table(analysis: dict) -> str:
    """One markdown table, a row per task and arm."""
    rows = [
        "| task | arm | success, start → final ± s.e. | to `real`'s final: steps, ratio real / arm "
        "[10–90%] (seeds) | to 90% of it: steps, ratio (seeds) | updates "
        "| full / prefix episodes | WM rank corr. | s per run: sim / policy / WM / train |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, arms in analysis.items():
        for arm, a in arms.items():
            lg = a["ledger"]
            corr = "—" if a["wm_rank_corr"] is None else f"{a['wm_rank_corr']:.2f}"
            rows.append(
                f"| {task} | {arm} | {a['start_mean']:.2f} → {a['final_mean']:.2f} ± "
                f"{a['final_se']:.2f} | {_fmt_ratio(a, 'at_final')} | {_fmt_ratio(a, 'at_90')} "
                f"| {a['updates']:.0f} | {lg['full_episodes']:.0f} / {lg['prefix_episodes']:.0f} "
                f"| {corr} | {lg['sim_seconds']:.0f} / {lg['policy_seconds']:.0f} / "
                f"{lg['wm_seconds']:.0f} / {lg['train_seconds']:.0f} |"
            )
    return "\n".join(rows)


def _reach(arm: str, a: dict, real_final: float) -> str:
    f, n = a["at_final"], a["at_90"]
    if f["ratio"] is not None:
        verdict = "meets" if f["ratio"] >= 3.0 else "falls short of"
        head = (
            f"`{arm}` reaches `real`'s final success ({real_final:.2f}) with **{f['ratio']:.2f}× "
            f"[{f['ratio_lo']:.2f}, {f['ratio_hi']:.2f}]** fewer simulator steps, which {verdict} "
            "the 3× aim"
        )
    else:
        head = (
            f"`{arm}` does **not** reach `real`'s final success ({real_final:.2f}) within the "
            f"budget (it ends at {a['final_mean']:.2f} ± {a['final_se']:.2f})"
        )
    if n["ratio"] is None:
        tail = f"nor 90% of it ({n['target']:.2f})"
    else:
        tail = (
            f"90% of it ({n['target']:.2f}) with {n['ratio']:.2f}× [{n['ratio_lo']:.2f}, "
            f"{n['ratio_hi']:.2f}] fewer steps"
        )
    return f"{head}; {tail}."


def headline(analysis: dict) -> str:
    """One sentence per task, composed from the analysis alone."""
    parts = []
    for task, arms in analysis.items():
        real = arms["real"]
        if not real["measurable"]:
            parts.append(
                f"**{task}**: not measurable — `real` does not raise its success above its "
                f"start ({real['start_mean']:.2f} → {real['final_mean']:.2f})."
            )
        elif "wmrl" in arms:
            parts.append(f"**{task}**: " + _reach("wmrl", arms["wmrl"], real["final_mean"]))
    return " ".join(parts)


def plot(analysis: dict, path: str):
    """Success rate vs simulator steps, mean ± s.e. over seeds, one panel per task; writes
    `path` and returns the figure."""
    # A bare Figure: no pyplot state and no backend switch (notebooks keep theirs).
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * len(analysis), 4))
    axes = fig.subplots(1, len(analysis), squeeze=False)
    for ax, (task, arms) in zip(axes[0], analysis.items(), strict=True):
        for arm, a in arms.items():
            x = [s / 1000 for s in a["steps"]]
            ax.errorbar(x, a["mean"], yerr=a["se"], label=arm, capsize=3, marker="o", ms=3)
        ax.axhline(arms["real"]["at_final"]["target"], color="grey", lw=0.8, ls="--")
        ax.set_title(task)
        ax.set_xlabel("simulator steps (thousands)")
        ax.set_ylabel("success rate (held-out initial states)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def run_and_report(
    config, workdir: str, readme: str | None = None, docs: str | None = None
) -> dict:
    """Runs the study, writes its outputs, optionally updates the docs page and the README's
    headline (`render`); returns the analysis."""
    report_paths(MARKER, readme, docs)  # Missing pages fail now, not after the study.
    start = time.perf_counter()
    runs = {name: config.tasks[name] for name in config.tasks}
    results = study.run_study(
        runs,
        arms=tuple(config.arms),
        seeds=tuple(range(config.num_seeds)),
        workers=config.workers,
        log=logging.info,
    )
    os.makedirs(workdir, exist_ok=True)
    payload = {
        "config": config.to_dict(),
        "results": results,
        "wall_seconds": time.perf_counter() - start,
    }
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(payload, f, indent=1, default=float)
    return render(workdir, readme, docs)


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> dict:
    """Analyses ``results.json`` and writes the table, the plot, the docs page's section and
    the README's headline; ``docs`` defaults to the study's page beside ``readme``."""
    readme, docs = report_paths(MARKER, readme, docs)
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    config = payload["config"]
    analysis = study.analyse(payload["results"], bootstrap=config["bootstrap"])
    text = table(analysis)
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(text + "\n")
    plot_path = os.path.join(workdir, "embodied.png")
    plot(analysis, plot_path)
    if docs is not None:
        # The plot beside the docs page, which links it by name.
        shutil.copyfile(
            plot_path, os.path.join(os.path.dirname(os.path.abspath(docs)), "embodied.png")
        )
        budgets = ", ".join(f"{t} {c['budget'] // 1000}k" for t, c in config["tasks"].items())
        runs = [r for e in payload["results"].values() for rs in e["arms"].values() for r in rs]
        cpu = sum(r.get("cpu_seconds", math.nan) for r in runs)
        cpu_text = "" if math.isnan(cpu) else f", {cpu / 60:.0f} CPU-min in the runs"
        body = (
            f"`python -m experiments.study_embodied` ({config['num_seeds']} seeds, "
            f"simulator-step budget per run: {budgets}; {payload['wall_seconds'] / 60:.0f} min "
            f"wall-clock with {config['workers']} processes on a shared 2-core machine"
            f"{cpu_text}). {headline(analysis)}\n\n"
            f"{text}\n\n![embodied study](embodied.png)"
        )
        write_report(MARKER, body, headline(analysis), readme=readme, docs=docs)
    return analysis
