"""Writing a study's results: markdown tables and plots (README sections: `wmrl_jax.readme`)."""

from __future__ import annotations

import math
import pathlib

import ml_collections
import numpy as np

from wmrl_jax.studies.smoothing import trailing_mean


def plot_study(results: dict, config: ml_collections.ConfigDict, path: str | pathlib.Path):
    """Plots the controlled study: reward vs step and vs executions, bias, variance.

    Args:
      results: `{arm: {metric: array [num_seeds, num_steps]}}`.
      config: the study config.
      path: where to write the PNG.

    Returns:
      The `matplotlib.figure.Figure` (display it in a notebook; no pyplot state).
    """
    # A bare Figure: no pyplot state and no backend switch (notebooks keep theirs).
    from matplotlib.figure import Figure

    fig = Figure(figsize=(20, 4.2))
    axes = fig.subplots(1, 4)
    for arm, out in results.items():
        reward = out["true_reward"]
        mean = reward.mean(0)
        se = reward.std(0, ddof=1) / np.sqrt(reward.shape[0]) if reward.shape[0] > 1 else 0 * mean
        steps = np.arange(mean.shape[0])
        (line,) = axes[0].plot(steps, mean, label=arm)
        axes[0].fill_between(steps, mean - se, mean + se, color=line.get_color(), alpha=0.2)
        executions = np.cumsum(out["executions"].mean(0))
        if executions[-1] > 0:
            axes[1].plot(executions, mean, label=arm, color=line.get_color())
            axes[1].fill_between(
                executions, mean - se, mean + se, color=line.get_color(), alpha=0.2
            )
        axes[2].plot(steps, np.nanmean(out["bias"], 0), label=arm, color=line.get_color())
        if np.isfinite(out["anchor_var_fed"]).any():
            axes[3].plot(
                trailing_mean(out["anchor_var_fed"], config.smooth, over_seeds=True),
                color=line.get_color(),
                label=f"{arm}: fed",
            )
            if arm == "wmrl":
                axes[3].plot(
                    trailing_mean(out["anchor_var_real"], config.smooth, over_seeds=True),
                    "k--",
                    label="real stream",
                )
                axes[3].plot(
                    trailing_mean(out["anchor_var_debiased"], config.smooth, over_seeds=True),
                    "k:",
                    label="debiased WM stream",
                )
    axes[0].set(xlabel="policy update", ylabel="expected true reward", title="Reward (± s.e.)")
    axes[1].set(xlabel="real executions (cumulative)", xscale="log", title="Reward vs executions")
    axes[2].set(xlabel="policy update", ylabel="mean(fed − true)", title="Bias of fed rewards")
    axes[2].axhline(0, color="grey", lw=0.5)
    axes[3].set(
        xlabel="policy update",
        ylabel="error variance",
        yscale="log",
        title="Variance on anchors (smoothed)",
    )
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return fig


def fmt_number(value, spec: str = ".3f") -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def matched_cell(row: dict, prefix: str = "") -> str:
    """'≥ 12.00× [8.10, 30.00] (2/5 never)': real's compute for the run's final level
    over the run's, median [min, max] over seeds.

    `prefix` is "" (held-out) or "train_". Seeds where real never reaches the
    level count at their lower bound (real's whole budget), so the median is
    itself a lower bound, marked ≥, whenever any seed is censored.
    """
    median = row.get(f"{prefix}matched_ratio_median")
    if median is None:
        return "—"
    never, seeds = row[f"{prefix}matched_never"], row[f"{prefix}matched_seeds"]
    ratios = [r for r in row[f"{prefix}matched_ratio"] if r is not None and np.isfinite(r)]
    return (
        f"{'≥ ' if never else ''}{median:.2f}× [{min(ratios):.2f}, {max(ratios):.2f}] "
        f"({never}/{seeds} never)"
    )


def ratio_cell(row: dict, key: str) -> str:
    """'3.10× [1.20, 5.00] (4/5)': median [min, max] of a per-seed ratio, and the seeds
    that have one (both runs reach the level)."""
    if row.get(f"{key}_median") is None:
        return "—"
    return (
        f"{row[f'{key}_median']:.2f}× [{row[f'{key}_min']:.2f}, {row[f'{key}_max']:.2f}] "
        f"({row[f'{key}_seeds']}/{row['seeds']})"
    )


def format_study_table(analysis: dict, labels: list[str] | None = None) -> str:
    """The compute study's markdown table (one row per run label).

    Ratios are per seed, median [min, max] (seeds where the run reaches `real`'s
    final held-out level): `real`'s compute to get there over the run's, and
    `anchors_only`'s over the run's (above 1: the run needs less).
    """
    head = (
        "| run | updates | executions (cached) | compute s | held-out, start → final ± s.e. "
        "| compute to real's final held-out level: real / run (seeds) | anchors_only / run "
        "| real's compute for the run's final held-out level / run's "
        "| train-task true reward, start → final | WM rank corr. (out of sample) "
        "| anchor error variance: real / WM / fed (their errors' corr.) "
        "|\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for label in labels or list(analysis):
        r = analysis[label]
        target = r.get("heldout_target_above_start", True)
        errors = " / ".join(fmt_number(r.get(f"anchor_{s}_error_var"), ".4f")
                            for s in ("real", "wm", "fed"))  # fmt: skip
        if r.get("anchor_error_corr") is not None:
            errors += f" ({fmt_number(r['anchor_error_corr'], '+.2f')})"
        rows.append(
            f"| {label} | {r.get('updates', float('nan')):.0f} "
            f"| {r['executions_total']:.0f} ({r.get('cached_executions', 0.0):.0f}) "
            f"| {r['compute_total']:.0f} "
            f"| {r['heldout_before']:.3f} → {r['heldout_final']:.3f} ± {r['heldout_final_se']:.3f} "
            f"| {ratio_cell(r, 'ratio') if target else '—'} "
            f"| {ratio_cell(r, 'ratio_vs_control') if target else '—'} "
            f"| {matched_cell(r)} "
            f"| {r['train_reward_start']:.3f} → {r['train_reward_final']:.3f} "
            f"| {fmt_number(r.get('wm_rank_corr'), '.2f')} | {errors} |"
        )
    return "\n".join([head, *rows])


def format_break_even(sweep: dict[float, dict], labels=("wmrl", "anchors_only")) -> str:
    """Modelled-ledger ratios over the model size N: `{N: analysis}` -> markdown table."""
    head = (
        "| model size N | "
        + " | ".join(f"{label}: real / run" for label in labels)
        + " | wmrl: anchors_only / wmrl |\n|---|"
        + "---|" * (len(labels) + 1)
    )
    rows = []
    for n, analysis in sweep.items():
        cells = [ratio_cell(analysis[label], "ratio") for label in labels]
        cells.append(ratio_cell(analysis["wmrl"], "ratio_vs_control"))
        rows.append(f"| {n / 1e9:g}B | " + " | ".join(cells) + " |")
    return "\n".join([head, *rows])


def _mean_se(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds (axis 0) and its standard error (zero for one seed); NaN entries
    (after a run's end) are left out."""
    finite = np.isfinite(x)
    n = finite.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.where(finite, x, 0.0).sum(0) / n, np.nan)
        var = np.where(finite, (x - mean) ** 2, 0.0).sum(0) / np.maximum(n - 1, 1)
        se = np.where(n > 1, np.sqrt(var / np.maximum(n, 1)), 0.0)
    return mean, se


def plot_compute_study(results: dict, labels: list[str], path, *, step_series):
    """Held-out percentile vs compute and vs execution seconds, and training-task true
    reward vs compute (log scale; bands: ± s.e. over seeds); fed-reward bias, error
    variance and the WM's within-group rank correlation over training. Writes `path`,
    returns the figure."""
    # A bare Figure: no pyplot state and no backend switch (notebooks keep theirs).
    from matplotlib.figure import Figure

    from wmrl_jax.studies.compute import TRAIN_SMOOTH, curves

    fig = Figure(figsize=(16, 7))
    axes = fig.subplots(2, 3)
    for i, label in enumerate(labels):
        color = f"C{i}"  # One colour per run in every panel, also where a series is absent.
        c = curves(results[label])
        mean, se = _mean_se(c["percentile"])
        for ax, xkey in ((axes[0, 0], "compute"), (axes[0, 1], "exec_seconds")):
            x = _mean_se(c[xkey])[0]
            ax.plot(x, mean, label=label, color=color)
            ax.fill_between(x, mean - se, mean + se, alpha=0.2, color=color)
        # The true reward of the training samples, smoothed as in `analyse`.
        train = trailing_mean(step_series(results[label], "oracle/true_reward"), TRAIN_SMOOTH)
        train_mean, train_se = _mean_se(train)
        x = _mean_se(step_series(results[label], "ledger/compute_seconds"))[0]
        axes[0, 2].plot(x, train_mean, label=label, color=color)
        axes[0, 2].fill_between(
            x, train_mean - train_se, train_mean + train_se, alpha=0.2, color=color
        )
        for ax, key in (
            (axes[1, 0], "oracle/fed_bias"),
            (axes[1, 1], "oracle/fed_error_var"),
            (axes[1, 2], "oracle/wm_group_rank_corr"),
        ):
            series = step_series(results[label], key)
            steps = np.arange(1, series.shape[1] + 1)
            if np.isfinite(series).any():
                ax.plot(steps, trailing_mean(series, 5, over_seeds=True), label=label, color=color)
    axes[0, 0].set_xlabel("compute seconds (generation + WM + execution)")
    axes[0, 1].set_xlabel("execution seconds")
    for ax in axes[0]:
        ax.set_ylabel("held-out percentile")
    axes[1, 0].set_ylabel("bias of fed rewards (vs true)")
    axes[1, 1].set_ylabel("error variance of fed rewards")
    axes[0, 2].set_xscale("log")
    axes[0, 2].set_xlabel("compute seconds (log scale)")
    axes[0, 2].set_ylabel("training-task true reward")
    axes[1, 2].set_ylabel("WM rank correlation within a group")
    for ax in axes[1]:
        ax.set_xlabel("policy update")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig
