"""Masked statistics against numpy and scipy, jitted and not."""

import chex
import jax.numpy as jnp
import numpy as np
import scipy.stats

from wmrl_jax.core import stats


class StatsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_masked_mean(self):
        mean = self.variant(stats.masked_mean)
        x = jnp.array([1.0, 2.0, 9.0])
        assert float(mean(x, jnp.array([True, True, False]))) == 1.5
        assert np.isnan(float(mean(x, jnp.zeros(3, bool))))  # empty: NaN, not 0 / 0 warnings
        assert float(mean(x, jnp.zeros(3, bool), empty=0.0)) == 0.0

    @chex.variants(with_jit=True, without_jit=True)
    def test_rank_correlation_matches_scipy(self):
        rng = np.random.default_rng(5)
        x, y = rng.integers(0, 6, size=30).astype(float), rng.normal(size=30)  # With ties.
        mask = rng.random(30) < 0.7
        corr = self.variant(stats.rank_correlation)
        got = float(corr(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask)))
        np.testing.assert_allclose(got, scipy.stats.spearmanr(x[mask], y[mask])[0], rtol=1e-5)
        assert np.isnan(float(corr(jnp.ones(3), jnp.ones(3), jnp.ones(3, bool))))  # constant
        one = jnp.array([True, False, False])
        assert np.isnan(float(corr(jnp.arange(3.0), jnp.arange(3.0), one)))  # one entry


def _group_rank_reference(a, b, g):
    """Float64 reference: scipy's Spearman per group over the finite pairs, > 2 of them."""
    out = []
    for x, y in zip(a.reshape(-1, g), b.reshape(-1, g), strict=True):
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() > 2 and np.ptp(x[ok]) > 0 and np.ptp(y[ok]) > 0:
            out.append(scipy.stats.spearmanr(x[ok], y[ok])[0])
    return float(np.mean(out)) if out else float("nan")


def test_group_rank_correlation_matches_scipy_per_group():
    rng = np.random.default_rng(11)
    g = 6
    a = rng.integers(0, 4, size=20 * g).astype(float)  # ties within groups
    b = a + rng.normal(size=a.size)
    a[rng.random(a.size) < 0.25] = np.nan  # unscored entries leave their group
    b[3] = np.inf
    a[6:12] = 1.0  # a constant group is left out
    a[12:16] = np.nan  # a group with two entries left is left out
    got = float(stats.group_rank_correlation(a, b, g))
    np.testing.assert_allclose(got, _group_rank_reference(a, b, g), rtol=1e-5)
    assert np.isnan(float(stats.group_rank_correlation(np.full(6, np.nan), b[:6], g)))
    two = float(stats.group_rank_correlation(np.arange(4.0), np.arange(4.0), 2, min_count=2))
    assert two == 1.0


def test_group_rank_correlations_give_each_group_and_which_count():
    rng = np.random.default_rng(12)
    g = 5
    a = rng.normal(size=8 * g)
    b = a + rng.normal(size=a.size)
    a[5:10] = 2.0  # group 1: constant prediction
    b[10:15] = 0.5  # group 2: constant truth
    a[15:18] = np.nan  # group 3: two entries left
    corr, counted = map(np.asarray, stats.group_rank_correlations(a, b, g))
    assert corr.shape == counted.shape == (8,)
    np.testing.assert_array_equal(counted, [True, False, False, False, True, True, True, True])
    for i in np.flatnonzero(counted):
        x, y = a[i * g : (i + 1) * g], b[i * g : (i + 1) * g]
        np.testing.assert_allclose(corr[i], scipy.stats.spearmanr(x, y)[0], rtol=1e-5)
    assert np.isnan(corr[1]) and np.isnan(corr[2])
    # The mean over the counted groups is `group_rank_correlation`.
    mean = float(stats.group_rank_correlation(a, b, g))
    np.testing.assert_allclose(mean, corr[counted].mean(), rtol=1e-6)
