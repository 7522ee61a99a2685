"""The synthetic world model's copula: target within-group Spearman, exactness at q = 1."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from wmrl_jax.core import synthetic_wm as swm

# 4,000 groups of 8 (a GRPO group): the mean within-group Spearman has a standard error
# of about 0.005 here; the copula's own bias (fixed normal scores instead of Gaussian
# draws) measured at most 0.025, so 0.03 is the stated tolerance.
GROUPS, G, TOL = 4000, 8, 0.03


# q is traced: one compilation per shape, whatever the target.
_JITTED = jax.jit(swm.synthetic_predictions)


def _mean_spearman(pred: np.ndarray, truth: np.ndarray) -> float:
    """The independent reference: Spearman per group as the Pearson correlation of
    scipy's mean ranks, averaged over groups not constant on either side."""
    rp, rt = sps.rankdata(pred, axis=1), sps.rankdata(truth, axis=1)
    rp, rt = rp - rp.mean(axis=1, keepdims=True), rt - rt.mean(axis=1, keepdims=True)
    denom = np.sqrt((rp**2).sum(axis=1) * (rt**2).sum(axis=1))
    ok = denom > 0
    return float(np.mean((rp * rt).sum(axis=1)[ok] / denom[ok]))


def _truths(kind: str, rng) -> np.ndarray:
    if kind == "distinct":
        return rng.uniform(size=(GROUPS, G))
    # A concentrated policy: 8 draws with repeats from 4 programs per group.
    pool = rng.uniform(size=(GROUPS, 4))
    return np.take_along_axis(pool, rng.integers(0, 4, size=(GROUPS, G)), axis=1)


def _predict(x, q, *, missed=None, seed=1, jit=True):
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(x.shape)
    missed = np.zeros(x.shape, bool) if missed is None else missed
    args = (jnp.asarray(x, jnp.float32), jnp.ones(x.shape, bool), jnp.asarray(noise, jnp.float32),
            jnp.asarray(missed))  # fmt: skip
    mean, var = (_JITTED if jit else swm.synthetic_predictions)(*args, q=q)
    return np.asarray(mean, np.float64), np.asarray(var, np.float64)


def test_reference_agrees_with_scipy_spearmanr():
    rng = np.random.default_rng(5)
    a, b = rng.uniform(size=(3, 8)), rng.integers(0, 3, size=(3, 8)).astype(float)
    expected = np.mean([sps.spearmanr(x, y).statistic for x, y in zip(a, b, strict=True)])
    assert _mean_spearman(a, b) == pytest.approx(expected, abs=1e-12)


def test_copula_relation_by_hand():
    # rho_s = (6/pi) asin(rho/2), and its inverse, in float64 by hand.
    for rho in (0.0, 0.3, 0.5, 0.9, 1.0):
        expected = 6 / math.pi * math.asin(rho / 2)
        assert float(swm.population_spearman(rho)) == pytest.approx(expected, abs=1e-6)
        assert float(swm.population_pearson(expected)) == pytest.approx(rho, abs=1e-6)
    assert float(swm.population_pearson(1.0)) == pytest.approx(1.0, abs=1e-6)
    assert float(swm.population_pearson(0.0)) == 0.0


@pytest.mark.parametrize("kind", ["distinct", "ties"])
@pytest.mark.parametrize("q", [0.0, 0.2, 0.4, 0.6, 0.8])
def test_hits_the_target_within_group_spearman(kind, q):
    x = _truths(kind, np.random.default_rng(0))
    mean, _ = _predict(x, q)
    assert _mean_spearman(mean, x) == pytest.approx(q, abs=TOL)


def test_a_negative_target_ranks_backwards():
    x = _truths("distinct", np.random.default_rng(3))
    mean, _ = _predict(x, -0.6)
    assert _mean_spearman(mean, x) == pytest.approx(-0.6, abs=TOL)


@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_q_one_returns_the_distorted_truth_exactly(kind):
    x = _truths(kind, np.random.default_rng(2)) ** 3  # any monotone distortion of the truth
    mean, var = _predict(x, 1.0)
    np.testing.assert_allclose(mean, x, atol=1e-6)
    np.testing.assert_allclose(var, 1e-6)  # (1 - rho^2) Var(x) = 0, floored


def test_variance_is_the_noise_variance_of_the_group():
    x = np.array([[0.1, 0.2, 0.4, 0.8], [0.5, 0.5, 0.5, 0.9]])
    _, var = _predict(x, 0.4)
    rho = 2 * math.sin(math.pi * 0.4 / 6)
    np.testing.assert_allclose(var, (1 - rho**2) * x.var(axis=1, keepdims=True) * np.ones((1, 4)),
                               rtol=1e-5)  # fmt: skip


def test_jitted_and_not_agree_and_calls_are_deterministic():
    x = _truths("ties", np.random.default_rng(4))[:6]  # eager vmap is slow: a few groups
    a, va = _predict(x, 0.4, jit=True)
    b, vb = _predict(x, 0.4, jit=False)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(va, vb, rtol=1e-6)
    np.testing.assert_array_equal(_predict(x, 0.4)[0], a)


def test_a_missed_row_is_predicted_as_the_typical_program():
    # q = 1, no noise left: the missed row sits where u = 0 maps, the middle of the group.
    x = np.array([[-0.5, 0.1, 0.2, 0.3, 0.6]])
    missed = np.array([[True, False, False, False, False]])
    mean, _ = _predict(x, 1.0, missed=missed)
    np.testing.assert_allclose(mean[0, 1:], x[0, 1:], atol=1e-6)
    # Normal scores of ranks 0..4 are symmetric: u = 0 is the middle row's, x = 0.2.
    assert mean[0, 0] == pytest.approx(0.2, abs=1e-6)


def test_masked_rows_and_degenerate_groups():
    x = jnp.asarray([[0.3, 0.1, 0.9, 0.5], [0.4, 0.4, 0.4, 0.4], [0.7, 0.0, 0.0, 0.0]])
    mask = jnp.asarray([[True, True, True, False], [True] * 4, [True, False, False, False]])
    noise = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4)), jnp.float32)
    mean, var = _JITTED(x, mask, noise, jnp.zeros((3, 4), bool), q=0.3)
    mean, var = np.asarray(mean), np.asarray(var)
    assert np.isnan(mean[0, 3]) and np.isinf(var[0, 3])
    assert np.isfinite(mean[0, :3]).all()
    np.testing.assert_allclose(mean[1], 0.4, atol=1e-6)  # all equal: nothing to scramble
    assert mean[2, 0] == pytest.approx(0.7) and np.isnan(mean[2, 1:]).all()
