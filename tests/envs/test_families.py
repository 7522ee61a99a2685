"""The grown suite's families: splits by family, knobs that do what they say, determinism."""

import collections

import numpy as np
import pytest
from scipy import stats

from wmrl_jax.envs import families, suite
from wmrl_jax.envs.families import Knobs


def test_grown_suite_splits_by_family():
    core, grown = suite.suite_specs(), suite.suite_specs("grown")
    ids = lambda specs: [s.id for s in specs]
    assert ids(grown[: len(core)]) == ids(core) == ids(suite.suite_specs("core"))
    splits = collections.Counter(s.split for s in grown)
    assert splits["train"] >= 40 and splits["held-out"] >= 12
    assert len({s.id for s in grown}) == len(grown)
    split_of = {}
    for s in grown:
        assert split_of.setdefault(s.family, s.split) == s.split, s.family  # one split a family
    for f in families.families():
        if f.split == "held-out":
            assert split_of[f.related] == "train", f.name  # related, yet never trained on
        else:
            assert f.related is None
    assert suite.spec_by_id("parity_3").family == "parity"
    with pytest.raises(ValueError, match="unknown suite"):
        suite.suite_specs("huge")
    with pytest.raises(ValueError, match="unknown task family"):
        families.family_by_name("nope")


@pytest.mark.parametrize("family", [f.name for f in families.families()])
def test_every_task_generates_deterministically(family):
    f = families.family_by_name(family)
    for knobs in f.grid:
        x, y = f.make(7, knobs)
        again, other = f.make(7, knobs), f.make(8, knobs)
        np.testing.assert_array_equal(x, again[0])
        np.testing.assert_array_equal(y, again[1])
        assert not np.array_equal(x, other[0])
        assert x.shape == (len(y), knobs.features) and np.all(np.isfinite(x))
        if f.classification:
            assert set(np.unique(y)) == set(range(knobs.classes))
        else:
            assert np.all(np.isfinite(y)) and y.std() > 0


def test_knobs_do_what_they_say():
    hypercube = families.family_by_name("hypercube").make
    x, y = hypercube(0, Knobs(rows=800, features=10, minority=0.2))
    assert np.mean(y == 1) == pytest.approx(0.2, abs=0.01)
    spread = np.log10(x.std(axis=0))
    flat, wide = (
        hypercube(0, Knobs(features=10))[0],
        hypercube(0, Knobs(features=10, scale_decades=3.0))[0],
    )
    assert np.ptp(np.log10(flat.std(axis=0))) < 1.0 < np.ptp(np.log10(wide.std(axis=0)))
    assert np.isfinite(spread).all()
    additive = families.family_by_name("additive").make
    plain, skewed = additive(0, Knobs()), additive(0, Knobs(skew=1.0))
    assert abs(stats.skew(plain[1])) < 1.0 < stats.skew(skewed[1])
    # Label flips: with flip 0 the parity label is exactly the sign of the product.
    x, y = families.family_by_name("parity").make(0, Knobs(flip=0.0, order=3))
    np.testing.assert_array_equal(y, (x[:, :3].prod(axis=1) > 0).astype(int))
    _, noisy = families.family_by_name("parity").make(0, Knobs(flip=0.5, order=3))
    assert 0.15 < np.mean(noisy != y) < 0.35  # half re-drawn, half of those land the same
