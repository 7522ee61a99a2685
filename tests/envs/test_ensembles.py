"""The competitors' ensembles and the default baseline, on hand-checkable candidates."""

import numpy as np
import pytest
from sklearn import metrics as sk_metrics
from sklearn import naive_bayes

from wmrl_jax.envs import ensembles, ladder


def test_fast_auc_matches_scikit_learn():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=80)
    p1 = np.round(rng.uniform(size=80), 1)  # Ties on purpose.
    pred = np.stack([1 - p1, p1], axis=1)
    want = sk_metrics.roc_auc_score(y, p1)
    assert ensembles.oof_score("auc", y, pred) == pytest.approx(want, abs=1e-12)
    assert ensembles.oof_score("rmse", np.zeros(4), np.full(4, 2.0)) == pytest.approx(-2.0)


def test_ensembles_tune_on_out_of_fold_predictions_only():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    good = ensembles.Candidate("good", "linear", y + 0.1, np.array([9.0]), 1.0, 2.0)
    bad = ensembles.Candidate("bad", "knn", y + 5.0, np.array([-9.0]), 1.0, 2.0)
    score = lambda p: ensembles.oof_score("rmse", y, p)
    assert ensembles._greedy([bad, good], y, score, rounds=3) == [1, 1, 1]
    out = ensembles.tuned_ensembles([good, bad], y, metric="rmse", seed=0)
    assert len(out) == ensembles.NUM_ENSEMBLES
    names = [n for n, _, _ in out]
    assert len(set(names)) == len(names) and all(n.startswith("ensemble_") for n in names)
    greedy = [p for n, p, _ in out if "greedy" in n]
    assert greedy and all(p[0] == 9.0 for p in greedy)  # Greedy selection keeps only "good".
    assert all(s >= 3.0 for _, _, s in out)  # Pool cross-validation plus one full fit.


def test_unhedged_recovers_the_raw_probabilities_an_entry_hedged():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 3)), np.arange(40) % 3
    make = lambda s: naive_bayes.GaussianNB()
    entry = ladder.Entry("nb", "naive_bayes", make, hedge=0.07)
    pred = ladder.fit_predict(entry, x, y, x[:5], num_classes=3, seed=0)
    cand = ensembles.Candidate("nb", "naive_bayes", pred, pred, 1.0, 1.0, entry.hedge)
    raw = naive_bayes.GaussianNB().fit(x, y).predict_proba(x[:5])
    np.testing.assert_allclose(ensembles._unhedged(cand).pred, raw, atol=1e-12)
    np.testing.assert_allclose(ladder.hedged(raw, 0.07), pred, atol=1e-12)
    reg = ensembles.Candidate("r", "linear", np.ones(4), np.ones(2), 1.0, 1.0)
    assert ensembles._unhedged(reg) is reg


@pytest.mark.parametrize("wrong, want", [(0, 0.001), (3, None), (12, 0.1)])
def test_tuned_hedge_is_the_grid_value_with_the_best_out_of_fold_log_loss(wrong, want):
    # 40 rows, 3 classes: confident and right, except `wrong` confident mistakes.
    y = np.arange(40) % 3
    raw = np.eye(3)[y]
    raw[:wrong] = np.eye(3)[(y[:wrong] + 1) % 3]
    losses = [  # The reference: log-loss of each hedged prediction, in float64.
        -np.mean(np.log((1 - h) * raw[np.arange(40), y] + h / 3)) for h in ensembles.HEDGE_GRID
    ]
    got = ensembles._tuned_hedge(raw, y, "log_loss")
    assert got == ensembles.HEDGE_GRID[int(np.argmin(losses))]
    if want is not None:
        assert got == want


def test_classifier_ensembles_clip_once_with_their_tuned_hedge():
    # Members hedged at 10% whose raw out-of-fold predictions are all right and confident:
    # the averaged ensembles drop the members' hedge for the grid's smallest.
    y = np.arange(30) % 3
    hedged = lambda p: ladder.hedged(p, 0.1)
    test = np.eye(3)[[0, 1, 2, 2]]
    members = [
        ensembles.Candidate(n, "linear", hedged(np.eye(3)[y]), hedged(test), 1.0, 1.0, 0.1)
        for n in ("a", "b")
    ]
    out = ensembles.tuned_ensembles(members, y, metric="log_loss", seed=0)
    averaged = [p for n, p, _ in out if "stack" not in n]
    assert averaged
    for p in averaged:
        np.testing.assert_allclose(p, ladder.hedged(test, min(ensembles.HEDGE_GRID)), atol=1e-12)


def test_default_blend_averages_the_best_members_by_cv():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    # Out-of-fold errors -> the best five, in CV order, leave out "b".
    errs = [("a", 0.1, 1.0), ("b", 2.0, 100.0), ("c", 0.5, 2.0), ("d", 1.0, 6.0),
            ("e", 0.2, 3.0), ("f", 0.3, 3.0)]  # fmt: skip
    members = [
        ensembles.Candidate(name, "default", y + err, np.array([pred]), 1.0, 1.0)
        for name, err, pred in errs
    ]
    pred, chosen = ensembles.default_blend(members, y, metric="rmse")
    assert ensembles.BLEND_TOP == 5 and chosen == ["a", "e", "f", "c", "d"]
    np.testing.assert_allclose(pred, [3.0])  # (1 + 3 + 3 + 2 + 6) / 5
    with pytest.raises(ValueError, match="at least one"):
        ensembles.default_blend([], y, metric="rmse")


def test_stacking_weights_the_member_that_fits_out_of_fold():
    rng = np.random.default_rng(0)
    y = np.linspace(-2.0, 2.0, 40)
    exact = ensembles.Candidate("exact", "linear", y.copy(), np.array([5.0, -1.0]), 1.0, 1.0)
    noise = ensembles.Candidate("noise", "knn", rng.normal(size=40), np.array([9.0, 9.0]), 1.0, 1.0)
    pred = ensembles._stack([exact, noise], y, num_classes=None, strength=1e-8)
    # Least squares puts weight 1 on "exact" and 0 on "noise": its test predictions come out.
    np.testing.assert_allclose(pred, [5.0, -1.0], atol=1e-6)
    labels = (y > 0).astype(np.int64)
    proba = np.stack([1.0 - (y > 0), (y > 0) * 1.0], axis=1) * 0.9 + 0.05
    cand = ensembles.Candidate("c", "linear", proba, proba[:3], 1.0, 1.0)
    out = ensembles._stack([cand], labels, num_classes=2, strength=1.0)
    assert out.shape == (3, 2) and np.allclose(out.sum(axis=1), 1.0)
    assert np.all(out >= 0.01 / 2 - 1e-12)  # Hedged like the entries.
    assert np.all(np.argmax(out, axis=1) == np.argmax(proba[:3], axis=1))
