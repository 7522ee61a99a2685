"""The progress model (world model), its buffer, and the arms table."""

import jax
import numpy as np
import pytest

from wmrl_jax.core import arms as core_arms
from wmrl_jax.embodied import arms, progress


def test_features_and_their_errors():
    feats = progress.progress_features(np.ones((3, 4)), np.array([1.0, 2.0, 3.0]), horizon=10)
    np.testing.assert_allclose(feats[:, -1], [0.1, 0.2, 0.3], rtol=1e-6)
    assert feats.shape == (3, 5)
    with pytest.raises(ValueError, match="prefix_return"):
        progress.progress_features(np.ones((3, 4)), np.ones(2), horizon=10)


def test_buffer_is_a_ring_and_skips_non_finite_targets():
    buf = progress.ProgressBuffer.create(capacity=4, feature_dim=2)
    buf = buf.add(np.arange(6.0).reshape(3, 2), np.array([0.0, np.nan, 2.0]))
    assert buf.valid.sum() == 2 and buf.next_slot == 2
    buf = buf.add(np.full((3, 2), 9.0), np.array([5.0, 6.0, 7.0]))
    # Slots 2, 3 then 0 (the oldest) were written.
    np.testing.assert_array_equal(buf.targets, [7.0, 2.0, 5.0, 6.0])
    assert buf.valid.all() and buf.next_slot == 1
    with pytest.raises(ValueError, match="features must be"):
        buf.add(np.ones((1, 3)), np.ones(1))
    with pytest.raises(ValueError, match="capacity"):
        progress.ProgressBuffer.create(capacity=0, feature_dim=2)


def test_model_learns_a_nonlinear_outcome():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(512, 3)).astype(np.float32)
    y = np.tanh(2 * x[:, 0]) - x[:, 1] ** 2
    model = progress.make_progress_model(feature_dim=3, hidden=(32, 32), learning_rate=1e-2)
    state = model.init(jax.random.key(0))
    buf = progress.ProgressBuffer.create(capacity=512, feature_dim=3).add(x, y)
    before = np.mean((model.predict(state, x) - y) ** 2)
    state = model.fit(state, buf, num_steps=400)
    after = np.mean((model.predict(state, x) - y) ** 2)
    assert after < 0.05 * before and after < 0.01
    with pytest.raises(ValueError, match="features must be"):
        model.predict(state, np.ones((2, 4), np.float32))


def test_arms_table():
    real, anchors, naive, wmrl = (
        arms.ARMS[a] for a in ("real", "anchors_only", "wm_naive", "wmrl")
    )
    counts = lambda arm, b, rho: (
        arms.executed_groups(arm, b, rho=rho), arms.predicted_groups(arm, b, rho=rho)
    )  # fmt: skip
    assert counts(real, 10, 0.1) == (10, 0)
    assert counts(anchors, 10, 0.1) == (1, 0)
    assert counts(naive, 10, 0.1) == (0, 10)
    assert counts(wmrl, 10, 0.1) == (1, 9)
    assert counts(wmrl, 4, 0.1) == (1, 3)  # At least one anchor group.
    # The trainer's rounding (2.5 to even), not the ceiling embodied used to take (3).
    assert counts(wmrl, 10, 0.25) == (2, 8)
    assert counts(wmrl, 10, 0.25)[0] == wmrl.num_anchor_groups(10, 0.25)
    assert arms.replicates(wmrl) and arms.learns_online(wmrl) and not arms.learns_online(naive)
    assert arms.ARMS["wm_debias"] is core_arms.ARMS["wm_debias"]  # the shared table's rows
    with pytest.raises(ValueError, match="unknown arm"):
        arms.get_arm("wmrl_memory")
