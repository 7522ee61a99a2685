"""Metrics for grading submissions, each with an explicit direction.

A metric is a plain function `fn(y_true, y_pred) -> float` of numpy arrays:
`y_true` of shape [N] (class indices 0..C-1 or real targets) and `y_pred` of
shape [N, K], the submission's target columns in the manifest's order. For
`log_loss` and `auc` the K columns are class probabilities (`auc` with K == 1
reads the single column as the positive-class probability).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

HIGHER = "higher"
LOWER = "lower"
DIRECTIONS = (HIGHER, LOWER)


class Metric(NamedTuple):
    """A named metric. `direction` is "higher" or "lower" (is better)."""

    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    direction: str


def _single_column(y_pred: np.ndarray) -> np.ndarray:
    if y_pred.ndim != 2 or y_pred.shape[1] != 1:
        raise ValueError(f"expected exactly one prediction column, got shape {y_pred.shape}")
    return y_pred[:, 0]


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Fraction of predicted labels equal to the true labels."""
    return float(np.mean(_single_column(y_pred) == y_true))


def log_loss(y_true: np.ndarray, y_pred: np.ndarray, *, eps: float = 1e-15) -> float:
    """Multi-class log-loss, -mean log p[y]; rows renormalised after clipping.

    Clipping to [eps, 1 - eps] keeps one confident mistake finite (Kaggle's rule).
    """
    if y_pred.ndim != 2 or y_pred.shape[1] < 2:
        raise ValueError(f"log_loss needs one probability column per class, got {y_pred.shape}")
    labels = y_true.astype(np.int64)
    if np.any(labels != y_true) or labels.min() < 0 or labels.max() >= y_pred.shape[1]:
        raise ValueError("log_loss labels must be class indices 0..C-1")
    if np.any(y_pred < 0):
        raise ValueError("log_loss probabilities must be non-negative")
    p = np.clip(y_pred, eps, 1 - eps)
    p = p / p.sum(axis=1, keepdims=True)
    return float(-np.mean(np.log(p[np.arange(len(labels)), labels])))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Root mean squared error."""
    return float(np.sqrt(np.mean((_single_column(y_pred) - y_true) ** 2)))


def mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean absolute error."""
    return float(np.mean(np.abs(_single_column(y_pred) - y_true)))


def r2(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot (0 when SS_tot is 0 and SS_res > 0)."""
    pred = _single_column(y_pred)
    ss_res = float(np.sum((y_true - pred) ** 2))
    ss_tot = float(np.sum((y_true - np.mean(y_true)) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def auc(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """ROC AUC: binary (K == 1, or column 1 of K == 2), else one-vs-rest macro."""
    from sklearn.metrics import roc_auc_score  # Grader side only; keeps import light.

    if y_pred.ndim != 2:
        raise ValueError(f"auc expects a 2-D prediction array, got {y_pred.shape}")
    if y_pred.shape[1] == 1:
        return float(roc_auc_score(y_true, y_pred[:, 0]))
    if y_pred.shape[1] == 2:
        return float(roc_auc_score(y_true, y_pred[:, 1]))
    return float(roc_auc_score(y_true, y_pred, multi_class="ovr", labels=range(y_pred.shape[1])))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("accuracy", accuracy, HIGHER),
        Metric("log_loss", log_loss, LOWER),
        Metric("rmse", rmse, LOWER),
        Metric("mae", mae, LOWER),
        Metric("r2", r2, HIGHER),
        Metric("auc", auc, HIGHER),
    )
}
