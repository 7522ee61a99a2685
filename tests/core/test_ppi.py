"""Prediction-powered GRPO and reliability weighting (`wmrl_jax.core.ppi`).

Hand-built batches: a softmax policy over K candidates per task, one group per
task. Gradients are checked against a float64 numpy reference of the unclipped
surrogate at ratio 1, -(1/M) Σ_i A_i (e_{a_i} - p_task), M the rows in the loss.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import controlled as controlled_config
from wmrl_jax.core import grpo, ppi
from wmrl_jax.studies import controlled

B, G, K = 4, 3, 5
SETTINGS = {"decay": 1.0, "warmup_rows": 0.0}


def _batch(seed=0, b=B):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, K)).astype(np.float32)
    actions = rng.integers(0, K, (b, G)).astype(np.int32)
    real = rng.uniform(0, 1, (b, G)).astype(np.float32)
    wm = (0.6 * real + 0.2 + 0.1 * rng.normal(size=(b, G))).astype(np.float32)
    return logits, actions, real, wm


@jax.jit
def _grad(logits, actions, advantages, valid):
    """The GRPO loss's gradient w.r.t. the policy's logits, as the controlled study takes it."""

    def loss(logits):
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), actions, -1).reshape(-1, 1)
        return grpo.grpo_loss(
            logp, jax.lax.stop_gradient(logp), None, advantages.reshape(-1),
            valid.reshape(-1, 1),
        )[0]  # fmt: skip

    return jax.grad(loss)(logits)


def _ref_adv(rewards, mask):
    """float64 GRPO "std" advantages of one group, 0 on masked rows or a group under 2."""
    out = np.zeros(rewards.shape)
    if mask.sum() >= 2:
        x = rewards[mask].astype(np.float64)
        out[mask] = (x - x.mean()) / (x.std() + 1e-6)
    return out


def _ref_grad(logits, actions, adv, valid):
    p = np.exp(logits - logits.max(1, keepdims=True)).astype(np.float64)
    p /= p.sum(1, keepdims=True)
    grad = np.zeros(logits.shape)
    for b, i in itertools.product(range(logits.shape[0]), range(G)):
        if valid[b, i]:
            grad[b] -= adv[b, i] * (np.eye(K)[actions[b, i]] - p[b])
    return grad / valid.sum()


def _ppi(real, wm, anchor_groups, lam, weights=None, *, jit=False):
    """`ppi.advantages` with λ fixed to `lam` (a state whose regression coefficient is λ)."""
    fn = functools.partial(ppi.advantages, "ppi")
    fn = jax.jit(fn) if jit else fn
    b = real.shape[0]
    anchor = np.repeat(anchor_groups[:, None], G, 1)
    weights = np.ones((b, G), np.float32) if weights is None else np.repeat(weights[:, None], G, 1)
    state = ppi.ReliabilityState(*map(jnp.float32, (lam, 1.0, 1.0, 1.0)))
    return fn(
        state, fed=wm, valid=np.ones((b, G), bool), real=np.where(anchor, real, np.nan),
        wm=wm, anchor=anchor, weights=weights, **SETTINGS,
    )  # fmt: skip


def _anchors_only(real, anchor_groups):
    anchor = np.repeat(anchor_groups[:, None], G, 1)
    adv = jax.vmap(lambda r, m: grpo.group_advantages(r, mask=m))(np.where(anchor, real, 0), anchor)
    return adv, anchor


@pytest.mark.parametrize("jit", [False, True])
def test_effective_advantage_is_the_formula(jit):
    _, _, real, wm = _batch()
    groups = np.array([True, False, True, False])
    out = _ppi(real, wm, groups, 0.7, jit=jit)
    expected = np.zeros((B, G))
    for b in range(B):
        a_wm = _ref_adv(wm[b], np.ones(G, bool))
        a_real = _ref_adv(real[b], np.ones(G, bool)) if groups[b] else 0.0
        expected[b] = 0.7 * a_wm + (B / 2 if groups[b] else 0.0) * (a_real - 0.7 * a_wm)
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)
    assert float(out.lam) == pytest.approx(0.7)


@pytest.mark.parametrize("b", [4, 8])  # 1/π = b/2: a power of two, so the scaling is exact.
def test_lambda_zero_is_anchors_only_update_bit_for_bit(b):
    logits, actions, real, wm = _batch(1, b)
    groups = np.zeros(b, bool)
    groups[[0, b - 1]] = True
    out = _ppi(real, wm, groups, 0.0)
    adv, anchor = _anchors_only(real, groups)
    mine = _grad(logits, actions, out.advantages, np.ones((b, G), bool))
    theirs = _grad(logits, actions, adv, anchor)
    np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


def test_lambda_zero_is_anchors_only_update_to_rounding_when_inverse_pi_is_not_exact():
    logits, actions, real, wm = _batch(2, 8)
    groups = np.zeros(8, bool)
    groups[[1, 4, 6]] = True  # 1/π = 8/3 is rounded in float32
    out = _ppi(real, wm, groups, 0.0)
    adv, anchor = _anchors_only(real, groups)
    mine = _grad(logits, actions, out.advantages, np.ones((8, G), bool))
    theirs = _grad(logits, actions, adv, anchor)
    np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-8)


def test_lambda_zero_trains_as_anchors_only_in_the_controlled_study():
    """Same keys and rows: λ held at 0 (an unreachable warm-up) gives anchors_only's run.

    The two arms are two compiled programs, whose float32 may differ in the last bit
    (XLA fuses each its own way): the first gradients agree to an ulp, and Adam, which
    normalises every component, carries such a difference into the policy at ~1e-4
    after 20 steps. Bit for bit on one program: the tests above.
    """
    config = controlled_config.get_config("runlocal")
    with config.unlocked():
        config.tasks_per_step, config.anchor_fraction = 8, 0.25  # 2 of 8 groups: 1/π = 4
        config.num_steps = 20
        config.anchors.reliability.warmup_rows = 1e9
    key = jax.random.key(3)
    ppi_run = jax.jit(functools.partial(controlled.run_arm, config, "wmrl_ppi"))(key)
    base = jax.jit(functools.partial(controlled.run_arm, config, "anchors_only"))(key)
    assert np.all(np.asarray(ppi_run["reliability"]) == 0.0)
    np.testing.assert_array_equal(ppi_run["executions"], base["executions"])
    np.testing.assert_allclose(ppi_run["grad_error"][0], base["grad_error"][0], rtol=1e-6)
    np.testing.assert_allclose(ppi_run["true_reward"], base["true_reward"], atol=5e-4)
    other = jax.jit(functools.partial(controlled.run_arm, config, "wmrl"))(key)
    assert np.abs(np.asarray(other["true_reward"] - base["true_reward"])).max() > 5e-3


def test_world_model_equal_to_real_with_lambda_one_is_real_grpo_update():
    logits, actions, real, _ = _batch(4)
    groups = np.array([False, True, True, False])
    anchor = np.repeat(groups[:, None], G, 1)
    # λ is learnt, not set: with WM == real its regression coefficient is exactly 1.
    state = ppi.update(ppi.init(), *(_anchors_only(real, groups)[0],) * 2, anchor, decay=1.0)
    assert float(ppi.reliability(state, warmup_rows=0)) == 1.0
    out = ppi.advantages(
        "ppi", state, fed=real, valid=np.ones((B, G), bool), real=np.where(anchor, real, np.nan),
        wm=real, anchor=anchor, weights=anchor.astype(np.float32), **SETTINGS,
    )  # fmt: skip
    valid = np.ones((B, G), bool)
    # Real GRPO's advantages as the trainer forms them (`train.stages.advantages`).
    real_adv = jax.vmap(lambda r, m: grpo.group_advantages(r, mask=m))(real, valid)
    np.testing.assert_array_equal(np.asarray(out.advantages), np.asarray(real_adv))
    np.testing.assert_array_equal(
        np.asarray(_grad(logits, actions, out.advantages, valid)),
        np.asarray(_grad(logits, actions, real_adv, valid)),
    )


def _full_real_grad(logits, actions, real):
    adv = np.stack([_ref_adv(r, np.ones(G, bool)) for r in real])
    return _ref_grad(logits, actions, adv, np.ones(real.shape, bool))


def test_mean_over_all_uniform_anchor_draws_is_the_full_real_gradient():
    logits, actions, real, wm = _batch(5)
    valid = np.ones((B, G), bool)
    grads = []
    for chosen in itertools.combinations(range(B), 2):  # all 6 draws of 2 of 4 groups
        groups = np.isin(np.arange(B), chosen)
        grads.append(
            np.asarray(_grad(logits, actions, _ppi(real, wm, groups, 0.6).advantages, valid))
        )
    full = _full_real_grad(logits, actions, real)
    np.testing.assert_allclose(np.mean(grads, 0), full, atol=2e-6)  # float32 against float64
    assert np.abs(grads[0] - full).max() > 1e-2  # a single draw is not (the test can fail)


def test_inverse_pi_weights_keep_a_non_uniform_draw_unbiased():
    """One of three groups drawn with π = (0.5, 0.3, 0.2); weights (n/B)/π as `anchors.draw`."""
    logits, actions, real, wm = _batch(6, 3)
    pi = np.array([0.5, 0.3, 0.2])
    valid = np.ones((3, G), bool)
    expected = np.zeros((3, K))
    for g, p in enumerate(pi):
        groups = np.arange(3) == g
        weights = np.where(groups, (1 / 3) / pi, 0.0).astype(np.float32)
        adv = _ppi(real, wm, groups, 0.8, weights).advantages
        expected += p * np.asarray(_grad(logits, actions, adv, valid), np.float64)
    np.testing.assert_allclose(expected, _full_real_grad(logits, actions, real), atol=2e-6)


def _ref_state(steps, decay):
    cross = wm_sq = real_sq = rows = 0.0
    for a_real, a_wm, both in steps:
        a_real, a_wm = np.where(both, a_real, 0.0), np.where(both, a_wm, 0.0)
        cross = decay * cross + np.sum(a_real * a_wm)
        wm_sq = decay * wm_sq + np.sum(a_wm**2)
        real_sq = decay * real_sq + np.sum(a_real**2)
        rows = decay * rows + both.sum()
    return cross, wm_sq, real_sq, rows


def test_pure_noise_world_model_drives_lambda_to_zero():
    rng = np.random.default_rng(7)
    b, n = 20, 2
    state, steps, lams = ppi.init(), [], []
    update = jax.jit(functools.partial(ppi.advantages, "ppi", decay=0.95, warmup_rows=64.0))
    for _ in range(300):
        real = rng.uniform(0, 1, (b, G)).astype(np.float32)
        noise = rng.normal(size=(b, G)).astype(np.float32)  # knows nothing of `real`
        anchor = np.repeat(np.isin(np.arange(b), rng.choice(b, n, replace=False))[:, None], G, 1)
        out = update(
            state, fed=noise, valid=np.ones((b, G), bool), real=np.where(anchor, real, np.nan),
            wm=noise, anchor=anchor, weights=anchor.astype(np.float32),
        )  # fmt: skip
        a_real = np.stack([_ref_adv(r, m) for r, m in zip(real, anchor, strict=True)])
        a_wm = np.stack([_ref_adv(w, np.ones(G, bool)) for w in noise])
        steps.append((a_real, a_wm, anchor))
        state, lams = out.state, [*lams, float(out.lam)]
    np.testing.assert_allclose(state, _ref_state(steps, 0.95), rtol=1e-4)
    assert lams[:4] == [0.0] * 4  # warm-up: 16 anchor rows a step, 64 needed
    assert np.mean(lams[100:]) < 0.05 and np.max(lams[100:]) < 0.3


def test_a_faithful_world_model_gets_lambda_one_and_a_noisy_one_its_regression():
    rng = np.random.default_rng(8)
    state_exact = state_noisy = ppi.init()
    a_reals, a_noisys = [], []
    for _ in range(200):
        real = rng.normal(size=(10, G)).astype(np.float32)
        both = np.ones((10, G), bool)
        a_real = jax.vmap(grpo.group_advantages)(real)
        a_exact = jax.vmap(grpo.group_advantages)(2 * real + 1)  # monotone affine: same ranks
        a_noisy = jax.vmap(grpo.group_advantages)(real + rng.normal(size=(10, G)))
        state_exact = ppi.update(state_exact, a_real, a_exact, both, decay=1.0)
        state_noisy = ppi.update(state_noisy, a_real, a_noisy, both, decay=1.0)
        a_reals.append(np.asarray(a_real, np.float64))
        a_noisys.append(np.asarray(a_noisy, np.float64))
    assert float(ppi.reliability(state_exact, warmup_rows=0)) == pytest.approx(1.0, abs=1e-5)
    x, y = np.concatenate(a_noisys).ravel(), np.concatenate(a_reals).ravel()
    beta = np.sum(x * y) / np.sum(x * x)
    assert float(ppi.reliability(state_noisy, warmup_rows=0)) == pytest.approx(beta, rel=1e-4)
    r = np.sum(x * y) / np.sqrt(np.sum(x * x) * np.sum(y * y))
    assert float(ppi.correlation(state_noisy)) == pytest.approx(r, rel=1e-4)
    assert 0.3 < r < 0.9  # informative but noisy


def test_weighted_scales_only_world_model_groups():
    adv = jnp.array([[1.0, -1.0], [2.0, -2.0]])
    anchor = jnp.array([[True, True], [False, False]])
    assert ppi.weighted_advantages(adv, anchor, 0.25).tolist() == [[1.0, -1.0], [0.5, -0.5]]
    assert ppi.weighted_advantages(adv, anchor, 0.0).tolist() == [[1.0, -1.0], [0.0, 0.0]]


def test_effective_anchors_and_bad_estimator():
    # n_eff = 1 / ((1 - r²)/n + r²/B): r = 0.5, n = 2, B = 20 → 1 / (0.375 + 0.0125).
    assert float(ppi.effective_anchors(0.5, 2, 20)) == pytest.approx(1 / 0.3875)
    with pytest.raises(ValueError, match="estimator must be one of"):
        ppi.advantages(
            "nope", ppi.init(), fed=None, valid=None, real=None, wm=None, anchor=None,
            weights=None, decay=1.0, warmup_rows=0.0,
        )  # fmt: skip
