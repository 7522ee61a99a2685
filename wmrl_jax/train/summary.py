"""The main job's report: `summary.json`, `summary.md` and `heldout.png` in the workdir."""

from __future__ import annotations

import json
import math
import pathlib

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


def _percentile(value) -> str:
    """A held-out percentile; "n/a" where no execution was usable (NaN, or None in JSON)."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


def format_run_summary(summary: dict) -> str:
    """A training run's summary as a short markdown table."""
    ledger = summary["ledger"]
    rows = [
        ("arm", summary["arm"]),
        ("executor", summary["environment"]),
        ("held-out percentile, before", _percentile(summary["heldout_before"])),
        ("held-out percentile, after", _percentile(summary["heldout_after"])),
        ("real executions (training)", f"{int(ledger['executions'])}"),
        ("execution seconds (training)", f"{ledger['exec_seconds']:.1f}"),
        ("generation / WM seconds", f"{ledger['gen_seconds']:.1f} / {ledger['wm_seconds']:.1f}"),
        ("compute seconds (gen + WM + exec)", f"{summary['compute_seconds']:.1f}"),
    ]
    for key, label in (
        ("correction/bias_raw", "WM bias on the last anchors, raw"),
        ("correction/bias_debiased", "WM bias on the last anchors, debiased"),
        ("correction/sigma2_wm", "σ²_wm"),
        ("correction/sigma2_real", "σ²_real"),
        ("correction/fused_weight_wm", "weight on the WM in fusion"),
        ("correction/rank_corr", "WM–real rank correlation (anchor buffer)"),
    ):
        value = summary.get("calibration", {}).get(key)
        if value is not None and math.isfinite(value):
            rows.append((label, f"{value:.4f}"))
    lines = ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    return "\n".join(lines)


def plot_run(history: list[dict], path: str | pathlib.Path):
    """Held-out percentile against compute seconds and against real executions; writes
    `path` and returns the figure."""
    # A bare Figure: no pyplot state and no backend switch (notebooks keep theirs).
    from matplotlib.figure import Figure

    compute = [h["gen_seconds"] + h["wm_seconds"] + h["exec_seconds"] for h in history]
    executions = [h["executions"] for h in history]
    pct = [h["eval/heldout_percentile"] for h in history]
    fig = Figure(figsize=(9, 3.2))
    axes = fig.subplots(1, 2)
    axes[0].plot(compute, pct, marker="o")
    axes[0].set_xlabel("compute seconds (generation + WM + execution)")
    axes[1].plot(executions, pct, marker="o")
    axes[1].set_xlabel("real executions")
    for ax in axes:
        ax.set_ylabel("held-out percentile")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig


def write_run_report(summary: dict, workdir: str | pathlib.Path) -> str:
    """Writes `summary.json`, `summary.md` and `heldout.png`; returns the table."""
    workdir = pathlib.Path(workdir)
    write_json(workdir / "summary.json", summary)
    table = format_run_summary(summary)
    (workdir / "summary.md").write_text(table + "\n")
    plot_run(summary["history"], workdir / "heldout.png")
    return table
