"""Tests for the built-in suite's leaderboards: population, ensembles, checks, build, CLI."""

import filecmp
import os

import numpy as np
import pytest
from sklearn import metrics as sk_metrics
from sklearn import naive_bayes

from tests.envs.conftest import read_csv_rows, relative_files
from wmrl_jax.envs import builtin, ladder, suite

_read, _files = read_csv_rows, relative_files


@pytest.mark.parametrize("classification", [True, False])
def test_population_is_seeded_large_and_unique(classification):
    a = ladder.population(seed=3, classification=classification, n_train=300)
    b = ladder.population(seed=3, classification=classification, n_train=300)
    c = ladder.population(seed=4, classification=classification, n_train=300)
    names = [e.name for e in a]
    assert names == [e.name for e in b] and names != [e.name for e in c]
    # With the default blend and the tuned ensembles, boards hold over 200 entries.
    assert len(a) + 1 + builtin.NUM_ENSEMBLES >= 200 and len(set(names)) == len(names)
    assert a[0].name == ("prior" if classification else "mean")
    assert sum(e.family == "default" for e in a) > builtin.BLEND_TOP
    families = {e.family for e in a}
    assert {"linear", "knn", "tree", "forest", "boosting", "mlp"} <= families
    assert ("naive_bayes" in families) == classification
    assert any(e.frac < 1.0 for e in a) and any(e.cv for e in a)
    assert all(e.frac == 1.0 for e in a if e.cv)  # Candidates tune on the full training set.
    assert all(e.cv for e in a if e.family == "default")  # The baseline rule needs their CV.


def test_oof_predictions_cover_every_row_once():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 3)), np.arange(60) % 3
    entry = ladder.Entry("nb", "naive_bayes", lambda s: naive_bayes.GaussianNB(), cv=True)
    cv = ladder.folds(y, classification=True, seed=0)
    assert sorted(np.concatenate(cv).tolist()) == list(range(60))
    oof = ladder.oof_predict(entry, x, y, num_classes=3, seed=0, cv_folds=cv)
    assert oof.shape == (60, 3) and np.allclose(oof.sum(axis=1), 1.0)
    assert np.all(oof >= 0.01 / 3 - 1e-12)  # The 1% hedge.


def test_fast_auc_matches_scikit_learn():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=80)
    p1 = np.round(rng.uniform(size=80), 1)  # Ties on purpose.
    pred = np.stack([1 - p1, p1], axis=1)
    want = sk_metrics.roc_auc_score(y, p1)
    assert builtin._oof_score("auc", y, pred) == pytest.approx(want, abs=1e-12)
    assert builtin._oof_score("rmse", np.zeros(4), np.full(4, 2.0)) == pytest.approx(-2.0)


def test_ensembles_tune_on_out_of_fold_predictions_only():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    good = builtin._Candidate("good", "linear", y + 0.1, np.array([9.0]), 1.0, 2.0)
    bad = builtin._Candidate("bad", "knn", y + 5.0, np.array([-9.0]), 1.0, 2.0)
    score = lambda p: builtin._oof_score("rmse", y, p)
    assert builtin._greedy([bad, good], y, score, rounds=3) == [1, 1, 1]
    out = builtin.tuned_ensembles([good, bad], y, metric="rmse", seed=0)
    assert len(out) == builtin.NUM_ENSEMBLES
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
    cand = builtin._Candidate("nb", "naive_bayes", pred, pred, 1.0, 1.0, entry.hedge)
    raw = naive_bayes.GaussianNB().fit(x, y).predict_proba(x[:5])
    np.testing.assert_allclose(builtin._unhedged(cand).pred, raw, atol=1e-12)
    np.testing.assert_allclose(ladder.hedged(raw, 0.07), pred, atol=1e-12)
    reg = builtin._Candidate("r", "linear", np.ones(4), np.ones(2), 1.0, 1.0)
    assert builtin._unhedged(reg) is reg


@pytest.mark.parametrize("wrong, want", [(0, 0.001), (3, None), (12, 0.1)])
def test_tuned_hedge_is_the_grid_value_with_the_best_out_of_fold_log_loss(wrong, want):
    # 40 rows, 3 classes: confident and right, except `wrong` confident mistakes.
    y = np.arange(40) % 3
    raw = np.eye(3)[y]
    raw[:wrong] = np.eye(3)[(y[:wrong] + 1) % 3]
    losses = [  # The reference: log-loss of each hedged prediction, in float64.
        -np.mean(np.log((1 - h) * raw[np.arange(40), y] + h / 3)) for h in builtin.HEDGE_GRID
    ]
    got = builtin._tuned_hedge(raw, y, "log_loss")
    assert got == builtin.HEDGE_GRID[int(np.argmin(losses))]
    if want is not None:
        assert got == want


def test_classifier_ensembles_clip_once_with_their_tuned_hedge():
    # Members hedged at 10% whose raw out-of-fold predictions are all right and confident:
    # the averaged ensembles drop the members' hedge for the grid's smallest.
    y = np.arange(30) % 3
    hedged = lambda p: ladder.hedged(p, 0.1)
    test = np.eye(3)[[0, 1, 2, 2]]
    members = [
        builtin._Candidate(n, "linear", hedged(np.eye(3)[y]), hedged(test), 1.0, 1.0, 0.1)
        for n in ("a", "b")
    ]
    out = builtin.tuned_ensembles(members, y, metric="log_loss", seed=0)
    averaged = [p for n, p, _ in out if "stack" not in n]
    assert averaged
    for p in averaged:
        np.testing.assert_allclose(p, ladder.hedged(test, min(builtin.HEDGE_GRID)), atol=1e-12)


def test_default_blend_averages_the_best_members_by_cv():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    # Out-of-fold errors -> the best five, in CV order, leave out "b".
    errs = [("a", 0.1, 1.0), ("b", 2.0, 100.0), ("c", 0.5, 2.0), ("d", 1.0, 6.0),
            ("e", 0.2, 3.0), ("f", 0.3, 3.0)]  # fmt: skip
    members = [
        builtin._Candidate(name, "default", y + err, np.array([pred]), 1.0, 1.0)
        for name, err, pred in errs
    ]
    pred, chosen = builtin.default_blend(members, y, metric="rmse")
    assert builtin.BLEND_TOP == 5 and chosen == ["a", "e", "f", "c", "d"]
    np.testing.assert_allclose(pred, [3.0])  # (1 + 3 + 3 + 2 + 6) / 5
    with pytest.raises(ValueError, match="at least one"):
        builtin.default_blend([], y, metric="rmse")


def test_stacking_weights_the_member_that_fits_out_of_fold():
    rng = np.random.default_rng(0)
    y = np.linspace(-2.0, 2.0, 40)
    exact = builtin._Candidate("exact", "linear", y.copy(), np.array([5.0, -1.0]), 1.0, 1.0)
    noise = builtin._Candidate("noise", "knn", rng.normal(size=40), np.array([9.0, 9.0]), 1.0, 1.0)
    pred = builtin._stack([exact, noise], y, num_classes=None, strength=1e-8)
    # Least squares puts weight 1 on "exact" and 0 on "noise": its test predictions come out.
    np.testing.assert_allclose(pred, [5.0, -1.0], atol=1e-6)
    labels = (y > 0).astype(np.int64)
    proba = np.stack([1.0 - (y > 0), (y > 0) * 1.0], axis=1) * 0.9 + 0.05
    cand = builtin._Candidate("c", "linear", proba, proba[:3], 1.0, 1.0)
    out = builtin._stack([cand], labels, num_classes=2, strength=1.0)
    assert out.shape == (3, 2) and np.allclose(out.sum(axis=1), 1.0)
    assert np.all(out >= 0.01 / 2 - 1e-12)  # Hedged like the entries.
    assert np.all(np.argmax(out, axis=1) == np.argmax(proba[:3], axis=1))


# Known failures, kept visible: on these small test sets (45 and 53 rows for iris and wine)
# log-loss is decided by a point or two, so ensembles tuned out-of-fold sit below lucky
# single models (iris) and the blend of five defaults lands high (both).
@pytest.mark.parametrize("task_id", [s.id for s in suite.suite_specs()])
def test_every_board_passes_its_checks(builtin_suite, task_id):
    if task_id in builtin.KNOWN_FAILING_BOARDS:
        pytest.xfail(f"{task_id}: board checks not met yet (see builtin.KNOWN_FAILING_BOARDS)")
    c = builtin.check_board(os.path.join(builtin_suite, task_id))
    assert c.passed, c.line()
    assert c.board_size >= 200
    assert c.sample <= 0.10 and 0.5 <= c.baseline <= 0.75 and c.ensemble >= 0.95


def test_known_failing_boards_still_fail(builtin_suite):
    # When one passes, drop it from builtin.KNOWN_FAILING_BOARDS.
    for task_id in builtin.KNOWN_FAILING_BOARDS:
        assert not builtin.check_board(os.path.join(builtin_suite, task_id)).passed, task_id


def test_seconds_file_lists_every_entry_with_positive_seconds(builtin_suite):
    for spec in suite.suite_specs():
        private = os.path.join(builtin_suite, spec.id, "private")
        seconds = _read(os.path.join(private, builtin.SECONDS_FILE))
        board = _read(os.path.join(private, "leaderboards", "private.csv"))
        assert [r["entry"] for r in seconds] == [r["entry"] for r in board]
        assert all(float(r["seconds"]) > 0.0 for r in seconds)


def test_rebuild_is_byte_identical_except_seconds(builtin_suite, tmp_path):
    (root,) = builtin.build(str(tmp_path), seed=0, workers=2, only=["iris"])
    cached = os.path.join(builtin_suite, "iris")
    assert _files(root) == _files(cached)
    rest = [f for f in _files(root) if not f.endswith(builtin.SECONDS_FILE)]
    _, mismatch, errors = filecmp.cmpfiles(root, cached, rest, shallow=False)
    assert not mismatch and not errors


def test_cached_suite_is_reused(builtin_suite):
    assert builtin.cached_suite(seed=0) == builtin_suite
    assert os.path.isdir(os.path.join(builtin_suite, "digits"))


def test_check_board_needs_baseline_and_ensembles(make_task):
    with pytest.raises(ValueError, match="lacks"):
        builtin.check_board(make_task())


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        builtin.main(["build", "--out", str(tmp_path), "--only", "iris,nope"])
    assert e.value.code == 2 and "unknown suite task ids ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        builtin.main(["build", "--out", str(tmp_path), "--workers", "0"])
    with pytest.raises(SystemExit):
        builtin.main(["build"])  # --out is required.
    with pytest.raises(ValueError, match="unknown suite task"):
        builtin.build(str(tmp_path), only=["nope"])
    with pytest.raises(ValueError, match="workers"):
        builtin.build(str(tmp_path), workers=0)
    assert not os.listdir(tmp_path)  # Nothing written on a bad request.


@pytest.mark.parametrize(
    "failing, seed, code",
    [((), 0, 0), (("iris",), 0, 0), (("iris", "digits"), 0, 1), (("iris",), 1, 1)],
)
def test_cli_fails_on_unexpected_board_failures(monkeypatch, capsys, failing, seed, code):
    ids = ["digits", "iris"]
    monkeypatch.setattr(builtin, "build", lambda out, **kw: [os.path.join(out, i) for i in ids])

    def check(path):
        name = os.path.basename(path)
        ok = name not in failing
        return builtin.BoardCheck(name, 234, 0.0, 0.6, 0.99, "ensemble_top1", True, ok, True)

    monkeypatch.setattr(builtin, "check_board", check)
    assert builtin.main(["build", "--out", "suite", "--seed", str(seed)]) == code
    out = capsys.readouterr().out
    known = len(failing) if seed == 0 else 0
    known -= "digits" in failing
    assert f"{len(failing)} boards fail ({known} known, {len(failing) - known} unexpected)" in out
    assert ("(known: KNOWN_FAILING_BOARDS)" in out) == (seed == 0 and "iris" in failing)


def _offset_board(baseline_offset: float):
    """Entries off the truth by constant offsets: RMSE = |offset| on any resample of the rows."""
    offsets = {f"single{k}": 1.0 + k for k in range(7)}  # RMSE 1..7; 10 entries in all.
    offsets |= {"ensemble_top0": 0.5, "ensemble_top1": 3.5, builtin.BASELINE_ENTRY: baseline_offset}
    y = np.linspace(-1.0, 1.0, 20)
    names = list(offsets)
    return names, [y + offsets[n] for n in names], y


@pytest.mark.parametrize("offset, want_baseline, ok", [(2.25, 0.65, 1.0), (0.75, 0.85, 0.0)])
def test_resampled_checks_on_a_board_that_resampling_cannot_move(offset, want_baseline, ok):
    names, preds, y = _offset_board(offset)
    score = lambda yt, p: float(np.sqrt(np.mean((p - yt) ** 2)))
    b, e = builtin.resampled_checks(
        names, preds, y, score=score, direction="lower", rule="mid_rank", resamples=30
    )
    assert b.shape == e.shape == (30,)
    np.testing.assert_allclose(b, want_baseline)  # (6 or 8 worse + half its own tie) / 10.
    np.testing.assert_allclose(e, 0.95)  # The best ensemble tops the board: (9 + 0.5) / 10.
    assert np.mean((b >= 0.5) & (b <= 0.75)) == ok


def test_resampled_checks_move_with_the_rows_and_skip_undefined_draws():
    rng = np.random.default_rng(0)
    y = (np.arange(12) < 2).astype(np.int64)  # AUC is undefined on draws without a positive.
    names = [builtin.BASELINE_ENTRY, "ensemble_top0", *(f"s{k}" for k in range(6))]
    preds = [rng.uniform(size=12) for _ in names]
    auc = lambda yt, p: float(sk_metrics.roc_auc_score(yt, p))
    b, e = builtin.resampled_checks(
        names, preds, y, score=auc, direction="higher", rule="mid_rank", resamples=200
    )
    assert 0 < len(b) < 200  # ~ (10/12)^12 = 11% of draws hold no positive row.
    assert len(np.unique(b)) > 3 and np.all((b >= 0) & (b <= 1)) and np.all((e >= 0) & (e <= 1))


def test_noise_refits_the_built_board(builtin_suite):
    (check,) = builtin.check_noise(["iris"], resamples=20)
    built = builtin.check_board(os.path.join(builtin_suite, "iris"))
    # The in-memory refit reproduces the written board's positions exactly.
    assert (check.baseline, check.ensemble) == (built.baseline, built.ensemble)
    assert check.task_id == "iris" and check.n_test == 45 and check.resamples == 20
    assert check.baseline_band[0] <= check.baseline_band[1] and 0 <= check.p_both <= 1
    assert check.p_both <= min(check.p_baseline, check.p_ensemble)
    assert "P(both)" in check.line()


def test_noise_cli(monkeypatch, capsys):
    seen = {}

    def fake(only, **kw):
        seen.update(only=only, **kw)
        return [builtin.NoiseCheck("iris", 45, 5, 0.8, (0.7, 0.9), 0.2, 0.8, (0.6, 1.0), 0.1, 0.0)]

    monkeypatch.setattr(builtin, "check_noise", fake)
    assert builtin.main(["noise", "--only", "iris", "--resamples", "5"]) == 0
    assert seen == {"only": ["iris"], "seed": 0, "workers": 2, "resamples": 5}
    assert "iris" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        builtin.main(["noise", "--resamples", "0"])
