"""Adaptive anchor fraction: more anchors when the world model's error rises, fewer when stable.

Each step the executed rows' real rewards are compared with the debiased
predictions made *before* the map saw them, so the error is out of sample.
Two bias-corrected exponential moving averages of its mean square follow it,
a fast one (recent steps) and a slow one (the run so far); their ratio is
the drift. The anchor fraction is

    ρ_t = clip(ρ₀ · (e_fast / e_slow)^γ, ρ_min, ρ_max),

ρ₀ until `warmup_steps` steps have measured an error. Rising error (a WM
that falls behind a moving policy, or a map that no longer fits) draws more
anchors; a falling one frees them. The run's compute budget is unchanged: a
step that executes more costs more, so the run stops earlier.

The number of anchor groups is ρ_t·B stochastically rounded (`num_groups`),
so a fraction below one group per step is honoured on average and a step may
execute none.

All functions are pure and jit-compatible; the state is a few scalars.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class RhoState(NamedTuple):
    """Moving averages of the out-of-sample squared error (all float32 scalars).

    Attributes:
      fast, slow: the EMAs' accumulated values (not yet bias-corrected).
      fast_weight, slow_weight: their accumulated weights (the bias correction:
        an EMA started at 0 is divided by 1 − αⁿ).
      steps: int32, the steps that measured an error.
    """

    fast: jax.Array
    slow: jax.Array
    fast_weight: jax.Array
    slow_weight: jax.Array
    steps: jax.Array


def init() -> RhoState:
    """The state before any error is measured."""
    zero = jnp.zeros((), jnp.float32)
    return RhoState(zero, zero, zero, zero, jnp.zeros((), jnp.int32))


def _decay(halflife: float) -> float:
    return 0.5 ** (1.0 / halflife)


def update(
    state: RhoState,
    errors: jax.Array,
    mask: jax.Array,
    *,
    fast_halflife: float,
    slow_halflife: float,
) -> RhoState:
    """Adds one step's out-of-sample errors.

    Args:
      state: the current state.
      errors: float [N], real − debiased prediction per row.
      mask: bool [N], rows whose error counts (executed, with a finite
        prediction). A step without any leaves the state unchanged.
      fast_halflife, slow_halflife: the EMAs' half-lives in steps.

    Returns:
      The new state.
    """
    chex.assert_equal_shape((errors, mask))
    mask = mask & jnp.isfinite(errors)
    n = jnp.sum(mask)
    mse = jnp.sum(jnp.where(mask, errors, 0.0) ** 2) / jnp.maximum(n, 1)
    a_fast, a_slow = _decay(fast_halflife), _decay(slow_halflife)
    new = RhoState(
        fast=a_fast * state.fast + (1 - a_fast) * mse,
        slow=a_slow * state.slow + (1 - a_slow) * mse,
        fast_weight=a_fast * state.fast_weight + (1 - a_fast),
        slow_weight=a_slow * state.slow_weight + (1 - a_slow),
        steps=state.steps + 1,
    )
    return jax.tree.map(lambda a, b: jnp.where(n > 0, a, b).astype(b.dtype), new, state)


def errors(state: RhoState) -> tuple[jax.Array, jax.Array]:
    """The bias-corrected mean squared errors `(e_fast, e_slow)`; NaN before any step."""
    nan = jnp.float32(jnp.nan)
    fast = jnp.where(state.fast_weight > 0, state.fast / state.fast_weight, nan)
    slow = jnp.where(state.slow_weight > 0, state.slow / state.slow_weight, nan)
    return fast, slow


def fraction(
    state: RhoState,
    *,
    base: float,
    low: float,
    high: float,
    gain: float = 1.0,
    warmup_steps: int = 20,
) -> jax.Array:
    """ρ_t: `base` scaled by the drift (e_fast / e_slow)^gain, clipped to [low, high].

    `base` until `warmup_steps` steps have measured an error, and where the slow
    error is zero (a perfect world model so far: nothing to compare with).
    """
    fast, slow = errors(state)
    ratio = jnp.where(slow > 0, fast / jnp.where(slow > 0, slow, 1.0), 1.0)
    rho = jnp.where(state.steps >= warmup_steps, base * ratio**gain, base)
    return jnp.clip(rho, low, high).astype(jnp.float32)


def num_groups(key: jax.Array, rho: jax.Array, total: int) -> jax.Array:
    """ρ·total groups stochastically rounded: ⌊ρ·total⌋, plus one with the remainder's
    probability, so the expected count is exactly ρ·total (int32 scalar in [0, total])."""
    expected = jnp.clip(rho, 0.0, 1.0) * total
    # A whole count in float32 (0.1 * 20 = 2.0000000298) is that count, never one more.
    expected = jnp.where(
        jnp.abs(expected - jnp.round(expected)) < 1e-4, jnp.round(expected), expected
    )
    whole = jnp.floor(expected)
    extra = jax.random.uniform(key) < expected - whole
    return (whole + extra).astype(jnp.int32)
