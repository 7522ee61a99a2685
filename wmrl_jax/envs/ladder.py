"""Reference solutions of varied strength that populate a task's leaderboard.

A ladder entry is a name plus a factory for an unfitted scikit-learn estimator,
fitted on a training subsample (fraction `frac`) and scored on the private
answers. From weak to strong: constant priors, naive Bayes, regularised linear
models, kNN, trees, forests and gradient boosting, so a percentile says where a
submission sits between "predict the prior" and "a tuned off-the-shelf model".
The generator is our own trusted code, so entries run in-process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from sklearn import dummy, ensemble, linear_model, naive_bayes, neighbors, pipeline, preprocessing
from sklearn import tree as sk_tree

_HEDGE = 0.01


class Entry(NamedTuple):
    """One reference solution: `make(seed)` returns an unfitted estimator."""

    name: str
    make: Callable[[int], object]
    frac: float = 1.0


def _scaled(model) -> object:
    return pipeline.make_pipeline(preprocessing.StandardScaler(), model)


def _poly2(model) -> object:
    # Degree-2 feature engineering: the usual first step past a linear baseline.
    return pipeline.make_pipeline(
        preprocessing.StandardScaler(),
        preprocessing.PolynomialFeatures(degree=2, include_bias=False),
        preprocessing.StandardScaler(),
        model,
    )


def _nonlinear_entries(n_train: int, knn, tree, forest, boosting) -> list[Entry]:
    """kNN (k up to a quarter of the training set), trees, a forest and boosting."""
    ks = sorted({k for k in (1, 5, 15, 50) if k <= max(1, n_train // 4)})
    entries = [Entry(f"knn_{k}", lambda s, k=k: _scaled(knn(n_neighbors=k))) for k in ks]
    entries += [
        Entry(f"tree_d{d}", lambda s, d=d: tree(max_depth=d, random_state=s))
        for d in (1, 3, 6, None)
    ]
    entries.append(Entry("forest", lambda s: forest(n_estimators=60, random_state=s)))
    entries.append(Entry("boosting", lambda s: boosting(max_iter=60, random_state=s)))
    return entries


def classification_ladder(n_train: int) -> list[Entry]:
    """Classifiers from the class prior to gradient boosting."""
    entries = [
        Entry("prior", lambda s: dummy.DummyClassifier(strategy="prior")),
        Entry("uniform", lambda s: dummy.DummyClassifier(strategy="uniform")),
        Entry("gaussian_nb", lambda s: naive_bayes.GaussianNB()),
    ]
    for c in (0.001, 0.01, 0.1, 1.0, 10.0):
        entries.append(
            Entry(
                f"logreg_c{c:g}",
                lambda s, c=c: _scaled(linear_model.LogisticRegression(C=c, max_iter=500)),
            )
        )
    for c in (0.1, 1.0):
        entries.append(
            Entry(
                f"poly2_logreg_c{c:g}",
                lambda s, c=c: _poly2(linear_model.LogisticRegression(C=c, max_iter=1000)),
            )
        )
    entries += _nonlinear_entries(
        n_train,
        neighbors.KNeighborsClassifier,
        sk_tree.DecisionTreeClassifier,
        ensemble.RandomForestClassifier,
        ensemble.HistGradientBoostingClassifier,
    )
    subsampled = [Entry(f"{e.name}@0.3", e.make, 0.3) for e in entries if e.name != "uniform"]
    return entries + subsampled


def regression_ladder(n_train: int) -> list[Entry]:
    """Regressors from the constant mean to gradient boosting."""
    entries = [
        Entry("mean", lambda s: dummy.DummyRegressor(strategy="mean")),
        Entry("median", lambda s: dummy.DummyRegressor(strategy="median")),
    ]
    for alpha in (1000.0, 100.0, 10.0, 1.0, 0.1):
        entries.append(
            Entry(f"ridge_a{alpha:g}", lambda s, a=alpha: _scaled(linear_model.Ridge(a)))
        )
    for alpha in (10.0, 1.0):
        entries.append(
            Entry(f"poly2_ridge_a{alpha:g}", lambda s, a=alpha: _poly2(linear_model.Ridge(a)))
        )
    entries += _nonlinear_entries(
        n_train,
        neighbors.KNeighborsRegressor,
        sk_tree.DecisionTreeRegressor,
        ensemble.RandomForestRegressor,
        ensemble.HistGradientBoostingRegressor,
    )
    subsampled = [Entry(f"{e.name}@0.3", e.make, 0.3) for e in entries]
    return entries + subsampled


def fit_predict(
    entry: Entry,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    *,
    num_classes: int | None,
    seed: int,
) -> np.ndarray:
    """Fits `entry` on a seeded subsample and predicts the test set.

    Args:
        x_train: features of shape [N, D]; y_train: targets of shape [N]
            (class indices 0..C-1 when `num_classes` is set).
        x_test: features of shape [M, D].
        num_classes: C for classification (returns probabilities of shape
            [M, C], zero for classes absent from the subsample), None for
            regression (returns predictions of shape [M]).
        seed: seeds the subsample and the estimator.
    """
    rng = np.random.default_rng(seed)
    idx = np.arange(len(y_train))
    if entry.frac < 1.0:
        idx = np.sort(rng.permutation(len(y_train))[: max(2, int(entry.frac * len(y_train)))])
    model = entry.make(seed)
    model.fit(x_train[idx], y_train[idx])
    if num_classes is None:
        return np.asarray(model.predict(x_test), dtype=np.float64)
    proba = np.zeros((len(x_test), num_classes))
    proba[:, np.asarray(model.classes_, dtype=np.int64)] = model.predict_proba(x_test)
    # Competitors hedge: a 1% uniform mixture keeps trees and 1-NN from posting
    # 0/1 probabilities whose log-loss would sink below the constant prior.
    return (1.0 - _HEDGE) * proba + _HEDGE / num_classes
