"""Fitting the built-in boards: the competitor population, out-of-fold predictions, the
written boards and their seconds, byte-identical rebuilds."""

import filecmp
import os

import numpy as np
import pytest
from sklearn import naive_bayes

from tests.envs.conftest import read_csv_rows, relative_files
from wmrl_jax.envs import boards, builtin, ensembles, ladder, suite

_read, _files = read_csv_rows, relative_files


@pytest.mark.parametrize("classification", [True, False])
def test_population_is_seeded_large_and_unique(classification):
    a = ladder.population(seed=3, classification=classification, n_train=300)
    b = ladder.population(seed=3, classification=classification, n_train=300)
    c = ladder.population(seed=4, classification=classification, n_train=300)
    names = [e.name for e in a]
    assert names == [e.name for e in b] and names != [e.name for e in c]
    # With the default blend and the tuned ensembles, boards hold over 200 entries.
    assert len(a) + 1 + ensembles.NUM_ENSEMBLES >= 200 and len(set(names)) == len(names)
    assert a[0].name == ("prior" if classification else "mean")
    assert sum(e.family == "default" for e in a) > ensembles.BLEND_TOP
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


def test_seconds_file_lists_every_entry_with_positive_seconds(builtin_suite):
    for spec in suite.suite_specs():
        private = os.path.join(builtin_suite, spec.id, "private")
        seconds = _read(os.path.join(private, boards.SECONDS_FILE))
        board = _read(os.path.join(private, "leaderboards", "private.csv"))
        assert [r["entry"] for r in seconds] == [r["entry"] for r in board]
        assert all(float(r["seconds"]) > 0.0 for r in seconds)


def test_rebuild_is_byte_identical_except_seconds(builtin_suite, tmp_path):
    (root,) = builtin.build(str(tmp_path), seed=0, workers=2, only=["iris"])
    cached = os.path.join(builtin_suite, "iris")
    assert _files(root) == _files(cached)
    rest = [f for f in _files(root) if not f.endswith(boards.SECONDS_FILE)]
    _, mismatch, errors = filecmp.cmpfiles(root, cached, rest, shallow=False)
    assert not mismatch and not errors
