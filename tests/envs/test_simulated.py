"""Tests for the simulated research environment."""

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.envs import simulated


def test_env_shapes_and_blind_spots_on_poor_solutions():
    env = simulated.make_env(
        jax.random.key(0), num_tasks=50, num_candidates=20, blind_spot_fraction=0.5
    )
    assert env.quality.shape == env.blind_spot.shape == (50, 20)
    q, b = np.asarray(env.quality), np.asarray(env.blind_spot)
    assert ((q >= 0) & (q <= 1)).all()
    assert (b[q >= 0.5] == 0).all() and (b > 0).any()


def test_distortion_is_monotone_and_optimistic():
    spec = simulated.WorldModelSpec()
    q = jnp.linspace(0, 1, 101)
    d = np.asarray(simulated.distort(q, spec))
    assert (np.diff(d) >= 0).all()
    np.testing.assert_allclose(d[0], spec.offset)
    assert d.mean() > float(q.mean())  # The default WM is optimistic on average.


def test_noise_levels():
    q = jnp.full((20000,), 0.5)
    real = simulated.real_reward(jax.random.key(1), q, noise=0.1)
    np.testing.assert_allclose(float(jnp.std(real)), 0.1, rtol=0.05)
    spec = simulated.WorldModelSpec(noise=0.2)
    pred = simulated.wm_prediction(jax.random.key(2), q, jnp.zeros_like(q), spec)
    np.testing.assert_allclose(float(jnp.std(pred)), 0.2, rtol=0.05)
    np.testing.assert_allclose(
        float(jnp.mean(pred)), float(simulated.distort(0.5, spec)), atol=0.01
    )
