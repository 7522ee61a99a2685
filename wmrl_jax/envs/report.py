"""`data_report.md`: facts computed from a task's public data, never invented."""

from __future__ import annotations

import numpy as np


def _stats(values: np.ndarray) -> str:
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0])
    return (
        f"mean {np.mean(values):.6g}, std {np.std(values):.6g}, min {q[0]:.6g}, "
        f"q25 {q[1]:.6g}, median {q[2]:.6g}, q75 {q[3]:.6g}, max {q[4]:.6g}"
    )


def data_report(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    *,
    feature_names: list[str],
    num_classes: int | None,
) -> str:
    """Renders the data report of one task as markdown.

    Args:
        x_train: training features of shape [N, D]; y_train: targets of shape [N].
        x_test: test features of shape [M, D].
        feature_names: the D column names.
        num_classes: C for classification (class balance), None for regression
            (target statistics).
    """
    lines = [
        "# Data report",
        "",
        "Computed from `public/train.csv` and `public/test.csv`.",
        "",
        f"- train.csv: {x_train.shape[0]} rows, {x_train.shape[1]} features + `id` + `target`",
        f"- test.csv: {x_test.shape[0]} rows, {x_test.shape[1]} features + `id`",
        f"- feature dtypes: {sorted({str(x_train.dtype), str(x_test.dtype)})}",
        f"- target dtype: {y_train.dtype}" + (" (class index)" if num_classes is not None else ""),
        f"- missing values: train {int(np.isnan(x_train).sum())}, "
        f"test {int(np.isnan(x_test).sum())}",
        "",
    ]
    if num_classes is not None:
        counts = np.bincount(y_train.astype(np.int64), minlength=num_classes)
        lines += ["## Class balance (train)", "", "| class | count | fraction |", "|---|---|---|"]
        lines += [f"| {c} | {n} | {n / counts.sum():.4f} |" for c, n in enumerate(counts)]
    else:
        lines += ["## Target (train)", "", _stats(y_train)]
    lines += [
        "",
        "## Features (train)",
        "",
        "| feature | mean | std | min | max |",
        "|---|---|---|---|---|",
    ]
    for j, name in enumerate(feature_names):
        col = x_train[:, j]
        lines.append(
            f"| {name} | {np.mean(col):.6g} | {np.std(col):.6g} | {np.min(col):.6g} "
            f"| {np.max(col):.6g} |"
        )
    return "\n".join(lines) + "\n"
