"""Synthetic task families with knobs: the generator side of a suite that can grow.

The core suite (`suite.suite_specs`) has 12 training tasks, too few for a
policy to learn anything that carries to held-out tasks. This module adds
families, each a generator with knobs, and expands every family over a fixed
grid of knob settings into tasks. Two kinds of knob:

- difficulty: label noise (`flip`), signal-to-noise (`noise`), interaction
  order, number of classes;
- the task features a recipe policy reads (`agents.recipe.vocab.task_features`):
  rows, feature count, metric, class balance (`minority`), target skew
  (`skew`) and heterogeneous feature scales (`scale_decades`).

Splits are by family, as in the core suite: a held-out family is never
trained on, but each names the `related` training family it resembles (the
same kind of structure under another generator), so that what a policy
learns on the training families can carry over. The grids are factorial and
fixed before any outcome is seen; nothing here looks at a recipe's score or
at an arm's result, so the split favours no arm.

`suite.suite_specs("grown")` expands them into tasks `{family}_{k}`.

Example:
    >>> fams = families()
    >>> sum(len(f.grid) for f in fams if f.split == "train")
    28
    >>> x, y = family_by_name("parity").make(0, Knobs(rows=50, features=4))
    >>> x.shape, sorted(set(y.tolist()))
    ((50, 4), [0, 1])
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from sklearn import datasets

# How tasks are generated. 1: the first recipe table's tasks; their last bits
# depend on the machine (BLAS products in scikit-learn's generators, numpy's
# CPU-specific exp/sin/pow loops), so 17 of the grown suite's 56 tasks generate
# other data under another BLAS kernel. 2 (the committed table's): bit-stable:
# every generated float rounded to `suite.DIGITS` significant digits and
# `low_rank` built without BLAS; with foreseeable failures (`recipes`). Switching
# changes the data of 52 of the 56 tasks, so the table must be rebuilt with it
# (docs/tasks.md, "A table that reproduces").
GENERATIONS = (1, 2)
GENERATION = 2


class Knobs(NamedTuple):
    """One setting of a family's knobs (unused knobs keep their defaults).

    Attributes:
        rows: samples before the train/test split.
        features: columns, informative and nuisance.
        noise: regression noise standard deviation relative to the signal's.
        flip: share of classification labels replaced at random.
        order: interaction order (how many features a label depends on jointly).
        classes: number of classes.
        minority: share of the rows in the smallest class (0.5: balanced binary).
        skew: regression target skew; the target becomes exp(skew * z) for z standardised.
        scale_decades: feature scales spread over this many powers of ten.
    """

    rows: int = 500
    features: int = 8
    noise: float = 0.3
    flip: float = 0.05
    order: int = 2
    classes: int = 2
    minority: float = 0.5
    skew: float = 0.0
    scale_decades: float = 0.0


class Family(NamedTuple):
    """A task family: a generator, its split and the knob grid it is expanded over.

    Attributes:
        name: family name (task ids are `{name}_{k}`).
        split: "train" or "held-out".
        classification: whether targets are class indices.
        make: (seed, knobs) -> (x [N, D], y [N]).
        grid: knob settings, one task each.
        metrics: metric of task k is `metrics[k % len(metrics)]`.
        related: for a held-out family, the training family it resembles.
        blurb: one sentence for the task's description.
    """

    name: str
    split: str
    classification: bool
    make: Callable[[int, Knobs], tuple[np.ndarray, np.ndarray]]
    grid: tuple[Knobs, ...]
    metrics: tuple[str, ...]
    related: str | None
    blurb: str


def _finish(rng, x, y, knobs: Knobs, *, classification: bool):
    """Applies the knobs every family shares: label flips, class balance, skew, scales."""
    if classification:
        flip = rng.random(len(y)) < knobs.flip
        y = np.where(flip, rng.integers(0, int(y.max()) + 1, len(y)), y)
        if knobs.minority < 0.5 and int(y.max()) == 1:
            # Drop positives until they are `minority` of the rows.
            pos = np.flatnonzero(y == 1)
            keep_pos = int(round(knobs.minority / (1 - knobs.minority) * np.sum(y == 0)))
            drop = rng.permutation(pos)[: max(0, len(pos) - keep_pos)]
            x, y = np.delete(x, drop, axis=0), np.delete(y, drop)
    elif knobs.skew > 0:
        z = (y - y.mean()) / (y.std() or 1.0)
        y = np.exp(knobs.skew * z)
    if knobs.scale_decades > 0:
        x = x * 10.0 ** rng.uniform(-knobs.scale_decades / 2, knobs.scale_decades / 2, x.shape[1])
    return x, y


def _with_noise(rng, signal: np.ndarray, noise: float) -> np.ndarray:
    return signal + noise * (signal.std() or 1.0) * rng.normal(size=signal.shape)


def _gauss_quantiles(seed: int, k: Knobs):
    rng = np.random.default_rng(seed)
    x, y = datasets.make_gaussian_quantiles(
        n_samples=k.rows, n_features=k.features, n_classes=k.classes, random_state=seed
    )
    return _finish(rng, x, y, k, classification=True)


def _parity(seed: int, k: Knobs):
    """Labels by the sign of a product of `order` features (XOR); the rest is nuisance."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (k.rows, k.features))
    y = (np.prod(x[:, : k.order], axis=1) > 0).astype(np.int64)
    return _finish(rng, x, y, k, classification=True)


def _checkerboard(seed: int, k: Knobs):
    """Cells of a grid over two features alternate classes (XOR with more cells)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (k.rows, k.features))
    cells = np.floor(x[:, :2] * (k.order + 1)).astype(np.int64)
    y = (cells.sum(axis=1) % 2).astype(np.int64)
    return _finish(rng, x, y, k, classification=True)


def _hypercube(seed: int, k: Knobs):
    """Gaussian clusters on hypercube vertices, few informative and some redundant features."""
    rng = np.random.default_rng(seed)
    informative = max(2, k.features // 2)
    x, y = datasets.make_classification(
        n_samples=k.rows, n_features=k.features, n_informative=informative,
        n_redundant=min(2, k.features - informative), n_classes=k.classes,
        n_clusters_per_class=2, class_sep=1.0 / k.order, flip_y=0.0, random_state=seed,
    )  # fmt: skip
    return _finish(rng, x, y, k, classification=True)


def _additive(seed: int, k: Knobs):
    """A sum of smooth one-feature functions (sin, square, abs) of the first features."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, (k.rows, k.features))
    parts = (np.sin(2 * x[:, 0]), x[:, 1] ** 2, np.abs(x[:, 2]), 0.5 * x[:, 3])
    y = _with_noise(rng, np.sum(parts[: max(2, k.order + 1)], axis=0), k.noise)
    return _finish(rng, x, y, k, classification=False)


def _interaction(seed: int, k: Knobs):
    """Products of feature pairs (x0 x1 + x2 x3 ...): the additive family's held-out cousin."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, (k.rows, k.features))
    pairs = [x[:, 2 * j] * x[:, 2 * j + 1] for j in range(max(1, k.order))]
    y = _with_noise(rng, np.sum(pairs, axis=0) + np.sin(x[:, -1]), k.noise)
    return _finish(rng, x, y, k, classification=False)


def _steps(seed: int, k: Knobs):
    """A piecewise-constant target: steps of `order` features at drawn thresholds."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(k.rows, k.features))
    cuts = rng.normal(size=(k.order, 3))
    signal = sum(np.searchsorted(np.sort(cuts[j]), x[:, j]) for j in range(k.order))
    y = _with_noise(rng, signal.astype(np.float64), k.noise)
    return _finish(rng, x, y, k, classification=False)


def _row_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w of shape [N] from elementwise products added in column order.

    Elementwise IEEE arithmetic rounds the same on every machine; a BLAS product
    does not (its kernel, and so its summation order, depends on the CPU), and
    the written data must not depend on the machine that generates it.
    """
    out = np.zeros(x.shape[0])
    for j in range(x.shape[1]):
        out = out + x[:, j] * w[j]
    return out


def _low_rank(seed: int, k: Knobs):
    """A linear target of correlated features (effective rank 3), many weak directions.

    Generation 2: three latent factors mixed into every column plus a weak
    independent tail, built without BLAS products (`_row_dot`) so that the data
    is bit-identical on every machine. Generation 1: scikit-learn's
    `make_regression(effective_rank=3)`, whose QR factorisations and products
    differ in the last bits between BLAS kernels.
    """
    rng = np.random.default_rng(seed)
    if GENERATION == 1:
        x, y = datasets.make_regression(
            n_samples=k.rows, n_features=k.features, n_informative=max(2, k.features // 2),
            effective_rank=3, tail_strength=0.5, noise=0.0, random_state=seed,
        )  # fmt: skip
        return _finish(rng, x, _with_noise(rng, y, k.noise), k, classification=False)
    factors = rng.normal(size=(k.rows, 3))
    loadings = rng.normal(size=(3, k.features))
    x = 0.3 * rng.normal(size=(k.rows, k.features))
    for r in range(3):
        x = x + factors[:, r : r + 1] * loadings[r]
    informative = max(2, k.features // 2)
    w = np.where(np.arange(k.features) < informative, rng.normal(size=k.features), 0.0)
    return _finish(rng, x, _with_noise(rng, _row_dot(x, w), k.noise), k, classification=False)


def _grid(**axes) -> tuple[Knobs, ...]:
    """Knob settings: the product of the given axes, in a fixed order."""
    names = list(axes)
    return tuple(
        Knobs(**dict(zip(names, values, strict=True)))
        for values in itertools.product(*axes.values())
    )


def families() -> tuple[Family, ...]:
    """The grown suite's families: 7 training families of 4 tasks, 2 held-out of 3."""
    cls_metrics, reg_metrics = ("log_loss", "auc"), ("rmse", "mae", "r2")
    return (
        Family("gauss_quantiles", "train", True, _gauss_quantiles,
               _grid(rows=(300, 700), classes=(2, 3), features=(5,)), ("log_loss",), None,
               "Classify points by which shell around the centre they fall in."),
        Family("parity", "train", True, _parity,
               _grid(order=(2, 3), features=(4, 12)), cls_metrics, None,
               "Binary classification whose label depends on an interaction of features."),
        Family("hypercube", "train", True, _hypercube,
               _grid(classes=(2, 4), scale_decades=(0.0, 3.0), features=(10,)),
               ("log_loss", "auc", "log_loss", "log_loss"), None,
               "Classification of tabular features clustered around hypercube vertices."),
        Family("imbalanced", "train", True, _hypercube,
               _grid(minority=(0.1, 0.25), features=(6, 16), rows=(800,)), cls_metrics, None,
               "Binary classification with a rare positive class."),
        Family("additive", "train", False, _additive,
               _grid(order=(1, 3), skew=(0.0, 1.0), features=(6,)), reg_metrics, None,
               "Regression of a sum of smooth functions of single features."),
        Family("steps", "train", False, _steps,
               _grid(order=(1, 3), features=(5, 12)), reg_metrics, None,
               "Regression of a piecewise-constant function of a few features."),
        Family("low_rank", "train", False, _low_rank,
               _grid(features=(8, 24), scale_decades=(0.0, 3.0)), reg_metrics, None,
               "Regression of a linear target of strongly correlated features."),
        Family("checkerboard", "held-out", True, _checkerboard,
               (Knobs(order=1, features=4), Knobs(order=2, features=4),
                Knobs(order=3, features=10)),
               cls_metrics, "parity", "Binary classification of points on a checkerboard."),
        Family("interaction", "held-out", False, _interaction,
               (Knobs(order=1, noise=0.2), Knobs(order=2, noise=0.2),
                Knobs(order=2, noise=0.5, skew=1.0)),
               reg_metrics, "additive", "Regression of products of feature pairs."),
    )  # fmt: skip


def family_by_name(name: str) -> Family:
    """The family called `name`; ValueError for an unknown name."""
    for family in families():
        if family.name == name:
            return family
    raise ValueError(f"unknown task family {name!r}")
