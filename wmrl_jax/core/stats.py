"""Masked statistics of 1-D arrays: the mean and the Spearman rank correlation.

Fixed shapes under jit: the entries that count are marked by a bool mask
instead of being gathered, and an empty (or too small) selection gives NaN
rather than an error. The reward correction's diagnostics read them
(`wmrl_jax.core.correction`), as does the embodied study's per-group score.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `x` over `mask`; NaN when `mask` selects nothing.

    Args:
      x: values of shape [n].
      mask: bool of shape [n].

    Returns:
      A float scalar (float32 for float32 input).

    Example:
      >>> float(masked_mean(jnp.array([1., 2., 9.]), jnp.array([True, True, False])))
      1.5
    """
    count = jnp.sum(mask)
    total = jnp.sum(jnp.where(mask, x, 0))
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def _ranks(x, mask):
    """Average ranks among valid entries (ties share their mean rank)."""
    key = jnp.where(mask, x, jnp.inf)
    ordered = jnp.sort(key)
    first = jnp.searchsorted(ordered, key, side="left")
    last = jnp.searchsorted(ordered, key, side="right") - 1
    return 0.5 * (first + last).astype(jnp.float32)


def rank_correlation(x: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
    """Spearman rank correlation of `x` and `y` over `mask` (ties: mean ranks).

    Args:
      x: values of shape [n].
      y: values of shape [n].
      mask: bool of shape [n].

    Returns:
      A float32 scalar in [-1, 1]; NaN with fewer than two valid entries or
      when either side is constant.

    Example:
      >>> float(rank_correlation(jnp.array([1., 2., 3.]), jnp.array([1., 5., 9.]),
      ...                        jnp.ones(3, bool)))
      1.0
    """
    rx, ry = _ranks(x, mask), _ranks(y, mask)
    mx, my = masked_mean(rx, mask), masked_mean(ry, mask)
    dx = jnp.where(mask, rx - mx, 0)
    dy = jnp.where(mask, ry - my, 0)
    denom = jnp.sqrt(jnp.sum(dx * dx) * jnp.sum(dy * dy))
    ok = (jnp.sum(mask) >= 2) & (denom > 0)
    return jnp.where(ok, jnp.sum(dx * dy) / jnp.where(ok, denom, 1), jnp.nan)
