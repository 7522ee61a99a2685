"""The embodied study's report: a markdown table, a plot, the docs section and the headline.

Everything here is a function of `wmrl_jax.embodied.study.analyse`'s output,
so neither docs/embodied.md nor the README carries hand-typed numbers: the
section between ``<!-- embodied:begin -->`` and ``<!-- embodied:end -->`` of
the docs page and the README's ``embodied-headline`` section are replaced
whole (`wmrl_jax.readme.write_report(MARKER, body, headline(...), ...)`).
"""

from __future__ import annotations

import math

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
