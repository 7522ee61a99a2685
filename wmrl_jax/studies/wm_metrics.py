"""How well a world model ranks, foresees failures and calibrates, over groups of programs.

One group is the k programs sampled for one task; arrays are [G, k] (groups x
programs), NaN where a program has no prediction or no real reward. Every
metric says how many groups, pairs or programs it rests on, and why the others
were left out; a metric with nothing to rest on is None, never a made-up number.

* `group_spearman`: the mean within-group Spearman correlation of prediction
  and real reward (`core.stats.group_rank_correlations`: the measure of the
  regime map's q and of the trainer's oracle metrics); a group counts with at
  least 3 programs having both, neither side constant over them.
* `pairwise_accuracy`: over within-group pairs whose real rewards differ, the
  share the prediction orders the same way (a tied prediction counts 1/2).
* `failure_auc`: the AUC of the negated prediction for telling failed programs
  from the others, pooled over groups (ties count 1/2: the Mann-Whitney U).
* `crossfit_isotonic` and `calibration_error`: the isotonic map from prediction
  to real reward that the trainer's debiasing fits (`core.isotonic`, weighted
  PAV, which reproduces scikit-learn's `IsotonicRegression(out_of_bounds="clip")`),
  fitted on K-1 folds of groups and applied to the held-out fold, and the
  expected calibration error of what it gives: over B bins at the quantiles
  of the calibrated prediction (equal values share a bin),
  ECE = sum_b (n_b / n) |mean prediction_b - mean real_b|.

Example:
    >>> pred = np.array([[0.1, 0.5, 0.9]]); real = np.array([[0.2, 0.4, 0.8]])
    >>> group_spearman(pred, real)["mean"]
    1.0
    >>> pairwise_accuracy(pred, real)["accuracy"], pairwise_accuracy(pred, real)["pairs"]
    (1.0, 3)
"""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from wmrl_jax.core import isotonic
from wmrl_jax.core import stats as core_stats

MIN_GROUP = 3  # Programs a group needs for its Spearman correlation to count.


def _check(pred, real) -> tuple[np.ndarray, np.ndarray]:
    pred, real = np.asarray(pred, np.float64), np.asarray(real, np.float64)
    if pred.ndim != 2 or pred.shape != real.shape:
        raise ValueError(
            f"predictions and real rewards must be [groups, k] of one shape, got "
            f"{pred.shape} and {real.shape}"
        )
    return pred, real


def _value(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def group_spearman(pred, real) -> dict:
    """Mean within-group Spearman correlation of `pred` with `real`.

    Args:
      pred: predictions of shape [G, k] (NaN: none).
      real: real rewards of shape [G, k] (NaN: none).

    Returns:
      `mean` (None when no group counts), `se` (standard error over the
      counted groups, ddof=1; None below 2), `groups` counted, and the groups
      left out: `too_few` (fewer than 3 programs with both), then among the
      rest `constant_real` and `constant_pred` (the first reason that applies).
    """
    pred, real = _check(pred, real)
    g, k = pred.shape
    corr, counted = core_stats.group_rank_correlations(
        pred.ravel(), real.ravel(), k, min_count=MIN_GROUP
    )
    corr, counted = np.asarray(corr, np.float64), np.asarray(counted)
    both = np.isfinite(pred) & np.isfinite(real)
    too_few = both.sum(axis=1) < MIN_GROUP
    flat_real = np.array(
        [np.ptp(r[m]) == 0 if m.any() else True for r, m in zip(real, both, strict=True)]
    )
    left = ~counted & ~too_few
    kept = corr[counted]
    return {
        "mean": _value(kept.mean()) if kept.size else None,
        "se": _value(kept.std(ddof=1) / np.sqrt(kept.size)) if kept.size > 1 else None,
        "groups": int(counted.sum()),
        "too_few": int(too_few.sum()),
        "constant_real": int(np.sum(left & flat_real)),
        "constant_pred": int(np.sum(left & ~flat_real)),
        "of": int(g),
    }


def pairwise_accuracy(pred, real) -> dict:
    """Share of within-group pairs with different real rewards that `pred` orders rightly.

    A pair counts when both programs have a prediction and a real reward and
    their real rewards differ; it scores 1 when the predictions differ in the
    same direction, 1/2 when they are equal, else 0.

    Returns:
      `accuracy` (None without a pair), `pairs` counted, `tied_real` (pairs left
      out because their real rewards are equal).
    """
    pred, real = _check(pred, real)
    total, pairs, tied = 0.0, 0, 0
    for p, r in zip(pred, real, strict=True):
        ok = np.isfinite(p) & np.isfinite(r)
        p, r = p[ok], r[ok]
        i, j = np.triu_indices(p.size, 1)
        dr, dp = np.sign(r[i] - r[j]), np.sign(p[i] - p[j])
        differ = dr != 0
        tied += int(np.sum(~differ))
        pairs += int(np.sum(differ))
        total += float(np.sum((dr * dp)[differ] > 0) + 0.5 * np.sum(dp[differ] == 0))
    return {"accuracy": total / pairs if pairs else None, "pairs": pairs, "tied_real": tied}


def failure_auc(pred, failed) -> dict:
    """AUC of the negated prediction for telling failed programs from the others.

    Args:
      pred: predictions of shape [G, k] (NaN: none; left out).
      failed: bool of shape [G, k], whether the program failed (its outcome is
        not "ok": a crash, a timeout, an unusable submission), where known;
        entries whose prediction is NaN are ignored.

    Returns:
      `auc` (the probability that a failed program is predicted below a
      working one, ties 1/2; None with only one class), `programs`, `failures`,
      and `note` (why there is no AUC, else "").
    """
    pred = np.asarray(pred, np.float64)
    failed = np.asarray(failed, bool)
    if failed.shape != pred.shape:
        raise ValueError(f"failed must have the shape {pred.shape} of pred, got {failed.shape}")
    ok = np.isfinite(pred)
    score, y = -pred[ok], failed[ok]
    n1, n0 = int(y.sum()), int((~y).sum())
    out = {"auc": None, "programs": n1 + n0, "failures": n1, "note": ""}
    if n1 == 0:
        out["note"] = "no failures observed"
    elif n0 == 0:
        out["note"] = "every program failed"
    else:
        ranks = scipy_stats.rankdata(score)  # Mean ranks: a tie counts 1/2.
        out["auc"] = float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
    return out


def group_folds(num_groups: int, folds: int, seed: int) -> np.ndarray:
    """Fold of each group, of shape [num_groups]: a seeded permutation dealt round-robin."""
    if folds < 2:
        raise ValueError(f"cross-fitting needs at least 2 folds, got {folds}")
    order = np.random.default_rng(seed).permutation(num_groups)
    fold = np.empty(num_groups, np.int64)
    fold[order] = np.arange(num_groups) % folds
    return fold


def crossfit_isotonic(pred, real, fold) -> np.ndarray:
    """Each program's prediction through the isotonic map fitted on the other folds.

    Args:
      pred: predictions of shape [G, k].
      real: real rewards of shape [G, k].
      fold: the fold of each group, of shape [G] (`group_folds`).

    Returns:
      Calibrated predictions of shape [G, k]: NaN where `pred` or `real` is
      NaN, or where the other folds hold no pair to fit on.
    """
    pred, real = _check(pred, real)
    fold = np.asarray(fold)
    if fold.shape != (pred.shape[0],):
        raise ValueError(f"fold must be [groups] = [{pred.shape[0]}], got {fold.shape}")
    both = np.isfinite(pred) & np.isfinite(real)
    out = np.full(pred.shape, np.nan)
    for f in np.unique(fold):
        held, train = fold == f, (fold != f)[:, None] & both
        if not train.any():
            continue
        fit = isotonic.isotonic_fit(pred[train], real[train])
        rows = held[:, None] & both
        out[rows] = np.asarray(isotonic.isotonic_predict(fit, pred[rows]), np.float64)
    return out


def calibration_error(pred, real, *, bins: int) -> dict:
    """Expected calibration error of `pred` against `real` over quantile bins of `pred`.

    The bins' inner edges are the (1/B, ..., (B-1)/B) quantiles of the
    predictions; a prediction equal to an edge goes to the bin above it, so
    equal predictions always share a bin (a bin may then be empty, or hold more
    than n/B programs). ECE = sum over bins of (n_b / n) |mean pred_b - mean real_b|.

    Args:
      pred: predictions, any shape (NaN: left out).
      real: real rewards, the same shape (NaN: left out).
      bins: B >= 1.

    Returns:
      `ece` (None without a program), `programs`, `bins` (B).
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    pred, real = np.asarray(pred, np.float64).ravel(), np.asarray(real, np.float64).ravel()
    ok = np.isfinite(pred) & np.isfinite(real)
    pred, real = pred[ok], real[ok]
    if not pred.size:
        return {"ece": None, "programs": 0, "bins": bins}
    edges = np.quantile(pred, np.arange(1, bins) / bins)
    which = np.searchsorted(edges, pred, side="right")
    ece = sum(
        np.sum(m) / pred.size * abs(pred[m].mean() - real[m].mean())
        for m in (which == b for b in range(bins))
        if m.any()
    )
    return {"ece": float(ece), "programs": int(pred.size), "bins": bins}


def crossfit_calibration(pred, real, *, folds: int, bins: int, seed: int) -> dict:
    """ECE of the cross-fitted isotonic map (`crossfit_isotonic` over `group_folds`), and
    of the raw predictions for contrast.

    Uses min(folds, groups holding a pair) folds over the groups that hold at
    least one (prediction, real reward) pair.

    Returns:
      `ece` and `raw_ece` (None with fewer than 2 such groups), `programs`,
      `folds`, `bins`, `groups`, `note` (why there is none, else "").
    """
    pred, real = _check(pred, real)
    both = np.isfinite(pred) & np.isfinite(real)
    used = both.any(axis=1)
    k = min(folds, int(used.sum()))
    out = {"ece": None, "raw_ece": None, "programs": int(both.sum()), "folds": k,
           "bins": bins, "groups": int(used.sum()), "note": ""}  # fmt: skip
    if k < 2:
        out["note"] = "needs at least 2 groups with a prediction and a real reward"
        return out
    fold = np.full(pred.shape[0], -1)
    fold[used] = group_folds(int(used.sum()), k, seed)
    calibrated = crossfit_isotonic(pred[used], real[used], fold[used])
    out["ece"] = calibration_error(calibrated, real[used], bins=bins)["ece"]
    out["raw_ece"] = calibration_error(pred, real, bins=bins)["ece"]
    return out


def probe_metrics(pred, real, failed, *, folds: int = 5, bins: int = 10, seed: int = 0) -> dict:
    """All four metrics of a probe's [G, k] arrays (`failed` only where `real` is known)."""
    return {
        "spearman": group_spearman(pred, real),
        "pairwise": pairwise_accuracy(pred, real),
        "failure_auc": failure_auc(np.where(np.isfinite(real), pred, np.nan), failed),
        "calibration": crossfit_calibration(pred, real, folds=folds, bins=bins, seed=seed),
    }
