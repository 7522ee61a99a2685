"""Oracle metrics: how far the fed rewards are from every sample's true reward.

Only a study knows the truth for free: the recipe table's replay answers any
(task, program) without executing it. `replay_oracle(source)` is a step hook
for `Trainer(..., hooks=[...])`: after each step it looks up every sample's
true reward and reports the bias, error variance and within-group rank
correlation of the fed rewards and of the raw world model, and on the
executed rows the error variance of each reward stream: real (one execution,
or the mean of a replicate pair), debiased world model, and the fed (fused)
reward. The truth is a program's mean over the table's replicates, so a
single execution is a noisy draw of it. The trainer itself never asks for
the truth.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wmrl_jax.core.stats import group_rank_correlation
from wmrl_jax.train import stages
from wmrl_jax.train.records import StepRecord


def _rank_corr(a: np.ndarray, b: np.ndarray, g: int) -> float:
    return float(group_rank_correlation(a, b, g))


def oracle_metrics(rewards, valid, truth, wm_mean, g: int) -> dict[str, float]:
    """How far the fed rewards (and the raw WM) are from every sample's true reward."""
    err = rewards - truth
    m = {
        "oracle/true_reward": float(np.mean(truth)),
        "oracle/fed_bias": float(np.mean(err[valid])) if valid.any() else np.nan,
        "oracle/fed_error_var": float(np.var(err[valid])) if valid.any() else np.nan,
        "oracle/fed_group_rank_corr": _rank_corr(np.where(valid, rewards, np.nan), truth, g),
    }
    if wm_mean is not None and np.isfinite(wm_mean).any():
        m["oracle/wm_bias"] = float(np.nanmean(wm_mean - truth))
        m["oracle/wm_group_rank_corr"] = _rank_corr(wm_mean, truth, g)
    return m


def stream_errors(record: StepRecord, truth: np.ndarray) -> dict[str, float]:
    """Error variance against the truth of each reward stream on the same rows.

    The rows: executed, with a finite debiased prediction and a finite fed
    reward. `oracle/anchor_{real,wm,fed}_error_var` are the variances of
    (real stream − truth), (debiased WM − truth) and (fed reward − truth);
    inverse-variance fusion is doing its job when the last is below both.
    `oracle/anchor_error_corr` is the correlation of the first two errors,
    which the fusion's weights assume to be 0 (NaN where either is constant).
    """
    ex, fed = record.execution, record.fed
    if fed.debiased is None:
        return {}
    real, _ = stages.wm_free_rewards(ex.real, ex.executed, ex.partner)
    rows = ex.executed & np.isfinite(fed.debiased) & np.isfinite(fed.rewards)
    if rows.sum() < 2:
        return {}
    streams = {"real": real, "wm": fed.debiased, "fed": fed.rewards}
    errors = {name: x[rows] - truth[rows] for name, x in streams.items()}
    metrics = {f"oracle/anchor_{name}_error_var": float(np.var(e)) for name, e in errors.items()}
    real_e, wm_e = errors["real"], errors["wm"]
    constant = np.std(real_e) == 0 or np.std(wm_e) == 0
    metrics["oracle/anchor_error_corr"] = (
        np.nan if constant else float(np.corrcoef(real_e, wm_e)[0, 1])
    )
    return metrics


def replay_oracle(source) -> Callable[[StepRecord], dict[str, float]]:
    """A step hook reporting `oracle/*` metrics from `source.lookup(task, program)`.

    Besides `oracle_metrics`, `oracle/wm_oos_group_rank_corr`: the world model's
    within-group Spearman correlation with the truth on the programs never
    executed in the run so far (the hook remembers what it saw executed).

    Args:
      source: an outcome source that can look up any program's true outcome
        without charging for it (`envs.outcomes.ReplayExecutor`).
    """

    executed: set[tuple[str, str]] = set()  # (task, program) executed so far in the run

    def hook(record: StepRecord) -> dict[str, float]:
        g = record.group_size
        pairs = [(record.tasks[i // g].id, p) for i, p in enumerate(record.rollout.programs)]
        truth = np.array(
            [source.lookup(record.tasks[i // g], p).reward
             for i, p in enumerate(record.rollout.programs)]
        )  # fmt: skip
        wm_mean = None if record.wm is None else record.wm.mean
        executed.update(pairs[i] for i in record.execution.results)
        metrics = oracle_metrics(record.fed.rewards, record.fed.valid, truth, wm_mean, g)
        metrics.update(stream_errors(record, truth))
        if wm_mean is not None:
            # Out of sample: only programs never executed in this run (up to this step), so
            # the world model cannot have learned their outcome from an anchor.
            fresh = np.array([pair not in executed for pair in pairs])
            metrics["oracle/wm_oos_group_rank_corr"] = _rank_corr(
                np.where(fresh, wm_mean, np.nan), truth, g
            )
        return metrics

    return hook
