"""Tests for the WMRL reward correction against independent references."""

import chex
import jax
import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from wmrl_jax.core import correction as correction_lib


def _step(c, state, pred, real, anchor, **kw):
    pred = np.asarray(pred, np.float32)
    real = np.where(anchor, np.asarray(real, np.float32), np.nan)
    return c.update(state, pred, np.ones_like(pred), real, np.asarray(anchor), **kw)


def _sim(rng, n, anchor_frac=0.3, wm_noise=0.05, real_noise=0.05):
    true = rng.random(n).astype(np.float32)
    pred = 0.2 + 0.7 * true**2 + wm_noise * rng.normal(size=n)
    real = true + real_noise * rng.normal(size=n)
    anchor = rng.random(n) < anchor_frac
    return true, pred.astype(np.float32), real.astype(np.float32), anchor


class VariantsTest(chex.TestCase):
    """The correction's values, with and without `jax.jit` (chex variants)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_debiased_rewards_match_sklearn_on_buffer(self):
        rng = np.random.default_rng(0)
        c = correction_lib.make_reward_correction(capacity=64, ivd=False, use_real=False)
        update = self.variant(c.update)
        state = c.init()
        preds, reals = [], []
        for _ in range(4):
            _, pred, real, anchor = _sim(rng, 40)
            rewards, state, _ = update(
                state, pred, np.ones(40, np.float32), np.where(anchor, real, np.nan), anchor
            )
            preds.append(pred[anchor])
            reals.append(real[anchor])
        ref = IsotonicRegression(out_of_bounds="clip").fit(
            np.concatenate(preds), np.concatenate(reals)
        )
        # With ivd and use_real off, every reward is the map applied to the prediction.
        np.testing.assert_allclose(rewards, ref.predict(pred), rtol=1e-5, atol=1e-5)
        debiased = self.variant(c.debias)(state, pred)
        np.testing.assert_allclose(debiased, ref.predict(pred), rtol=1e-5, atol=1e-5)


def test_ring_buffer_keeps_last_capacity_anchors():
    c = correction_lib.make_reward_correction(capacity=5, ivd=False)
    state = c.init()
    seen = []
    for step in range(3):
        pred = np.arange(4, dtype=np.float32) + 10 * step
        anchor = np.array([True, False, True, True])
        _, state, diag = _step(c, state, pred, pred + 0.5, anchor)
        seen.extend(pred[anchor].tolist())
    assert float(diag["buffer_size"]) == 5
    assert sorted(np.asarray(state.pred)[np.asarray(state.valid)].tolist()) == sorted(seen[-5:])
    # More new anchors than slots in one step: the last `capacity` win.
    _, state, _ = _step(c, state, np.arange(8.0) + 100, np.arange(8.0), np.ones(8, bool))
    assert sorted(np.asarray(state.pred).tolist()) == [103.0, 104.0, 105.0, 106.0, 107.0]


def test_decay_weights_older_anchors():
    c = correction_lib.make_reward_correction(capacity=8, decay=0.5)
    state = c.init()
    for _ in range(3):
        _, state, _ = _step(c, state, [0.0, 1.0], [0.0, 1.0], np.array([True, False]))
    w = np.sort(np.asarray(state.weight)[np.asarray(state.valid)])
    np.testing.assert_allclose(w, [0.25, 0.5, 1.0])


def test_ivd_matches_float64_fusion_reference():
    rng = np.random.default_rng(1)
    c = correction_lib.make_reward_correction(capacity=256, real_var_prior=0.01, min_anchors=4)
    state = c.init()
    for _ in range(6):
        _, pred, real, anchor = _sim(rng, 50)
        before = state
        rewards, state, diag = _step(c, state, pred, real, anchor)
    # An executed row is fused with the map fitted before its own execution entered the
    # buffer: the refitted map has seen this very real score, and its error would be
    # correlated with the real score's, which the inverse-variance weights assume away.
    out_of_sample = np.asarray(c.debias(before, pred), np.float64)
    debiased = np.asarray(c.debias(state, pred), np.float64)
    assert np.abs(out_of_sample - debiased)[anchor].max() > 1e-3  # the two maps differ
    var_wm, var_real = float(diag["sigma2_wm"]), float(diag["sigma2_real"])
    expected = np.where(
        anchor,
        (out_of_sample / var_wm + real / var_real) / (1 / var_wm + 1 / var_real),
        debiased,
    )
    np.testing.assert_allclose(rewards, expected, rtol=1e-5, atol=1e-6)
    w = float(diag["fused_weight_wm"])
    np.testing.assert_allclose(w, var_real / (var_wm + var_real), rtol=1e-5)


@pytest.mark.parametrize("local", [False, True])
def test_an_executed_row_sees_its_own_execution_only_through_the_real_stream(local):
    # Fed reward of an executed row: w * (WM stream) + (1 - w) * real. Moving the row's
    # own real score must leave the WM stream where it was: a stream that had seen the
    # score (the refitted map, a local offset with the row's own residual) would carry
    # its noise too, and the inverse-variance weights assume the two errors independent.
    rng = np.random.default_rng(3)
    c = correction_lib.make_reward_correction(
        capacity=64, real_var_prior=0.01, real_var_prior_count=1e6, var_decay=1.0,
        min_anchors=4, local=local,
    )  # fmt: skip
    task = np.repeat(np.arange(5), 8)
    kw = {"task": task} if local else {}
    state = c.init()
    for _ in range(5):
        _, pred, real, anchor = _sim(rng, 40)
        _, state, _ = _step(c, state, pred, real, anchor, **kw)
    _, pred, real, anchor = _sim(rng, 40)
    anchor[:8] = True  # the whole first group is executed: its other rows are its neighbours
    streams = []
    for shift in (0.0, 0.3):
        moved = real.copy()
        moved[0] += shift
        rewards, _, diag = _step(c, state, pred, moved, anchor, **kw)
        w = float(diag["fused_weight_wm"])  # one σ²_wm: the same weight on every row
        streams.append((float(rewards[0]) - (1 - w) * moved[0]) / w)
    # σ²_wm moves a little with the row's residual (w with it); the stream does not.
    np.testing.assert_allclose(streams[0], streams[1], atol=1e-5)


def test_ivd_off_uses_real_scores_on_anchors():
    rng = np.random.default_rng(2)
    c = correction_lib.make_reward_correction(capacity=64, ivd=False, min_anchors=1)
    _, pred, real, anchor = _sim(rng, 30)
    rewards, state, _ = _step(c, c.init(), pred, real, anchor)
    np.testing.assert_allclose(np.asarray(rewards)[anchor], real[anchor], rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(rewards)[~anchor], np.asarray(c.debias(state, pred))[~anchor], rtol=1e-6
    )


def test_anchor_memory_fuses_remembered_means_without_refitting():
    rng = np.random.default_rng(11)
    c = correction_lib.make_reward_correction(capacity=256, real_var_prior=0.01, min_anchors=4)
    state = c.init()
    for _ in range(4):
        _, pred, real, anchor = _sim(rng, 50)
        _, state, _ = _step(c, state, pred, real, anchor)
    _, pred, real, anchor = _sim(rng, 50)
    # Rows 0-9 not executed now, but remembered from 1 or 3 earlier executions.
    anchor[:10] = False
    known = np.full(50, np.nan, np.float32)
    count = np.zeros(50, np.float32)
    known[:10], count[:10] = rng.random(10), np.where(np.arange(10) < 5, 1.0, 3.0)
    rewards, mem_state, diag = _step(c, state, pred, real, anchor, known_real=known,
                                     known_count=count)  # fmt: skip
    plain, plain_state, _ = _step(c, state, pred, real, anchor)
    # The map and its buffer are those of the same step without memory.
    chex.assert_trees_all_close(mem_state, plain_state)
    debiased = np.asarray(c.debias(mem_state, pred), np.float64)  # the refitted map
    var_wm, s2 = float(diag["sigma2_wm"]), float(diag["sigma2_real"])
    var_known = s2 / count[:10]
    expected = (debiased[:10] / var_wm + known[:10] / var_known) / (1 / var_wm + 1 / var_known)
    np.testing.assert_allclose(np.asarray(rewards)[:10], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rewards)[10:], np.asarray(plain)[10:], rtol=1e-6)
    assert float(diag["n_remembered"]) == 10
    # A remembered mean never overrides this step's own execution.
    anchor[0] = True
    rewards, _, diag = _step(c, state, pred, real, anchor, known_real=known, known_count=count)
    assert float(diag["n_remembered"]) == 9


def test_debias_off_passes_predictions_through():
    rng = np.random.default_rng(3)
    c = correction_lib.make_reward_correction(debias=False, ivd=False, use_real=False)
    _, pred, real, anchor = _sim(rng, 30)
    rewards, _, _ = _step(c, c.init(), pred, real, anchor)
    np.testing.assert_array_equal(rewards, pred)


def test_min_anchors_gates_the_map():
    c = correction_lib.make_reward_correction(min_anchors=10, ivd=False, use_real=False)
    pred = np.linspace(0, 1, 6, dtype=np.float32)
    rewards, state, _ = _step(c, c.init(), pred, pred * 0 + 0.5, np.ones(6, bool))
    np.testing.assert_array_equal(rewards, pred)  # 6 < 10 anchors: identity.
    rewards, state, _ = _step(c, state, pred, pred * 0 + 0.5, np.ones(6, bool))
    np.testing.assert_allclose(rewards, 0.5, rtol=1e-6)  # 12 anchors: the map (constant).


def test_bad_inputs_never_give_nan_rewards():
    c = correction_lib.make_reward_correction(capacity=16, min_anchors=1)
    pred = np.array([0.2, np.nan, 0.7, np.nan, 0.5], np.float32)
    var = np.array([1.0, 1.0, np.inf, np.inf, 1.0], np.float32)
    real = np.array([0.3, 0.9, np.nan, np.nan, np.nan], np.float32)
    anchor = np.array([True, True, True, False, False])
    rewards, state, diag = c.update(c.init(), pred, var, real, anchor)
    rewards = np.asarray(rewards)
    assert np.isfinite(rewards).all()
    # NaN real on an anchor: not an anchor. Unparseable prediction with a real
    # score: the real score. Neither: the buffer's mean real reward.
    assert float(diag["n_anchors"]) == 1
    np.testing.assert_allclose(rewards[1], 0.9, rtol=1e-6)
    np.testing.assert_allclose(rewards[3], 0.3, rtol=1e-6)
    assert float(diag["n_unusable"]) == 2  # slots 2 and 3 (slot 2: inf var, NaN real)


def test_sigma2_real_from_replicates_and_prior():
    c = correction_lib.make_reward_correction(real_var_prior=0.5, real_var_prior_count=2.0)
    real = np.array([1.0, 2.0, 0.0], np.float32)
    rep = np.array([3.0, 2.0, np.nan], np.float32)
    rewards, state, diag = c.update(
        c.init(), real, np.ones(3), real, np.ones(3, bool), real_replicate=rep
    )
    # Pairs: (1,3) -> 2.0, (2,2) -> 0.0; shrunk: (2.0 + 0.0 + 2 * 0.5) / (2 + 2).
    np.testing.assert_allclose(float(diag["sigma2_real"]), 0.75, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.real)[:3], [2.0, 2.0, 0.0])


def test_variance_estimates_track_the_truth():
    rng = np.random.default_rng(4)
    wm_noise, real_noise = 0.08, 0.05
    c = correction_lib.make_reward_correction(
        capacity=512, real_var_prior=real_noise**2, real_var_prior_count=1e6
    )
    update = jax.jit(c.update)
    state = c.init()
    for _ in range(40):
        true = rng.random(64).astype(np.float32)
        pred = (true + wm_noise * rng.normal(size=64)).astype(np.float32)  # Unbiased WM.
        real = (true + real_noise * rng.normal(size=64)).astype(np.float32)
        anchor = rng.random(64) < 0.3
        _, state, diag = update(state, pred, np.ones(64), np.where(anchor, real, np.nan), anchor)
    # The map is learned from noisy anchors, so residuals carry some fit error:
    # 35% relative tolerance on a variance estimated from ~700 residuals.
    np.testing.assert_allclose(float(diag["sigma2_wm"]), wm_noise**2, rtol=0.35)
    assert float(diag["rank_corr"]) > 0.9
    assert update._cache_size() == 1


def test_wm_variance_is_unbiased_when_anchors_come_with_replicates():
    # Residuals are one execution against the map (σ²_wm + σ²_real), also where a
    # replicate pair is averaged into the fed real score (whose variance is σ²_real / 2):
    # subtracting σ²_real from the pair mean's residuals would give σ²_wm - σ²_real / 2.
    rng = np.random.default_rng(5)
    noise = 0.08
    c = correction_lib.make_reward_correction(capacity=512, var_decay=1.0)  # all residuals
    update = jax.jit(c.update)
    state = c.init()
    errors = []
    for _ in range(40):
        true = rng.random(64).astype(np.float32)
        pred = (true + noise * rng.normal(size=64)).astype(np.float32)
        real, rep = (true + noise * rng.normal(size=(2, 64))).astype(np.float32)
        anchor = rng.random(64) < 0.3
        real, rep = np.where(anchor, real, np.nan), np.where(anchor, rep, np.nan)
        if float(state.valid.sum()) >= 8:  # the residuals the estimate sees
            errors.append((np.asarray(c.debias(state, pred)) - true)[anchor])
        _, state, diag = update(state, pred, np.ones(64), real, anchor, real_replicate=rep)
    np.testing.assert_allclose(float(diag["sigma2_real"]), noise**2, rtol=0.2)
    # The debiased WM's error variance against the truth, on those rows (about 0.0055).
    np.testing.assert_allclose(float(diag["sigma2_wm"]), np.var(np.concatenate(errors)), rtol=0.25)


def test_errors():
    with pytest.raises(ValueError, match="capacity"):
        correction_lib.make_reward_correction(capacity=0)
    with pytest.raises(ValueError, match="wm_var"):
        correction_lib.make_reward_correction(wm_var="bogus")
    with pytest.raises(ValueError, match="decay"):
        correction_lib.make_reward_correction(decay=0.0)
    c = correction_lib.make_reward_correction()
    # Shape errors too are ValueError (chex assertions raise AssertionError by default),
    # and are raised while tracing under jit.
    for update in (c.update, jax.jit(c.update)):
        with pytest.raises(ValueError, match=r"\(3,\), \(2,\).*`pred_var`.*same shape"):
            update(c.init(), np.zeros(3), np.zeros(2), np.zeros(3), np.ones(3, bool))
        with pytest.raises(ValueError, match=r"rank 2.*`pred_mean` must have shape \[N\]"):
            update(c.init(), np.zeros((2, 3)), np.zeros(3), np.zeros(3), np.ones(3, bool))
    with pytest.raises(ValueError, match="`real_replicate` the same shape"):
        c.update(c.init(), *np.zeros((3, 3)), np.ones(3, bool), real_replicate=np.zeros(4))


def test_per_sample_wm_variance_scales_with_prediction_variance():
    c = correction_lib.make_reward_correction(wm_var="per_sample", min_anchors=1)
    state = c.init()
    rng = np.random.default_rng(6)
    for _ in range(5):
        _, pred, real, anchor = _sim(rng, 40)
        state = c.update(state, pred, np.ones(40), np.where(anchor, real, np.nan), anchor)[1]
    pred = np.array([0.5, 0.5], np.float32)
    real = np.array([0.9, 0.9], np.float32)
    rewards, _, _ = c.update(state, pred, np.array([0.1, 10.0]), real, np.ones(2, bool))
    # The sample whose WM is more confident stays closer to the WM's value.
    debiased = float(c.debias(state, pred)[0])
    assert abs(float(rewards[0]) - debiased) < abs(float(rewards[1]) - debiased)


@pytest.mark.parametrize("wm_var", ["global", "per_sample"])
def test_before_the_variances_are_known_each_stream_is_fed_as_it_is(wm_var):
    # First update: too few residuals for σ²_wm (inf), and a WM claiming certainty on
    # rows 1 and 3 (variance 0). A row with one stream gets that stream, not its fusion
    # with an absent one; a row with both is fused, finite.
    c = correction_lib.make_reward_correction(wm_var=wm_var, real_var_prior=0.01)
    pred = np.array([0.34, 0.19, 0.34, 0.19], np.float32)
    real = np.array([np.nan, np.nan, 0.05, 0.3], np.float32)
    rewards, _, diag = c.update(
        c.init(), pred, np.array([0.045, 0.0, 0.045, 0.0], np.float32), real, np.isfinite(real)
    )
    rewards = np.asarray(rewards)
    assert float(diag["sigma2_wm"]) == np.inf
    np.testing.assert_allclose(rewards[:2], pred[:2], rtol=1e-6)  # predictions, not halved
    np.testing.assert_allclose(rewards[2:], real[2:], rtol=1e-6)  # σ²_wm = inf: the real
    unusable = np.array([np.nan, 0.2, np.nan, np.nan], np.float32)
    rewards, _, _ = c.update(c.init(), unusable, np.ones(4, np.float32), real, np.isfinite(real))
    np.testing.assert_allclose(np.asarray(rewards)[2:], real[2:], rtol=1e-6)  # real alone
