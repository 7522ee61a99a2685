"""The reward correction's memory: the anchor ring buffer and the σ² estimates, by hand."""

import chex
import jax.numpy as jnp
import numpy as np

from wmrl_jax.core import correction_state as cs
from wmrl_jax.core import fusion


def _append(state, pred, new, *, capacity, decay=1.0):
    n = len(pred)
    pred = jnp.asarray(pred, jnp.float32)
    return cs.append_anchors(
        state, pred, pred + 0.5, jnp.asarray(new), capacity, decay,
        weight=jnp.ones(n), task=jnp.zeros(n, jnp.int32), feat=jnp.zeros((n, 1), jnp.int32),
    )  # fmt: skip


class CorrectionStateTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_append_wraps_around_and_drops_the_oldest(self):
        append = self.variant(_append, static_argnames="capacity")
        state = cs.init_state(4, 1)
        buffer, slots = append(state, [1.0, 2.0, 3.0], [True, False, True], capacity=4)
        np.testing.assert_array_equal(slots, [0, 4, 1])  # 4 = C: not written
        state = state._replace(**buffer._asdict())
        buffer, slots = append(state, [4.0, 5.0, 6.0], [True, True, True], capacity=4)
        np.testing.assert_array_equal(slots, [2, 3, 0])  # the oldest (1.0) goes
        np.testing.assert_array_equal(buffer.pred, [6.0, 3.0, 4.0, 5.0])
        np.testing.assert_array_equal(buffer.real, [6.5, 3.5, 4.5, 5.5])
        assert int(buffer.next_slot) == 1 and bool(buffer.valid.all())
        # More new pairs than slots: the last C win, each in its own slot.
        buffer, slots = append(cs.init_state(2, 1), [7.0, 8.0, 9.0], [True] * 3, capacity=2)
        np.testing.assert_array_equal(slots, [2, 0, 1])
        np.testing.assert_array_equal(buffer.pred, [8.0, 9.0])

    def test_append_decays_the_weights_held(self):
        state = cs.init_state(3, 1)
        buffer, _ = _append(state, [1.0], [True], capacity=3, decay=0.5)
        buffer, _ = _append(
            state._replace(**buffer._asdict()), [2.0], [True], capacity=3, decay=0.5
        )
        np.testing.assert_array_equal(buffer.weight, [0.5, 1.0, 0.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_real_scores_average_replicates_and_shrink_to_the_prior(self):
        real = jnp.array([1.0, 2.0, 0.0, 5.0])
        has_real = jnp.array([True, True, True, False])
        rep = jnp.array([3.0, 2.0, jnp.nan, 1.0])  # row 3 has no first execution
        scores = self.variant(cs.real_scores, static_argnames=("prior", "prior_count"))(
            cs.init_state(2, 1), real, has_real, rep, prior=0.5, prior_count=2.0
        )
        # Pairs (1, 3) and (2, 2): (2 + 0 + 2 * 0.5) / (2 + 2).
        np.testing.assert_allclose(scores.sigma2_real, 0.75)
        np.testing.assert_array_equal(scores.real, [2.0, 2.0, 0.0, 5.0])
        np.testing.assert_allclose(scores.var_real, [0.375, 0.375, 0.75, 0.75])
        assert float(scores.replicate_count) == 2 and float(scores.replicate_sq) == 2.0

    def test_wm_variance_is_residual_variance_minus_real_variance_floored(self):
        resid = jnp.array([0.0, 1.0, 2.0, 9.0])
        mask = jnp.array([True, True, True, False])
        usable = jnp.array([True, True, False, True])
        pred_var = jnp.array([1.0, 3.0, 1.0, jnp.inf])
        wm = lambda sigma2_real, **kw: cs.wm_variance(
            cs.init_state(2, 1), resid, mask, pred_var, mask, usable, sigma2_real,
            var_decay=1.0, min_wm_var=0.1, **kw,
        )  # fmt: skip
        out = wm(0.25, per_sample=False)  # sample variance of 0, 1, 2 is 1
        np.testing.assert_allclose([out.resid_var, out.sigma2_wm], [1.0, 0.75])
        np.testing.assert_allclose(out.var_wm, [0.75, 0.75, np.inf, 0.75])
        assert float(fusion.ema_variance(out.resid)) == 1.0
        assert float(wm(5.0, per_sample=False).sigma2_wm) == np.float32(0.1)  # floored
        # Per sample: scaled by pred_var over its anchor mean, (1 + 3 + 1) / 3.
        np.testing.assert_allclose(
            wm(0.25, per_sample=True).var_wm, [0.45, 1.35, np.inf, 0.75], rtol=1e-6
        )
