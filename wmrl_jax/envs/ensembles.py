"""The tuned ensembles and the default baseline on a built-in task's board.

A competitor who has fitted many models ensembles them on out-of-fold
predictions of the training rows: greedy selection (Caruana et al., 2004),
averages of the best k, stacking (Wolpert, 1992). `tuned_ensembles` draws
`NUM_ENSEMBLES` such competitors; `default_blend` is the default baseline, the
first submission after trying the usual untuned models. Nothing here sees the
test answers.

Example:
    >>> y = np.zeros(4)
    >>> good = Candidate("good", "linear", y + 0.1, np.array([1.0]), 1.0, 1.0)
    >>> bad = Candidate("bad", "knn", y + 5.0, np.array([9.0]), 1.0, 1.0)
    >>> default_blend([good, bad], y, metric="rmse")[1]
    ['good', 'bad']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats
from sklearn import linear_model, preprocessing

from wmrl_jax.envs import ladder, metrics

# The default baseline (`default_blend`): the average of the BLEND_TOP untuned off-the-shelf
# models (`default_*` entries: scikit-learn defaults, scaled inputs) with the best 3-fold CV
# score on the training data, what a competitor submits first after trying the usual models.
BASELINE_ENTRY = "default_blend"
BLEND_TOP = 5
ENSEMBLE_PREFIX = "ensemble_"
NUM_ENSEMBLES = 60
# Hedges a tuned classifier ensemble chooses from by out-of-fold score (`_tuned_hedge`).
HEDGE_GRID = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


class Candidate(NamedTuple):
    """One fitted competitor as an ensembler sees it: predictions and their cost."""

    name: str
    family: str
    oof: np.ndarray  # [N] or [N, C]
    pred: np.ndarray  # [M] or [M, C]
    fit_s: float
    cv_s: float
    hedge: float = ladder._HEDGE  # Uniform-mixture weight in a classifier's oof and pred.


def _unhedged(c: Candidate) -> Candidate:
    """`c` with its raw probabilities: the inverse of the entry's uniform-mixture hedge.

    A competitor ensembling their own models averages what the models predict and
    clips once, for the ensemble. Regressors are returned as they are.
    """
    if c.oof.ndim == 1:
        return c
    raw = lambda p: ladder.unhedged(p, c.hedge)
    return c._replace(oof=raw(c.oof), pred=raw(c.pred), hedge=0.0)


def _tuned_hedge(oof: np.ndarray, y: np.ndarray, metric: str) -> float:
    """The `HEDGE_GRID` value with the best out-of-fold score for raw probabilities `oof`.

    Ties go to the smaller hedge. Clipping is the one knob log-loss rewards on a
    task a model nearly solves: too little and one confident mistake dominates,
    too much and every confident right answer pays for it.
    """
    scores = [oof_score(metric, y, ladder.hedged(oof, h)) for h in HEDGE_GRID]
    return HEDGE_GRID[int(np.argmax(scores))]


def oof_score(metric: str, y: np.ndarray, pred: np.ndarray) -> float:
    """The metric on training rows, oriented so that higher is better."""
    if metric == "auc" and pred.ndim == 2 and pred.shape[1] == 2:
        # Rank form of binary ROC AUC (ties averaged), as roc_auc_score, without its overhead.
        ranks, pos = stats.rankdata(pred[:, 1]), y == 1
        n1 = int(pos.sum())
        return (ranks[pos].sum() - n1 * (n1 + 1) / 2) / max(1, n1 * (len(y) - n1))
    if pred.ndim == 2 and metric == "accuracy":
        pred = np.argmax(pred, axis=1).astype(np.float64)
    value = metrics.METRICS[metric].fn(
        y.astype(np.float64), pred if pred.ndim == 2 else pred[:, None]
    )
    return value if metrics.METRICS[metric].direction == metrics.HIGHER else -value


def _greedy(pool, y, score: Callable[[np.ndarray], float], rounds: int) -> list[int]:
    """Caruana et al. (2004) ensemble selection with replacement on out-of-fold predictions.

    `score` maps an out-of-fold average to a higher-is-better value.
    """
    chosen, total = [], 0.0
    for r in range(rounds):
        trial = [score((total + c.oof) / (r + 1)) for c in pool]
        chosen.append(int(np.argmax(trial)))
        total = total + pool[chosen[-1]].oof
    return chosen


def default_blend(
    members: Sequence[Candidate], y_train: np.ndarray, *, metric: str
) -> tuple[np.ndarray, list[str]]:
    """The default baseline: the average of the `BLEND_TOP` members with the best CV score.

    A competitor's first submission after trying the usual untuned models: score
    each by 3-fold cross-validation on the training data, keep the best
    `BLEND_TOP` (ties keep the given order) and average their test predictions.

    Args:
        members: candidates with out-of-fold predictions of shape [N] or [N, C].
        y_train: training targets of shape [N].
        metric: the task metric.

    Returns:
        (test predictions of shape [M] or [M, C], the chosen names in CV order).
    """
    if not members:
        raise ValueError("default_blend needs at least one member")
    scores = [oof_score(metric, y_train, c.oof) for c in members]
    top = sorted(range(len(members)), key=lambda j: -scores[j])[:BLEND_TOP]
    return np.mean([members[j].pred for j in top], axis=0), [members[j].name for j in top]


def _stack(pool, y, *, num_classes: int | None, strength: float) -> np.ndarray:
    """Stacking (Wolpert, 1992): a regularised linear model on the pool's out-of-fold predictions.

    Classifiers stack log-probabilities with a multinomial logistic regression
    (inverse strength C = 1 / `strength`), hedged like the entries; regressors
    stack predictions with ridge (alpha = `strength`). Returns test predictions.
    """
    if num_classes is None:
        feats = lambda c: c[:, None]
        model = linear_model.Ridge(alpha=strength)
    else:
        feats = lambda c: np.log(np.clip(c, 1e-6, 1.0))
        model = linear_model.LogisticRegression(C=1.0 / strength, max_iter=500)
    x_oof = np.concatenate([feats(c.oof) for c in pool], axis=1)
    x_test = np.concatenate([feats(c.pred) for c in pool], axis=1)
    scaler = preprocessing.StandardScaler().fit(x_oof)
    model.fit(scaler.transform(x_oof), y)
    if num_classes is None:
        return model.predict(scaler.transform(x_test))
    proba = np.zeros((len(x_test), num_classes))
    proba[:, model.classes_] = model.predict_proba(scaler.transform(x_test))
    return ladder.hedged(proba, ladder._HEDGE)


def tuned_ensembles(
    candidates: Sequence[Candidate], y_train: np.ndarray, *, metric: str, seed: int
) -> list[tuple[str, np.ndarray, float]]:
    """`NUM_ENSEMBLES` ensembles tuned on out-of-fold predictions only; (name, pred, seconds).

    Three kinds, each over a seeded random pool of the candidates: greedy
    ensemble selection with replacement, the average of the top k by
    cross-validated score, and stacking of the top k (`_stack`) with a drawn
    regularisation strength. Classifier averages combine the members' raw
    probabilities (`_unhedged`), are selected with the entries' 1% hedge, and
    are then hedged once by the `_tuned_hedge` of their out-of-fold average;
    an average of members' hedges would carry a clipping nobody tuned.
    Seconds: the pool's cross-validation, the chosen members' full fits, and
    the selection.
    """
    rng = np.random.default_rng([seed, 11])
    classifier = candidates[0].oof.ndim == 2
    selection_hedge = (lambda p: ladder.hedged(p, ladder._HEDGE)) if classifier else (lambda p: p)
    score = lambda p: oof_score(metric, y_train, selection_hedge(p))
    raw = [_unhedged(c) for c in candidates]
    out = []
    for k in range(NUM_ENSEMBLES):
        start = time.perf_counter()
        size = max(2, int(round(rng.uniform(0.6, 1.0) * len(candidates))))
        idx = np.sort(rng.choice(len(candidates), size, replace=False))
        pool = [raw[i] for i in idx]
        scores = np.array([score(c.oof) for c in pool])
        kind = ("greedy", "top", "stack")[k % 3]
        if kind == "stack":
            chosen = list(np.argsort(-scores, kind="stable")[: int(rng.integers(3, 11))])
            num_classes = pool[0].oof.shape[1] if classifier else None
            strength = float(np.exp(rng.uniform(np.log(0.3), np.log(30.0))))
            members = [candidates[idx[i]] for i in chosen]  # As the entries predict.
            pred = _stack(members, y_train, num_classes=num_classes, strength=strength)
        else:
            if kind == "greedy":
                chosen = _greedy(pool, y_train, score, int(rng.integers(15, 40)))
            else:
                chosen = list(np.argsort(-scores, kind="stable")[: int(rng.integers(2, 13))])
            pred = np.mean([pool[i].pred for i in chosen], axis=0)
            if classifier:
                oof = np.mean([pool[i].oof for i in chosen], axis=0)
                pred = ladder.hedged(pred, _tuned_hedge(oof, y_train, metric))
        sec = sum(c.cv_s for c in pool) + sum(pool[i].fit_s for i in set(chosen))
        out.append((f"{ENSEMBLE_PREFIX}{kind}{k}", pred, sec + time.perf_counter() - start))
    return out
