"""Masked statistics of 1-D arrays: the mean and the Spearman rank correlation.

Fixed shapes under jit: the entries that count are marked by a bool mask
instead of being gathered, and an empty (or too small) selection gives NaN
rather than an error. The reward correction's diagnostics read them
(`wmrl_jax.core.correction`); the studies score a world model by
`group_rank_correlation`, the mean Spearman correlation within GRPO groups
(`group_rank_correlations`: each group's, and which groups count).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def masked_mean(x: jax.Array, mask: jax.Array, *, empty: float = jnp.nan) -> jax.Array:
    """Mean of `x` over `mask`; `empty` (NaN) when `mask` selects nothing.

    Args:
      x: values of shape [n].
      mask: bool of shape [n].
      empty: the value of an empty selection.

    Returns:
      A float scalar (float32 for float32 input).

    Example:
      >>> float(masked_mean(jnp.array([1., 2., 9.]), jnp.array([True, True, False])))
      1.5
    """
    count = jnp.sum(mask)
    total = jnp.sum(jnp.where(mask, x, 0))
    return jnp.where(count > 0, total / jnp.maximum(count, 1), empty)


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


@functools.partial(jax.jit, static_argnames=("group_size", "min_count"))
def group_rank_correlations(
    x: jax.Array, y: jax.Array, group_size: int, *, min_count: int = 3
) -> tuple[jax.Array, jax.Array]:
    """The Spearman correlation of `x` and `y` within each group, and which groups count.

    An entry where either side is not finite is left out of its group; a group
    counts when at least `min_count` entries are left and neither side is
    constant over them (two points always correlate ±1).

    Args:
      x: values of shape [num_groups * group_size], group-major.
      y: values of the same shape.
      group_size: G, the entries of one group.
      min_count: the fewest entries a group needs to count.

    Returns:
      `(corr, counted)`: float32 of shape [num_groups] (NaN where a side is
      constant or fewer than two entries are left) and bool of shape [num_groups].

    Example:
      >>> corr, counted = group_rank_correlations(jnp.array([1., 2., 3., 3., 3., 3.]),
      ...                                         jnp.array([1., 5., 9., 1., 2., 3.]), 3)
      >>> corr.tolist()[0], counted.tolist()
      (1.0, [True, False])
    """
    x = jnp.asarray(x, jnp.float32).reshape(-1, group_size)
    y = jnp.asarray(y, jnp.float32).reshape(-1, group_size)
    mask = jnp.isfinite(x) & jnp.isfinite(y)
    corr = jax.vmap(rank_correlation)(x, y, mask)
    return corr, (jnp.sum(mask, axis=1) >= min_count) & jnp.isfinite(corr)


@functools.partial(jax.jit, static_argnames=("group_size", "min_count"))
def group_rank_correlation(
    x: jax.Array, y: jax.Array, group_size: int, *, min_count: int = 3
) -> jax.Array:
    """Mean over groups of the Spearman correlation of `x` and `y` within each group.

    The groups that count are those of `group_rank_correlations`: an entry
    where either side is not finite is left out of its group; a group with
    fewer than `min_count` entries left, or constant on either side, is left
    out of the mean (two points always correlate ±1).

    Args:
      x: values of shape [num_groups * group_size], group-major.
      y: values of the same shape.
      group_size: G, the entries of one group.
      min_count: the fewest entries a group needs to count.

    Returns:
      A float32 scalar; NaN when no group counts.

    Example:
      >>> float(group_rank_correlation(jnp.array([1., 2., 3., 3., 2., 1.]),
      ...                              jnp.array([1., 5., 9., 1., 2., 3.]), 3))
      0.0
    """
    corr, counted = group_rank_correlations(x, y, group_size, min_count=min_count)
    return masked_mean(corr, counted)
