"""Active anchors: inclusion probabilities, systematic draws, and an unbiased map under 1/π."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.core import anchors
from wmrl_jax.core.correction import make_reward_correction


def test_inclusion_probabilities_sum_to_k_and_cap_at_one():
    p = np.asarray(
        anchors.inclusion_probabilities(jnp.array([0.0, 1, 1, 50]), 2, uniform_share=0.1)
    )
    np.testing.assert_allclose(p.sum(), 2.0, rtol=1e-6)
    assert p[3] == pytest.approx(1.0)  # capped, the excess spread over the others
    np.testing.assert_allclose(p[1], p[2])
    assert p[0] == pytest.approx(1 / 3 * 0.1 / 4 / (0.1 / 4 + 0.9 / 52 * 2 / 2), rel=0.5)
    assert (p > 0).all()  # the uniform share keeps every group drawable
    flat = anchors.inclusion_probabilities(jnp.zeros(5), 2, uniform_share=0.3)
    np.testing.assert_allclose(np.asarray(flat), 0.4)  # no signal: the uniform draw
    with pytest.raises(ValueError, match="uniform_share"):
        anchors.inclusion_probabilities(jnp.ones(3), 1, uniform_share=0.0)
    with pytest.raises(ValueError, match="k must be"):
        anchors.inclusion_probabilities(jnp.ones(3), 4, uniform_share=0.5)


def test_systematic_sample_draws_exactly_k_with_the_given_marginals():
    probs = anchors.inclusion_probabilities(jnp.array([1.0, 2, 3, 4, 5, 6]), 3, uniform_share=0.2)
    masks = jax.vmap(lambda k: anchors.systematic_sample(k, probs))(
        jax.random.split(jax.random.key(1), 20_000)
    )
    masks = np.asarray(masks)
    assert (masks.sum(1) == 3).all()
    np.testing.assert_allclose(masks.mean(0), np.asarray(probs), atol=0.015)  # s.e. <= 0.0036


def _ipw_map_bias(weighted: bool, seed: int = 0) -> float:
    """Mean of g(x) − x over x in the overlap, after 60 steps of active anchors.

    Two tasks, equally common: the WM is exact on task A and optimistic by 0.3
    on task B, so over the batch E[r | r̂ = x] = x − 0.15 where both overlap.
    The active draw prefers task B's groups.
    """
    rng = np.random.default_rng(seed)
    c = make_reward_correction(capacity=1024, min_anchors=1)
    update = jax.jit(c.update)
    state = c.init()
    groups, g = 10, 8
    is_b = np.repeat(np.arange(groups) % 2 == 1, g)
    scores = jnp.where(jnp.arange(groups) % 2 == 1, 9.0, 1.0)
    for step in range(60):
        q = rng.uniform(size=groups * g)
        pred = np.where(is_b, q + 0.3, q).astype(np.float32)
        real = (q + 0.02 * rng.normal(size=q.shape)).astype(np.float32)
        drawn, weight = anchors.draw(
            jax.random.key(1000 * seed + step), scores, k=2, uniform_share=0.2
        )
        rows = np.repeat(np.asarray(drawn), g)
        w = np.repeat(np.asarray(weight), g) if weighted else np.ones(groups * g)
        _, state, _ = update(
            state, pred, np.ones_like(pred), np.where(rows, real, np.nan), rows,
            anchor_weight=w,
        )  # fmt: skip
    x = np.linspace(0.45, 0.95, 11, dtype=np.float32)
    return float(np.mean(np.asarray(c.debias(state, x)) - x))


def test_inverse_probability_weights_keep_the_map_unbiased_under_active_anchors():
    unweighted, weighted = _ipw_map_bias(False), _ipw_map_bias(True)
    # B's groups are drawn with π = 2(0.8·0.18 + 0.02) = 0.328 vs A's 0.072: 82% of the
    # anchors come from B, so the unweighted map is ≈ 0.82·0.3 = 0.25 low; 1/π restores 0.15.
    assert weighted == pytest.approx(-0.15, abs=0.03)
    assert unweighted < -0.21
