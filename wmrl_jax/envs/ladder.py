"""A seeded population of competitor programs that populates a task's leaderboard.

Every task gets the same generator: a few hundred entries drawn from one seeded
distribution over families (constant priors, naive Bayes, regularised linear
models, kNN, trees, forests, gradient boosting, MLPs), with hyperparameters
drawn from broad but sensible ranges and a training-subsample fraction, plus
untuned off-the-shelf defaults (`default_*`, what a competitor submits first).
Tuned ensembles are built on top (`ensembles`) from out-of-fold predictions on
the training data only. The generator is our own trusted code, so entries run
in-process.

Example:
    >>> entries = population(seed=0, classification=True, n_train=400)
    >>> entries[0].name, len(entries) >= 200
    ('prior', True)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from sklearn import (
    compose,
    dummy,
    ensemble,
    exceptions,
    linear_model,
    model_selection,
    naive_bayes,
    neighbors,
    neural_network,
    pipeline,
    preprocessing,
)
from sklearn import tree as sk_tree

_HEDGE = 0.01
# Entries per drawn family; every task gets the same counts (regression swaps
# naive Bayes for more linear models).
FAMILY_COUNTS = {
    "linear": 28,
    "naive_bayes": 10,
    "knn": 28,
    "tree": 18,
    "forest": 28,
    "boosting": 28,
    "mlp": 24,
}
FULL_DATA_PROBABILITY = 0.8  # Other entries train on a subsample fraction in [0.3, 0.9].
CV_FOLDS = 3
CV_PROBABILITY = 0.5  # Share of full-data entries that are ensemble candidates.


class Entry(NamedTuple):
    """One competitor: `make(seed)` returns an unfitted estimator.

    Attributes:
        name: unique entry name on the board.
        family: "dummy", "default", or a key of `FAMILY_COUNTS`.
        make: estimator factory, seeded.
        frac: training-subsample fraction.
        cv: whether out-of-fold predictions are computed, making the entry a
            candidate for the tuned ensembles.
        hedge: weight of the uniform mixture a classifier's probabilities get
            (competitors clip differently; dummies and defaults use 1%).
    """

    name: str
    family: str
    make: Callable[[int], object]
    frac: float = 1.0
    cv: bool = False
    hedge: float = _HEDGE


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


def _spline(model) -> object:
    return pipeline.make_pipeline(
        preprocessing.SplineTransformer(n_knots=6), preprocessing.StandardScaler(), model
    )


def _target_scaled(model) -> object:
    # Regularisation strengths and MLP step sizes are meant for unit-scale targets.
    return compose.TransformedTargetRegressor(model, transformer=preprocessing.StandardScaler())


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(np.exp(rng.uniform(math.log(low), math.log(high))))


def _log_int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(round(_log_uniform(rng, low, high)))


def _draw(family: str, rng: np.random.Generator, *, cls: bool, n_train: int):
    """One drawn configuration: (short name, factory)."""
    if family == "linear":
        # Plain, degree-2 or additive-spline features: the usual steps past a linear baseline.
        tag = str(rng.choice(["", "poly2_", "spline_"], p=[0.4, 0.3, 0.3]))
        wrap = {"": _scaled, "poly2_": _poly2, "spline_": _spline}[tag]
        if cls:
            c = _log_uniform(rng, 1e-3, 1e2)
            return f"{tag}logreg_c{c:.3g}", lambda s: wrap(
                linear_model.LogisticRegression(C=c, max_iter=300)
            )
        kind = rng.choice(["ridge", "lasso", "enet"])
        if kind == "ridge":
            a = _log_uniform(rng, 1e-3, 1e3)
            make = lambda a=a: linear_model.Ridge(alpha=a)
        else:
            a = _log_uniform(rng, 1e-4, 0.3)
            ratio = 1.0 if kind == "lasso" else round(rng.uniform(0.1, 0.9), 2)
            make = lambda a=a, r=ratio: linear_model.ElasticNet(
                alpha=a, l1_ratio=r, max_iter=2000, tol=1e-3
            )
        return f"{tag}{kind}_a{a:.3g}", lambda s: _target_scaled(wrap(make()))
    if family == "naive_bayes":
        v = _log_uniform(rng, 1e-10, 0.3)
        return f"gaussian_nb_v{v:.2g}", lambda s: naive_bayes.GaussianNB(var_smoothing=v)
    if family == "knn":
        # k >= 5: fewer neighbours post 0/1 probabilities that lose to the constant prior.
        k = max(1, min(_log_int(rng, 5, 80), n_train // 3))
        weights = str(rng.choice(["uniform", "distance"]))
        p = int(rng.choice([1, 2]))
        knn = neighbors.KNeighborsClassifier if cls else neighbors.KNeighborsRegressor
        return f"knn_k{k}_{weights[0]}_p{p}", lambda s: _scaled(
            knn(n_neighbors=k, weights=weights, p=p)
        )
    if family == "tree":
        depth = [None, *range(2, 15)][int(rng.integers(0, 14))]
        leaf = _log_int(rng, 5, 50)  # Tiny leaves memorise label noise.
        tree = sk_tree.DecisionTreeClassifier if cls else sk_tree.DecisionTreeRegressor
        return f"tree_d{depth}_l{leaf}", lambda s: tree(
            max_depth=depth, min_samples_leaf=leaf, random_state=s
        )
    if family == "forest":
        extra = rng.random() < 0.4
        n = _log_int(rng, 10, 100)
        feats = [None, "sqrt", 0.5][int(rng.integers(0, 3))]
        leaf = _log_int(rng, 1, 10)
        if extra:
            model = ensemble.ExtraTreesClassifier if cls else ensemble.ExtraTreesRegressor
        else:
            model = ensemble.RandomForestClassifier if cls else ensemble.RandomForestRegressor
        return f"{'extra' if extra else 'forest'}_n{n}_f{feats}_l{leaf}", lambda s: model(
            n_estimators=n, max_features=feats, min_samples_leaf=leaf, random_state=s
        )
    if family == "boosting":
        # Step sizes up to 0.2 and at most 31 leaves: larger ones overfit a few hundred rows.
        lr = _log_uniform(rng, 0.02, 0.2)
        it = _log_int(rng, 20, 150)
        leaves = _log_int(rng, 4, 31)
        l2 = _log_uniform(rng, 1e-3, 10.0)
        model = (
            ensemble.HistGradientBoostingClassifier
            if cls
            else ensemble.HistGradientBoostingRegressor
        )
        return f"hgb_lr{lr:.2g}_it{it}_leaves{leaves}", lambda s: model(
            learning_rate=lr, max_iter=it, max_leaf_nodes=leaves, l2_regularization=l2,
            early_stopping=False, random_state=s,
        )  # fmt: skip
    if family == "mlp":
        width = int(rng.choice([16, 32, 64, 128]))
        layers = (width,) * int(rng.integers(1, 3))
        alpha = _log_uniform(rng, 1e-4, 3.0)
        lr = _log_uniform(rng, 1e-3, 3e-2)
        it = _log_int(rng, 30, 150)
        model = neural_network.MLPClassifier if cls else neural_network.MLPRegressor
        wrap = (lambda m: _scaled(m)) if cls else (lambda m: _target_scaled(_scaled(m)))
        return f"mlp_{'x'.join(map(str, layers))}_a{alpha:.2g}", lambda s: wrap(
            model(hidden_layer_sizes=layers, alpha=alpha, learning_rate_init=lr, max_iter=it,
                  random_state=s)
        )  # fmt: skip
    raise ValueError(f"unknown family {family!r}")


def _defaults(cls: bool) -> list[Entry]:
    """Untuned off-the-shelf models: what a competitor submits first."""
    if cls:
        linear = lambda s: _scaled(linear_model.LogisticRegression(max_iter=1000))
        extra = [Entry("default_gaussian_nb", "default", lambda s: naive_bayes.GaussianNB())]
    else:
        linear = lambda s: _scaled(linear_model.Ridge())
        extra = []
    pick = (lambda c, r: c) if cls else (lambda c, r: r)
    mlp = pick(neural_network.MLPClassifier, neural_network.MLPRegressor)
    mlp_make = (lambda s: _scaled(mlp(random_state=s))) if cls else (
        lambda s: _target_scaled(_scaled(mlp(random_state=s)))
    )  # fmt: skip
    return [
        Entry("default_linear", "default", linear),
        Entry("default_knn", "default", lambda s: _scaled(
            pick(neighbors.KNeighborsClassifier, neighbors.KNeighborsRegressor)())),
        Entry("default_tree", "default", lambda s: pick(
            sk_tree.DecisionTreeClassifier, sk_tree.DecisionTreeRegressor)(random_state=s)),
        Entry("default_forest", "default", lambda s: pick(
            ensemble.RandomForestClassifier, ensemble.RandomForestRegressor)(random_state=s)),
        Entry("default_hgb", "default", lambda s: pick(
            ensemble.HistGradientBoostingClassifier,
            ensemble.HistGradientBoostingRegressor)(random_state=s)),
        Entry("default_mlp", "default", mlp_make),
        *extra,
    ]  # fmt: skip


def population(*, seed: int, classification: bool, n_train: int) -> list[Entry]:
    """The seeded single-model competitors of one task; entry 0 is the constant prior.

    Args:
        seed: task seed; the same seed gives the same entries.
        classification: classifiers (True) or regressors (False).
        n_train: training rows (bounds kNN's k).

    Returns:
        Dummies, `default_*` entries, then the drawn families in `FAMILY_COUNTS`
        order; names are unique.
    """
    rng = np.random.default_rng([seed, 7])
    cls = classification
    if cls:
        entries = [
            Entry("prior", "dummy", lambda s: dummy.DummyClassifier(strategy="prior")),
            Entry("uniform", "dummy", lambda s: dummy.DummyClassifier(strategy="uniform")),
        ]
    else:
        entries = [
            Entry("mean", "dummy", lambda s: dummy.DummyRegressor(strategy="mean")),
            Entry("median", "dummy", lambda s: dummy.DummyRegressor(strategy="median")),
        ]
    # Defaults are cross-validated too: the baseline rule and the ensembles use them.
    entries += [e._replace(cv=True) for e in _defaults(cls)]
    counts = dict(FAMILY_COUNTS)
    if not cls:
        counts["linear"] += counts.pop("naive_bayes")
    for family, count in counts.items():
        for k in range(count):
            name, make = _draw(family, rng, cls=cls, n_train=n_train)
            frac = 1.0
            if rng.random() >= FULL_DATA_PROBABILITY:
                frac = round(float(rng.uniform(0.3, 0.9)), 2)
            suffix = "" if frac == 1.0 else f"@{frac:g}"
            cv = frac == 1.0 and family != "tree" and rng.random() < CV_PROBABILITY
            hedge = _log_uniform(rng, _HEDGE, 10 * _HEDGE)
            entries.append(Entry(f"{name}_{family[:2]}{k}{suffix}", family, make, frac, cv, hedge))
    return entries


def folds(y: np.ndarray, *, classification: bool, seed: int) -> list[np.ndarray]:
    """Validation index sets of `CV_FOLDS` shuffled folds of the training rows, shared by all."""
    split = model_selection.StratifiedKFold if classification else model_selection.KFold
    if classification and np.min(np.bincount(y)) < CV_FOLDS:
        split = model_selection.KFold
    cv = split(n_splits=CV_FOLDS, shuffle=True, random_state=seed % (2**31))
    return [val for _, val in cv.split(np.zeros((len(y), 1)), y)]


def _fit_predict_one(model, x_fit, y_fit, x_pred, num_classes: int | None, hedge: float):
    with warnings.catch_warnings():
        # Drawn iteration budgets are part of the population: unconverged fits are fine.
        warnings.simplefilter("ignore", exceptions.ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)
        for step in getattr(model, "steps", [(None, model)]):
            if getattr(step[1], "n_neighbors", 0) > len(y_fit):  # Tiny subsamples.
                step[1].set_params(n_neighbors=len(y_fit))
        model.fit(x_fit, y_fit)
        if num_classes is None:
            return np.asarray(model.predict(x_pred), dtype=np.float64)
        proba = np.zeros((len(x_pred), num_classes))
        proba[:, np.asarray(model.classes_, dtype=np.int64)] = model.predict_proba(x_pred)
    # Competitors hedge: a uniform mixture keeps trees and 1-NN from posting
    # 0/1 probabilities whose log-loss would be unbounded.
    return hedged(proba, hedge)


def hedged(proba: np.ndarray, hedge: float) -> np.ndarray:
    """Mixes probabilities of shape [..., C] with the uniform distribution, weight `hedge`."""
    return (1.0 - hedge) * proba + hedge / proba.shape[-1]


def unhedged(proba: np.ndarray, hedge: float) -> np.ndarray:
    """The inverse of `hedged` (clipped to [0, 1] against rounding)."""
    return np.clip((proba - hedge / proba.shape[-1]) / (1.0 - hedge), 0.0, 1.0)


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
        num_classes: C for classification (probabilities of shape [M, C],
            zero for classes absent from the subsample, then hedged), None for
            regression (predictions of shape [M]).
        seed: seeds the subsample and the estimator.

    Returns:
        Test predictions of shape [M] or [M, C].
    """
    idx = _subsample(entry, len(y_train), seed)
    model = entry.make(seed)
    return _fit_predict_one(model, x_train[idx], y_train[idx], x_test, num_classes, entry.hedge)


def _subsample(entry: Entry, n: int, seed: int) -> np.ndarray:
    if entry.frac >= 1.0:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(n)[: max(2, int(entry.frac * n))])


def oof_predict(
    entry: Entry,
    x_train: np.ndarray,
    y_train: np.ndarray,
    *,
    num_classes: int | None,
    seed: int,
    cv_folds: list[np.ndarray],
) -> np.ndarray:
    """Out-of-fold predictions on the training rows: what a competitor tunes on.

    Args:
        x_train, y_train, num_classes, seed: as in `fit_predict`.
        cv_folds: validation index sets from `folds`, covering the rows once.

    Returns:
        Predictions of shape [N] or [N, C]; row i comes from a model fitted
        without the fold holding i.
    """
    idx = _subsample(entry, len(y_train), seed)
    out = None
    for val in cv_folds:
        fit = np.setdiff1d(idx, val)
        pred = _fit_predict_one(
            entry.make(seed), x_train[fit], y_train[fit], x_train[val], num_classes, entry.hedge
        )
        if out is None:
            out = np.zeros((len(y_train), *pred.shape[1:]))
        out[val] = pred
    return out
