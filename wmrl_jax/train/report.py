"""Writing a study's results: JSON, a markdown table and plots."""

from __future__ import annotations

import json
import math
import pathlib

import ml_collections
import numpy as np


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def write_json(path: str | pathlib.Path, payload: dict) -> None:
    """Writes `payload` as JSON; NaN and inf become null (strict JSON)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(payload), indent=1, allow_nan=False))


def _smooth_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Mean over seeds (ignoring NaN), then a moving average over steps."""
    kernel = np.ones(max(1, window)) / max(1, window)
    return np.convolve(np.nan_to_num(np.nanmean(x, 0)), kernel, mode="valid")


def plot_study(results: dict, config: ml_collections.ConfigDict, path: str | pathlib.Path) -> None:
    """Plots the controlled study: reward vs step and vs executions, bias, variance.

    Args:
      results: `{arm: {metric: array [num_seeds, num_steps]}}`.
      config: the study config.
      path: where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
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
                _smooth_mean(out["anchor_var_fed"], config.smooth),
                color=line.get_color(),
                label=f"{arm}: fed",
            )
            if arm == "wmrl":
                axes[3].plot(
                    _smooth_mean(out["anchor_var_real"], config.smooth), "k--", label="real stream"
                )
                axes[3].plot(
                    _smooth_mean(out["anchor_var_debiased"], config.smooth),
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
    plt.close(fig)
