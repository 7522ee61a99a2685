"""Tests for wmrl_jax.core.grpo against hand-derived values and a float64 numpy reference.

Tests of the pure functions' values run jitted and not, through chex variants
(`VariantsTest`, a `chex.TestCase` that pytest collects like any other test).
"""

import doctest
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl_jax.core import grpo

# float32 arithmetic against a float64 reference.
RTOL = 1e-5
ATOL = 1e-6


# ----------------------------------------------------------------------------
# float64 numpy reference, written from the formulas, one loop per definition.


def ref_group_advantages(rewards, mode, eps=1e-6, mask=None):
    rewards = np.asarray(rewards, np.float64)
    mask = np.ones(rewards.shape, bool) if mask is None else np.asarray(mask, bool)
    out = np.zeros_like(rewards)
    valid = rewards[mask]
    if valid.size < 2:
        return out
    for i in np.flatnonzero(mask):
        if mode == "std":
            out[i] = (rewards[i] - valid.mean()) / (valid.std() + eps)
        elif mode == "mean":
            out[i] = rewards[i] - valid.mean()
        else:
            others = [rewards[j] for j in np.flatnonzero(mask) if j != i]
            out[i] = rewards[i] - np.mean(others)
    return out


def ref_surrogate(logp, old_logp, adv, clip_low, clip_high):
    ratio = np.exp(np.float64(logp) - np.float64(old_logp))
    adv = np.broadcast_to(np.float64(adv), ratio.shape)
    clipped_ratio = np.clip(ratio, 1 - clip_low, 1 + clip_high)
    return -np.minimum(ratio * adv, clipped_ratio * adv), ratio


def ref_kl(logp, ref_logp, estimator):
    d = np.float64(logp) - np.float64(ref_logp)
    return {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) + d - 1}[estimator]


def ref_aggregate(values, mask, mode, norm_constant=None):
    values, mask = np.float64(values), np.asarray(mask, bool)
    if mode == "token_mean":
        return values[mask].sum() / max(mask.sum(), 1)
    if mode == "seq_mean_token_mean":
        means = [v[m].mean() for v, m in zip(values, mask, strict=True) if m.any()]
        return float(np.mean(means)) if means else 0.0
    return sum(v[m].sum() for v, m in zip(values, mask, strict=True)) / (
        len(values) * norm_constant
    )


def random_batch(seed, b=4, t=6):
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
    old_logp = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    ref_logp = (logp + rng.normal(0, 0.5, (b, t))).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    lengths = rng.integers(0, t + 1, b)
    lengths[0] = t  # at least one full sequence
    mask = np.arange(t)[None] < lengths[:, None]
    return logp, old_logp, ref_logp, adv, mask


# ----------------------------------------------------------------------------
# group_advantages


def test_group_advantages_default_eps_is_in_the_denominator():
    adv = grpo.group_advantages(jnp.array([0.0, 2.0, 0.0, 2.0]))  # mean 1, std 1
    np.testing.assert_allclose(adv, np.array([-1.0, 1.0, -1.0, 1.0]) / (1.0 + 1e-6), rtol=1e-7)


@pytest.mark.parametrize("mode", grpo.ADVANTAGE_MODES)
def test_group_advantages_mask_excludes_members(mode):
    fn = functools.partial(grpo.group_advantages, mode=mode)
    # The masked reward is NaN (e.g. a failed prediction): it must not leak.
    adv = fn(jnp.array([1.0, jnp.nan, 3.0, 5.0]), mask=jnp.array([True, False, True, True]))
    expected = fn(jnp.array([1.0, 3.0, 5.0]))
    np.testing.assert_allclose(adv, [expected[0], 0.0, expected[1], expected[2]], rtol=RTOL)


@pytest.mark.parametrize("mode", grpo.ADVANTAGE_MODES)
def test_group_advantages_fewer_than_two_valid_members_is_zero(mode):
    one = grpo.group_advantages(jnp.array([3.0]), mode=mode)
    np.testing.assert_array_equal(one, [0.0])
    rewards = jnp.array([3.0, 7.0, 1.0, 2.0])
    masked = grpo.group_advantages(rewards, mode=mode, mask=jnp.array([0, 1, 0, 0], bool))
    np.testing.assert_array_equal(masked, np.zeros(4))
    empty = grpo.group_advantages(rewards, mode=mode, mask=jnp.zeros(4, bool))
    np.testing.assert_array_equal(empty, np.zeros(4))


@pytest.mark.parametrize("mode", grpo.ADVANTAGE_MODES)
def test_group_advantages_vmap_over_groups(mode):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(6, 8)).astype(np.float32)
    rewards[2] = 0.5  # an equal-reward group
    mask = rng.uniform(size=(6, 8)) > 0.3
    mask[3] = False  # an empty group
    fn = jax.jit(jax.vmap(functools.partial(grpo.group_advantages, mode=mode)))
    adv = fn(rewards, mask=mask)
    for g in range(6):
        np.testing.assert_allclose(
            adv[g], ref_group_advantages(rewards[g], mode, mask=mask[g]), rtol=RTOL, atol=1e-5
        )


_MAX_GROUP = 9


@functools.cache
def _jitted_advantages(mode):
    """One compiled function per mode, shared by every hypothesis example."""
    return jax.jit(functools.partial(grpo.group_advantages, mode=mode))


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(
        st.sampled_from([0.0, 0.25, 0.5, 1.0, -2.0, 3.5]), min_size=1, max_size=_MAX_GROUP
    ),
    mask_bits=st.integers(min_value=0, max_value=2**_MAX_GROUP - 1),
    mode=st.sampled_from(grpo.ADVANTAGE_MODES),
)
def test_group_advantages_matches_reference_with_ties(rewards, mask_bits, mode):
    # Groups are padded to a fixed size with NaN rewards under a false mask, so one
    # compiled function serves every example and padding is checked not to leak.
    mask = np.array([(mask_bits >> i) & 1 for i in range(_MAX_GROUP)], bool)
    mask[len(rewards) :] = False
    padded = np.full(_MAX_GROUP, np.nan, np.float32)
    padded[: len(rewards)] = rewards
    adv = _jitted_advantages(mode)(padded, mask=mask)
    expected = ref_group_advantages(np.nan_to_num(padded), mode, mask=mask)
    np.testing.assert_allclose(adv, expected, rtol=RTOL, atol=1e-5)


def test_group_advantages_float32_for_low_precision_input():
    adv = grpo.group_advantages(jnp.array([1.0, 2.0, 4.0, 8.0], jnp.bfloat16))
    assert adv.dtype == jnp.float32


# ----------------------------------------------------------------------------
# importance ratio and clipped surrogate


def test_clip_higher_is_asymmetric():
    logp = jnp.log(jnp.array([1.25, 1.25, 0.75, 1.35]))
    adv = jnp.array([1.0, -1.0, -1.0, 1.0])
    sym_loss, _, sym_clipped = grpo.clipped_surrogate(logp, jnp.zeros(4), adv, clip_low=0.2)
    dapo_loss, _, dapo_clipped = grpo.clipped_surrogate(
        logp, jnp.zeros(4), adv, clip_low=0.2, clip_high=0.28
    )
    # Upper bound 1.2 vs 1.28: 1.25 is clipped only in the symmetric case.
    np.testing.assert_allclose(sym_loss, [-1.2, 1.25, 0.8, -1.2], rtol=RTOL)
    np.testing.assert_allclose(dapo_loss, [-1.25, 1.25, 0.8, -1.28], rtol=RTOL)
    assert sym_clipped.tolist() == [True, False, True, True]
    # The lower bound stays at 0.8: ratio 0.75 with negative advantage is clipped in both.
    assert dapo_clipped.tolist() == [False, False, True, True]


# ----------------------------------------------------------------------------
# KL estimators

KL_FUNCTIONS = {"k1": grpo.kl_k1, "k2": grpo.kl_k2, "k3": grpo.kl_k3}


def test_kl_hand_values():
    logp, ref_logp = jnp.array([-1.0]), jnp.array([-1.0 - np.log(2.0)])  # pi/pi_ref = 2
    np.testing.assert_allclose(grpo.kl_k1(logp, ref_logp), [np.log(2.0)], rtol=RTOL)
    np.testing.assert_allclose(grpo.kl_k2(logp, ref_logp), [0.5 * np.log(2.0) ** 2], rtol=RTOL)
    np.testing.assert_allclose(grpo.kl_k3(logp, ref_logp), [0.5 - 1.0 + np.log(2.0)], rtol=RTOL)


def test_k3_nonnegative_and_finite_at_extremes():
    rng = np.random.default_rng(4)
    logp = np.concatenate([rng.normal(0, 5, 1000), [0.0, -1000.0, -50.0, 0.0]]).astype(np.float32)
    ref_logp = np.concatenate([rng.normal(0, 5, 1000), [-1000.0, 0.0, 0.0, -50.0]])
    ref_logp = ref_logp.astype(np.float32)

    @jax.jit
    def values_and_grad(lp):
        return grpo.kl_k3(lp, ref_logp), jax.grad(lambda x: jnp.sum(grpo.kl_k3(x, ref_logp)))(lp)

    k3, grad = values_and_grad(logp)
    assert np.all(np.isfinite(k3)) and np.all(k3 >= 0.0)
    assert np.all(np.isfinite(grad))


def _expected_grad(estimator, logits, ref_logp_all):
    """Exact E_{x~pi}[grad k(x)] on a categorical: sample weights are not differentiated."""

    def objective(theta):
        logp_all = jax.nn.log_softmax(theta)
        probs = jax.lax.stop_gradient(jnp.exp(logp_all))
        return jnp.sum(probs * KL_FUNCTIONS[estimator](logp_all, ref_logp_all))

    return jax.jit(jax.grad(objective))(logits)


def test_expected_kl_gradients_on_exact_categorical():
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.normal(size=7), jnp.float32)
    ref_logp_all = jax.nn.log_softmax(jnp.asarray(rng.normal(size=7), jnp.float32))

    def forward_kl(theta):  # KL(pi || pi_ref)
        logp_all = jax.nn.log_softmax(theta)
        return jnp.sum(jnp.exp(logp_all) * (logp_all - ref_logp_all))

    def reverse_kl(theta):  # KL(pi_ref || pi)
        return jnp.sum(jnp.exp(ref_logp_all) * (ref_logp_all - jax.nn.log_softmax(theta)))

    # k1 and k3 are unbiased for KL(pi || pi_ref) ...
    logp_all = jax.nn.log_softmax(logits)
    for estimator in ("k1", "k3"):
        expectation = jnp.sum(jnp.exp(logp_all) * KL_FUNCTIONS[estimator](logp_all, ref_logp_all))
        np.testing.assert_allclose(expectation, forward_kl(logits), rtol=1e-5)
    # ... but by the score-function identity k1 as a loss has zero expected gradient.
    np.testing.assert_allclose(_expected_grad("k1", logits, ref_logp_all), 0.0, atol=1e-6)
    grad_k3 = _expected_grad("k3", logits, ref_logp_all)
    assert np.linalg.norm(grad_k3) > 0.1
    np.testing.assert_allclose(grad_k3, jax.grad(reverse_kl)(logits), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        _expected_grad("k2", logits, ref_logp_all),
        jax.grad(forward_kl)(logits),
        rtol=1e-4,
        atol=1e-6,
    )


# ----------------------------------------------------------------------------
# aggregate


@pytest.mark.parametrize("mode", grpo.AGGREGATION_MODES)
def test_aggregate_empty_mask_and_nan_padding(mode):
    kw = {"norm_constant": 3.0} if mode == "seq_sum_norm" else {}
    values = jnp.array([[jnp.nan, jnp.inf, 1.0], [2.0, -jnp.inf, jnp.nan]])
    empty = grpo.aggregate(values, jnp.zeros((2, 3), bool), mode=mode, **kw)
    assert float(empty) == 0.0
    mask = jnp.array([[0, 0, 1], [1, 0, 0]], bool)
    out = grpo.aggregate(values, mask, mode=mode, **kw)
    np.testing.assert_allclose(out, ref_aggregate(np.nan_to_num(values), mask, mode, 3.0))
    grad = jax.grad(lambda v: grpo.aggregate(v, mask, mode=mode, **kw))(values)
    assert np.all(np.isfinite(grad))


# ----------------------------------------------------------------------------
# grpo_loss


def ref_grpo_loss(logp, old_logp, ref_logp, adv, mask, clip_low, clip_high, kl_coef, est, agg):
    pg, ratio = ref_surrogate(logp, old_logp, adv[:, None], clip_low, clip_high)
    kl = ref_kl(logp, ref_logp, est)
    loss = ref_aggregate(pg + kl_coef * kl, mask, agg, norm_constant=logp.shape[1])
    clipped = ratio != np.clip(ratio, 1 - clip_low, 1 + clip_high)
    clipped &= np.sign(ratio - 1) == np.sign(adv[:, None])
    metrics = {
        "loss": loss,
        "pg_loss": pg[mask].mean(),
        "kl": kl[mask].mean(),
        "clip_frac": clipped[mask].mean(),
        "ratio_mean": ratio[mask].mean(),
        "ratio_min": ratio[mask].min(),
        "ratio_max": ratio[mask].max(),
        "adv_mean": np.broadcast_to(adv[:, None], mask.shape)[mask].mean(),
    }
    return loss, metrics


def test_grpo_loss_equal_rewards_pipeline_has_finite_grads():
    logp, old_logp, ref_logp, _, mask = random_batch(9, b=6, t=5)
    rewards = jnp.array([[1.0, 1.0, 1.0], [0.3, 0.7, 0.2]])  # two groups; the first is flat

    @jax.jit
    @functools.partial(jax.value_and_grad, argnums=(0, 1), has_aux=True)
    def loss_and_grads(logp, rewards):
        adv = jax.vmap(grpo.group_advantages)(rewards).reshape(-1)
        return grpo.grpo_loss(logp, old_logp, ref_logp, adv, mask, kl_coef=0.1)

    (loss, metrics), (grad_logp, grad_rewards) = loss_and_grads(logp, rewards)
    assert np.isfinite(loss) and all(np.isfinite(v) for v in metrics.values())
    assert np.all(np.isfinite(grad_logp)) and np.all(np.isfinite(grad_rewards))
    # Advantages are constants of the objective, and the flat group has none.
    np.testing.assert_array_equal(grad_rewards, 0.0)
    assert np.all(grad_logp[:3][mask[:3]] != 0.0)  # the KL term still acts on the flat group


def test_grpo_loss_empty_mask_and_garbage_padding():
    logp, old_logp, ref_logp, adv, mask = random_batch(10)
    pad = ~mask
    logp = np.where(pad, np.nan, logp).astype(np.float32)
    old_logp = np.where(pad, -np.inf, old_logp).astype(np.float32)
    ref_logp = np.where(pad, 1e30, ref_logp).astype(np.float32)
    # Every aggregation is checked on empty masks in the `aggregate` tests; this one
    # has the most divisions.
    loss_fn = functools.partial(grpo.grpo_loss, kl_coef=0.1, aggregation="seq_mean_token_mean")
    loss_and_grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))

    (loss, metrics), grad = loss_and_grad(logp, old_logp, ref_logp, adv, mask)
    assert np.isfinite(loss) and all(np.isfinite(v) for v in metrics.values())
    assert np.all(np.isfinite(grad)) and np.all(grad[pad] == 0.0)
    (loss, metrics), grad = loss_and_grad(logp, old_logp, ref_logp, adv, np.zeros_like(mask))
    assert float(loss) == 0.0
    assert all(np.isfinite(v) for v in metrics.values())
    assert float(metrics["ratio_min"]) == float(metrics["ratio_max"]) == 1.0
    np.testing.assert_array_equal(grad, 0.0)


def test_grpo_loss_without_reference_and_low_precision_inputs():
    logp, old_logp, _, adv, mask = random_batch(11)
    loss, metrics = grpo.grpo_loss(
        jnp.asarray(logp, jnp.bfloat16), old_logp, None, jnp.asarray(adv, jnp.bfloat16), mask
    )
    assert loss.dtype == jnp.float32 and float(metrics["kl"]) == 0.0
    grad_fn = jax.jit(jax.grad(lambda lp: grpo.grpo_loss(lp, old_logp, None, adv, mask)[0]))
    grad = grad_fn(jnp.asarray(logp, jnp.bfloat16))
    assert grad.dtype == jnp.bfloat16 and np.all(np.isfinite(np.float32(grad)))


def test_no_recompilation_on_new_values():
    traces = []

    def counted(*args):
        traces.append(1)
        return grpo.grpo_loss(*args, kl_coef=0.1)

    loss_fn = jax.jit(counted)
    adv_fn = jax.jit(jax.vmap(functools.partial(grpo.group_advantages, mode="std")))
    for seed in range(3):
        logp, old_logp, ref_logp, adv, mask = random_batch(seed)
        loss_fn(logp, old_logp, ref_logp, adv, mask)
        adv_fn(np.random.default_rng(seed).normal(size=(2, 4)).astype(np.float32))
    assert len(traces) == 1
    assert loss_fn._cache_size() == 1 and adv_fn._cache_size() == 1


# ----------------------------------------------------------------------------
# Values, jitted and not.


class VariantsTest(chex.TestCase):
    """Every pure function's values, with and without `jax.jit` (chex variants)."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        # mean 2.5, population std sqrt(1.25).
        ("std", "std", [-1.5 / 1.25**0.5, -0.5 / 1.25**0.5, 0.5 / 1.25**0.5, 1.5 / 1.25**0.5]),
        ("mean", "mean", [-1.5, -0.5, 0.5, 1.5]),
        # 1 - mean(2,3,4), 2 - mean(1,3,4), 3 - mean(1,2,4), 4 - mean(1,2,3).
        ("loo", "loo", [-2.0, -2.0 / 3.0, 2.0 / 3.0, 2.0]),
    )
    def test_group_advantages_hand_values(self, mode, expected):
        fn = self.variant(functools.partial(grpo.group_advantages, mode=mode, eps=0.0))
        adv = fn(jnp.array([1.0, 2.0, 3.0, 4.0]))
        assert adv.dtype == jnp.float32
        np.testing.assert_allclose(adv, expected, rtol=RTOL)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*grpo.ADVANTAGE_MODES)
    def test_group_advantages_equal_rewards_exact_zeros_finite_grads(self, mode):
        # eps=0: the zero-variance guard must not rely on eps.
        advantages = functools.partial(grpo.group_advantages, mode=mode, eps=0.0)
        fn, jac_fn = self.variant(advantages), self.variant(jax.jacobian(advantages))
        # sum(7 * [0.1]) / 7 != 0.1 in float32: a plain mean leaves ulp-sized residues,
        # which "std" mode would blow up to O(1) advantages.
        for value in [0.1, -3.7, 0.3, 1e6 + 0.1]:
            rewards = jnp.full((7,), value, jnp.float32)
            np.testing.assert_array_equal(fn(rewards), np.zeros(7))
            assert np.all(np.isfinite(jac_fn(rewards)))

    @chex.variants(with_jit=True, without_jit=True)
    def test_importance_ratio(self):
        fn = self.variant(grpo.importance_ratio)
        logp, old_logp, *_ = random_batch(1)
        ratio = fn(logp.astype(jnp.bfloat16), old_logp)
        assert ratio.dtype == jnp.float32
        np.testing.assert_allclose(
            fn(logp, old_logp), np.exp(np.float64(logp) - old_logp), rtol=RTOL
        )

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        # Above 1 + 0.2, positive advantage: capped at 1.2.
        ("above_positive", 1.5, 1.0, -1.2, True),
        # Above, negative advantage: the unclipped branch is the min.
        ("above_negative", 1.5, -1.0, 1.5, False),
        # Below 1 - 0.2, positive advantage: unclipped.
        ("below_positive", 0.5, 1.0, -0.5, False),
        # Below, negative advantage: floored at 0.8.
        ("below_negative", 0.5, -1.0, 0.8, True),
        ("inside", 1.1, 2.0, -2.2, False),
        ("zero_advantage", 1.5, 0.0, 0.0, False),  # never "clipped"
    )
    def test_clipped_surrogate_hand_values(self, ratio, adv, expected_loss, expected_clipped):
        fn = self.variant(functools.partial(grpo.clipped_surrogate, clip_low=0.2))
        loss, out_ratio, clipped = fn(jnp.log(jnp.array([ratio])), jnp.zeros(1), jnp.array([adv]))
        np.testing.assert_allclose(loss, [expected_loss], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(out_ratio, [ratio], rtol=RTOL)
        assert clipped.tolist() == [expected_clipped]

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("per_seq", "per_token", "scalar")
    def test_clipped_surrogate_matches_reference(self, adv_shape):
        fn = self.variant(functools.partial(grpo.clipped_surrogate, clip_low=0.2, clip_high=0.3))
        grad_fn = self.variant(
            jax.grad(
                lambda lp, old, a: jnp.sum(grpo.clipped_surrogate(lp, old, a, clip_high=0.3)[0])
            )
        )
        for seed in range(3):
            logp, old_logp, _, adv, _ = random_batch(seed)
            adv = {
                "per_seq": adv[:, None],
                "per_token": np.random.default_rng(seed).normal(size=logp.shape),
                "scalar": np.float32(0.7),
            }[adv_shape]
            loss, ratio, clipped = fn(logp, old_logp, adv)
            expected_loss, expected_ratio = ref_surrogate(logp, old_logp, adv, 0.2, 0.3)
            np.testing.assert_allclose(loss, expected_loss, rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(ratio, expected_ratio, rtol=RTOL)
            # The clipped branch is active exactly where the per-token gradient is zero.
            grad = np.asarray(grad_fn(logp, old_logp, adv))
            clipped = np.asarray(clipped)
            np.testing.assert_array_equal(grad[clipped], 0.0)
            expected_grad = -expected_ratio * np.broadcast_to(adv, logp.shape)
            np.testing.assert_allclose(
                grad[~clipped], expected_grad[~clipped], rtol=1e-4, atol=ATOL
            )

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*grpo.KL_ESTIMATORS)
    def test_kl_estimators_match_reference_and_vanish_at_equality(self, estimator):
        fn = self.variant(KL_FUNCTIONS[estimator])
        logp, _, ref_logp, *_ = random_batch(3)
        np.testing.assert_allclose(
            fn(logp, ref_logp), ref_kl(logp, ref_logp, estimator), rtol=1e-4, atol=1e-6
        )
        np.testing.assert_array_equal(fn(logp, logp), np.zeros_like(logp))

    @chex.variants(with_jit=True, without_jit=True)
    def test_aggregate_hand_values(self):
        values = jnp.array([[1.0, 3.0, 100.0], [5.0, 100.0, 100.0], [100.0, 100.0, 100.0]])
        mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)

        def agg(mode, **kw):
            return float(
                self.variant(functools.partial(grpo.aggregate, mode=mode, **kw))(values, mask)
            )

        assert agg("token_mean") == pytest.approx(3.0)  # (1 + 3 + 5) / 3
        assert agg("seq_mean_token_mean") == pytest.approx(3.5)  # mean(2, 5), empty row skipped
        assert agg("seq_sum_norm", norm_constant=4.0) == pytest.approx(9.0 / 12.0)  # 9 / (3 * 4)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*grpo.AGGREGATION_MODES)
    def test_aggregate_matches_reference(self, mode):
        kw = {"norm_constant": 6.0} if mode == "seq_sum_norm" else {}
        fn = self.variant(functools.partial(grpo.aggregate, mode=mode, **kw))
        for seed in range(3):
            logp, _, _, _, mask = random_batch(seed)
            np.testing.assert_allclose(
                fn(logp, mask), ref_aggregate(logp, mask, mode, 6.0), rtol=RTOL
            )

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(
        ("k3", "token_mean"), ("k1", "seq_mean_token_mean"), ("k2", "seq_sum_norm")
    )
    def test_grpo_loss_matches_reference(self, estimator, aggregation):
        logp, old_logp, ref_logp, adv, mask = random_batch(7)
        loss_fn = functools.partial(
            grpo.grpo_loss,
            clip_low=0.2,
            clip_high=0.28,
            kl_coef=0.05,
            kl_estimator=estimator,
            aggregation=aggregation,
            norm_constant=6.0,
        )
        loss, metrics = self.variant(loss_fn)(logp, old_logp, ref_logp, adv, mask)
        expected_loss, expected_metrics = ref_grpo_loss(
            logp, old_logp, ref_logp, adv, mask, 0.2, 0.28, 0.05, estimator, aggregation
        )
        np.testing.assert_allclose(loss, expected_loss, rtol=RTOL, atol=ATOL)
        assert set(metrics) == set(expected_metrics)
        for name, value in metrics.items():
            assert value.shape == () and value.dtype == jnp.float32, name
            np.testing.assert_allclose(
                value, expected_metrics[name], rtol=RTOL, atol=ATOL, err_msg=name
            )
        assert 0.0 < float(metrics["clip_frac"]) < 1.0  # the random batch exercises both branches
        if aggregation == "token_mean":
            np.testing.assert_allclose(loss, metrics["pg_loss"] + 0.05 * metrics["kl"], rtol=RTOL)


# ----------------------------------------------------------------------------
# error paths and docstring examples

_V = jnp.zeros((2, 3))
_M = jnp.ones((2, 3), bool)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: grpo.group_advantages(jnp.zeros((2, 3))), "`rewards` is one group"),
        (lambda: grpo.group_advantages(jnp.zeros(0)), "`rewards` needs at least one"),
        (lambda: grpo.group_advantages(jnp.zeros(3), mode="median"), "Unknown advantage mode"),
        (lambda: grpo.group_advantages(jnp.zeros(3), eps=-1.0), "eps"),
        (
            lambda: grpo.group_advantages(jnp.zeros(3), mask=jnp.ones(4, bool)),
            "`rewards` and `mask`",
        ),
        (lambda: grpo.importance_ratio(jnp.zeros(3), jnp.zeros(4)), "`logp` and `old_logp`"),
        (lambda: grpo.clipped_surrogate(_V, _V, jnp.zeros(2)), "`advantages` must broadcast"),
        (lambda: grpo.clipped_surrogate(_V, _V, jnp.zeros((2, 1)), clip_low=1.5), "clip_low"),
        (lambda: grpo.clipped_surrogate(_V, _V, 1.0, clip_high=-0.1), "clip_high"),
        (lambda: grpo.kl_k3(jnp.zeros(3), jnp.zeros((3, 1))), "kl_k3: `logp` and `ref_logp`"),
        (lambda: grpo.aggregate(jnp.zeros(3), jnp.ones(3, bool)), r"`values` is \[B, T\]"),
        (lambda: grpo.aggregate(_V, jnp.ones((3, 2), bool)), "`values` and `mask`"),
        (lambda: grpo.aggregate(_V, _M, mode="sum"), "Unknown aggregation mode"),
        (lambda: grpo.aggregate(_V, _M, mode="seq_sum_norm"), "requires norm_constant"),
        (lambda: grpo.aggregate(_V, _M, mode="seq_sum_norm", norm_constant=0), "positive"),
        (lambda: grpo.grpo_loss(jnp.zeros(3), jnp.zeros(3), None, 0.0, _M), r"`logp` is \[B, T\]"),
        (lambda: grpo.grpo_loss(_V, _V, None, jnp.zeros(3), _M), r"`advantages` is \[B\]"),
        (lambda: grpo.grpo_loss(_V, _V, None, jnp.zeros((2, 1)), _M), r"`advantages` is \[B\]"),
        (
            lambda: grpo.grpo_loss(_V, jnp.zeros((2, 4)), None, jnp.zeros(2), _M),
            "`old_logp` and `mask`",
        ),
        (lambda: grpo.grpo_loss(_V, _V, _V, jnp.zeros(2), _M[:1]), "`old_logp` and `mask`"),
        (lambda: grpo.grpo_loss(_V, _V, None, jnp.zeros(2), _M, kl_coef=0.1), "ref_logp"),
        (lambda: grpo.grpo_loss(_V, _V, _V, jnp.zeros(2), _M, kl_estimator="k4"), "kl_estimator"),
        (
            lambda: grpo.grpo_loss(_V, _V, _V, jnp.zeros(2), _M, aggregation="seq_sum_norm"),
            "requires norm_constant",
        ),
    ],
)
def test_errors(call, message):
    # Shape errors too are ValueError (chex assertions raise AssertionError by default).
    with pytest.raises(ValueError, match=message):
        call()


def test_docstring_examples():
    result = doctest.testmod(grpo, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
