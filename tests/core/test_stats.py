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
