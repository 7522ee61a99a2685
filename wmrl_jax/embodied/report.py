"""The embodied study's report: a markdown table, a plot and the README section.

Everything here is a function of `wmrl_jax.embodied.study.analyse`'s output,
so the README never carries hand-typed numbers: the section between
``<!-- embodied:begin -->`` and ``<!-- embodied:end -->`` is replaced whole.

Example:
  >>> replace_section("a\\n<!-- embodied:begin -->\\nold\\n<!-- embodied:end -->\\nb", "new")
  'a\\n<!-- embodied:begin -->\\nnew\\n<!-- embodied:end -->\\nb'
"""

from __future__ import annotations

import math

BEGIN, END = "<!-- embodied:begin -->", "<!-- embodied:end -->"


def _fmt_ratio(a: dict) -> str:
    if not a["measurable"]:
        return "not measurable"
    if a["ratio"] is None:
        return "never"
    return f"{a['ratio']:.2f}× [{a['ratio_lo']:.2f}, {a['ratio_hi']:.2f}]"


def _fmt_steps(steps: float) -> str:
    return "never" if not math.isfinite(steps) else f"{steps / 1000:.0f}k"


def table(analysis: dict) -> str:
    """One markdown table, a row per task and arm."""
    rows = [
        "| task | arm | success, start → final ± s.e. | sim steps to `real`'s final "
        "| ratio real / arm [10–90%] | seeds reaching it | updates | full / prefix episodes "
        "| WM rank corr. | s per run: sim / policy / WM / train |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, arms in analysis.items():
        for arm, a in arms.items():
            lg = a["ledger"]
            corr = "—" if a["wm_rank_corr"] is None else f"{a['wm_rank_corr']:.2f}"
            rows.append(
                f"| {task} | {arm} | {a['start_mean']:.2f} → {a['final_mean']:.2f} ± "
                f"{a['final_se']:.2f} | {_fmt_steps(a['steps_to_target'])} | {_fmt_ratio(a)} "
                f"| {a['seeds_reaching']}/{a['seeds']} | {a['updates']:.0f} "
                f"| {lg['full_episodes']:.0f} / {lg['prefix_episodes']:.0f} | {corr} "
                f"| {lg['sim_seconds']:.0f} / {lg['policy_seconds']:.0f} / "
                f"{lg['wm_seconds']:.0f} / {lg['train_seconds']:.0f} |"
            )
    return "\n".join(rows)


def headline(analysis: dict) -> str:
    """One sentence per task, composed from the analysis alone."""
    parts = []
    for task, arms in analysis.items():
        real, wmrl = arms["real"], arms.get("wmrl")
        if not real["measurable"]:
            parts.append(
                f"**{task}**: not measurable — `real` does not raise its success above its "
                f"start ({real['start_mean']:.2f} → {real['final_mean']:.2f})."
            )
            continue
        if wmrl is None:
            continue
        if wmrl["ratio"] is None:
            parts.append(
                f"**{task}**: `wmrl` does **not** reach `real`'s final success "
                f"({real['final_mean']:.2f}) within the budget (it ends at "
                f"{wmrl['final_mean']:.2f} ± {wmrl['final_se']:.2f})."
            )
        else:
            verdict = "meets" if wmrl["ratio"] >= 3.0 else "falls short of"
            parts.append(
                f"**{task}**: `wmrl` reaches `real`'s final success ({real['final_mean']:.2f}) "
                f"with **{wmrl['ratio']:.2f}× [{wmrl['ratio_lo']:.2f}, {wmrl['ratio_hi']:.2f}]** "
                f"fewer simulator steps, which {verdict} the 3× aim."
            )
    return " ".join(parts)


def plot(analysis: dict, path: str) -> None:
    """Success rate vs simulator steps, mean ± s.e. over seeds, one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(analysis), figsize=(5.5 * len(analysis), 4), squeeze=False)
    for ax, (task, arms) in zip(axes[0], analysis.items(), strict=True):
        for arm, a in arms.items():
            x = [s / 1000 for s in a["steps"]]
            ax.errorbar(x, a["mean"], yerr=a["se"], label=arm, capsize=3, marker="o", ms=3)
        ax.axhline(arms["real"]["target"], color="grey", lw=0.8, ls="--")
        ax.set_title(task)
        ax.set_xlabel("simulator steps (thousands)")
        ax.set_ylabel("success rate (held-out initial states)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replace_section(text: str, body: str) -> str:
    """Replaces the text between the embodied markers; raises if they are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {BEGIN} ... {END} section")
    return text[: start + len(BEGIN)] + "\n" + body + "\n" + text[end:]
