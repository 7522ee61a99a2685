"""The Gaussian policy against a float64 numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.embodied import policy


def _numpy_log_prob(params, obs, actions):
    x = np.asarray(obs, np.float64)
    layers = [(np.asarray(w, np.float64), np.asarray(b, np.float64)) for w, b in params.layers]
    for w, b in layers[:-1]:
        x = np.tanh(x @ w + b)
    mean = x @ layers[-1][0] + layers[-1][1]
    std = np.exp(np.asarray(params.log_std, np.float64))
    z = (actions - mean) / std
    return np.sum(-0.5 * z**2 - np.log(std) - 0.5 * np.log(2 * np.pi), axis=-1)


@pytest.mark.parametrize("jit", [False, True])
def test_log_prob_matches_numpy(jit):
    params = policy.init_policy(jax.random.key(0), obs_dim=5, act_dim=3, hidden=(7, 6))
    # A non-trivial last layer and std, so the reference is not a near-constant.
    params = params._replace(
        layers=params.layers[:-1] + ((params.layers[-1][0] * 100, params.layers[-1][1] + 0.3),),
        log_std=jnp.array([-1.0, 0.0, 0.5]),
    )
    rng = np.random.default_rng(0)
    obs, actions = rng.normal(size=(4, 2, 5)), rng.normal(size=(4, 2, 3))
    fn = jax.jit(policy.log_prob) if jit else policy.log_prob
    np.testing.assert_allclose(
        fn(params, obs, actions), _numpy_log_prob(params, obs, actions), rtol=1e-5, atol=1e-5
    )


def test_sampled_log_prob_is_the_density_of_the_sample():
    params = policy.init_policy(jax.random.key(1), obs_dim=4, act_dim=2, init_log_std=-0.3)
    obs = jax.random.normal(jax.random.key(2), (64, 4))
    actions, logp = jax.jit(policy.sample_actions)(params, jax.random.key(3), obs)
    np.testing.assert_allclose(logp, policy.log_prob(params, obs, actions), rtol=1e-5, atol=1e-5)
    # The sample's spread is the configured std (64 x 2 draws: a loose 20%).
    residual = np.asarray(actions - policy.policy_mean(params, obs))
    assert abs(residual.std() / np.exp(-0.3) - 1) < 0.2


def test_bad_shapes_raise():
    params = policy.init_policy(jax.random.key(0), obs_dim=4, act_dim=2)
    with pytest.raises(ValueError, match="do not match"):
        policy.log_prob(params, jnp.zeros((3, 4)), jnp.zeros((3, 3)))
    with pytest.raises(ValueError, match=">= 1"):
        policy.init_policy(jax.random.key(0), obs_dim=0, act_dim=2)
