"""The adaptive anchor fraction against a float64 reference of its moving averages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.core import rho


def _reference(mses, halflife):
    """Bias-corrected EMA: Σ α^(n−1−i) (1−α) x_i / (1 − αⁿ), in float64."""
    a = 0.5 ** (1.0 / halflife)
    n = len(mses)
    w = (1 - a) * a ** np.arange(n - 1, -1, -1, dtype=np.float64)
    return float(np.sum(w * np.asarray(mses, np.float64)) / (1 - a**n))


def test_moving_averages_match_the_float64_reference():
    rng = np.random.default_rng(0)
    update = jax.jit(lambda s, e, m: rho.update(s, e, m, fast_halflife=3.0, slow_halflife=40.0))
    state, mses = rho.init(), []
    for step in range(30):
        errors = rng.normal(0, 0.05 + 0.01 * step, size=16).astype(np.float32)
        mask = rng.random(16) < 0.6
        if step == 7:
            mask[:] = False  # a step without anchors leaves the state as it was
        errors[~mask & (rng.random(16) < 0.5)] = np.nan  # masked rows may hold anything
        before = state
        state = update(state, jnp.asarray(errors), jnp.asarray(mask))
        if mask.any():
            mses.append(np.mean(errors[mask].astype(np.float64) ** 2))
        else:
            jax.tree.map(np.testing.assert_array_equal, state, before)
    fast, slow = rho.errors(state)
    np.testing.assert_allclose(float(fast), _reference(mses, 3.0), rtol=1e-5)
    np.testing.assert_allclose(float(slow), _reference(mses, 40.0), rtol=1e-5)
    assert int(state.steps) == len(mses)


def test_fraction_follows_the_drift_within_bounds():
    kw = dict(fast_halflife=2.0, slow_halflife=50.0)
    frac = dict(base=0.1, low=0.025, high=0.3, gain=1.0, warmup_steps=5)
    state = rho.init()
    assert float(rho.fraction(state, **frac)) == pytest.approx(0.1)  # nothing measured yet
    for _ in range(20):  # a stable error: ρ stays at its base
        state = rho.update(state, jnp.full(8, 0.1), jnp.ones(8, bool), **kw)
    assert float(rho.fraction(state, **frac)) == pytest.approx(0.1, rel=1e-5)
    rising = state
    for _ in range(3):  # the error doubles: more anchors, the ratio of the two averages
        rising = rho.update(rising, jnp.full(8, 0.1 * np.sqrt(2)), jnp.ones(8, bool), **kw)
    fast, slow = rho.errors(rising)
    assert float(rho.fraction(rising, **frac)) == pytest.approx(0.1 * float(fast / slow))
    assert float(rho.fraction(rising, **frac)) > 0.14
    falling = state
    for _ in range(10):  # the error vanishes: down to the floor
        falling = rho.update(falling, jnp.full(8, 0.001), jnp.ones(8, bool), **kw)
    assert float(rho.fraction(falling, **frac)) == pytest.approx(0.025)
    hot = dict(frac, gain=4.0)
    assert float(rho.fraction(rising, **hot)) == pytest.approx(0.3)  # capped
    cold = dict(frac, warmup_steps=100)
    assert float(rho.fraction(rising, **cold)) == pytest.approx(0.1)  # still warming up


def test_num_groups_is_unbiased_and_bounded():
    keys = jax.random.split(jax.random.key(0), 4000)
    for r, total in ((0.25, 10), (0.1, 10), (0.0, 10), (1.0, 6), (0.37, 3)):
        draw = jax.vmap(rho.num_groups, in_axes=(0, None, None))
        counts = np.asarray(draw(keys, jnp.float32(r), total))
        assert counts.min() >= np.floor(r * total) and counts.max() <= np.ceil(r * total)
        np.testing.assert_allclose(counts.mean(), r * total, atol=4 * 0.5 / np.sqrt(4000))
