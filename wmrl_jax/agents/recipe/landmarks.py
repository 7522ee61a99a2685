"""Landmark meta-features: how cheap probes score on a task's public training data.

What a reader of a data report learns in a minute is which kind of model the
data favours: 1-nearest-neighbour does well on smooth low-dimensional
structure, a decision stump on one dominant axis-aligned feature, naive Bayes
on independent features, a linear model on linear structure. `landmarks`
cross-validates these four probes on a fixed subsample of `public/train.csv`
(never the test rows or the answers) and returns their normalised scores,
which `vocab.task_features` bins into prompt tokens.

Scores are normalised to be comparable across tasks: for classification the
out-of-fold balanced accuracy rescaled so that chance is 0 and perfect is 1,
for regression the out-of-fold R^2 (the "naive Bayes" probe of a regression
task classifies the target's quartiles and predicts the posterior mean of the
quartiles' means). Everything is seeded, so the same data gives the same
scores.

Example:
    >>> landmarks(x, y, classification=True)             # doctest: +SKIP
    {'nn1': 0.91, 'stump': 0.42, 'nb': 0.88, 'linear': 0.57}
"""

from __future__ import annotations

import numpy as np

PROBES = ("nn1", "stump", "nb", "linear")
SUBSAMPLE = 400  # rows the probes see at most
FOLDS = 3


class _QuantileNB:
    """Naive Bayes for a regression target: classifies the target's quartiles and
    predicts the posterior-weighted mean of each quartile's targets."""

    def fit(self, x, y):
        from sklearn.naive_bayes import GaussianNB

        edges = np.quantile(y, [0.25, 0.5, 0.75])
        bins = np.searchsorted(edges, y, side="right")
        self.nb_ = GaussianNB().fit(x, bins)
        self.means_ = np.array([y[bins == b].mean() for b in self.nb_.classes_])
        return self

    def predict(self, x):
        return self.nb_.predict_proba(x) @ self.means_


def _probe(name: str, classification: bool):
    # scikit-learn is imported here: the vocabulary imports this module.
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    if name == "nn1":
        return KNeighborsClassifier(1) if classification else KNeighborsRegressor(1)
    if name == "stump":
        tree = DecisionTreeClassifier if classification else DecisionTreeRegressor
        return tree(max_depth=1, random_state=0)
    if name == "nb":
        return GaussianNB() if classification else _QuantileNB()
    return LogisticRegression(max_iter=300) if classification else Ridge(alpha=1.0)


def _standardise(x: np.ndarray) -> np.ndarray:
    std = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)


def landmarks(x: np.ndarray, y: np.ndarray, *, classification: bool) -> dict[str, float]:
    """Normalised out-of-fold scores of the `PROBES` on a fixed subsample.

    Args:
        x: float features of shape [N, D] (NaN cells are replaced by column means).
        y: targets of shape [N] (class labels or real values).
        classification: whether y holds classes.

    Returns:
        probe name -> score: 0 is chance (classification) or the mean predictor
        (regression), 1 is perfect; may be negative. NaN for every probe when
        there are too few rows (or, for classification, too few rows per class)
        for `FOLDS`-fold cross-validation.
    """
    from sklearn.metrics import balanced_accuracy_score, r2_score
    from sklearn.model_selection import KFold, StratifiedKFold

    x = np.asarray(x, np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"need x [N, D] and y [N], got {x.shape} and {y.shape}")
    nan = dict.fromkeys(PROBES, float("nan"))
    rows = np.random.default_rng(0).permutation(len(y))[:SUBSAMPLE]
    x, y = x[rows], y[rows]
    if x.shape[1] == 0 or len(y) < 2 * FOLDS:
        return nan
    x = _standardise(np.where(np.isfinite(x), x, np.nanmean(np.where(np.isfinite(x), x, 0), 0)))
    if classification:
        _, y = np.unique(y, return_inverse=True)
        counts = np.bincount(y)
        if counts.size < 2 or counts.min() < FOLDS:
            return nan
        folds = StratifiedKFold(FOLDS, shuffle=True, random_state=0).split(x, y)
    else:
        y = y.astype(np.float64)
        if not np.std(y) > 0:
            return nan
        folds = KFold(FOLDS, shuffle=True, random_state=0).split(x)
    preds = {name: np.zeros(len(y), y.dtype) for name in PROBES}
    for train, test in folds:
        for name in PROBES:
            model = _probe(name, classification).fit(x[train], y[train])
            preds[name][test] = model.predict(x[test])
    if classification:
        chance = 1.0 / counts.size
        return {
            n: float((balanced_accuracy_score(y, p) - chance) / (1.0 - chance))
            for n, p in preds.items()
        }
    return {n: float(r2_score(y, p)) for n, p in preds.items()}
