"""AdamW on bfloat16 params: float32 hyperparameters and first moment, finite updates."""

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.train import state as state_lib


def test_bfloat16_params_get_a_finite_adam_update():
    # In bfloat16, b2 = 0.999 rounds to 1.0: the second moment never moves and the
    # bias correction 1 - b2^t is 0, so the first update was NaN.
    config = state_lib.default_optimizer_config()
    config.warmup_steps, config.total_steps, config.lr = 0, 10, 1e-3
    optimizer = state_lib.make_optimizer(config)
    reference = None
    for dtype in (jnp.float32, jnp.bfloat16):
        params = {"w": jnp.ones((4, 4), dtype)}
        opt_state = optimizer.init(params)
        grads = {"w": jnp.full((4, 4), 0.01, jnp.float32)}
        updates, new_state = optimizer.update(grads, opt_state, params)
        assert np.all(np.isfinite(np.asarray(updates["w"], np.float32)))
        reference = updates["w"] if reference is None else reference
        np.testing.assert_allclose(updates["w"], reference, rtol=1e-3)
        dtypes = lambda s: jax.tree.map(lambda x: x.dtype, s)  # noqa: E731
        assert dtypes(new_state) == dtypes(opt_state)  # no retrace after the first step
