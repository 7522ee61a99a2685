"""Local corrections: residuals of executed programs near the one being scored.

The global isotonic map g fixes bias that is a function of r̂ alone. A world
model that over-rates one kind of program on one task (a *blind spot*) keeps
that error under any g: it is a function of (task, program), not of r̂. The
local correction adds to g(r̂) an offset δ estimated from the residuals
e_j = r_j − g(r̂_j) of executed programs j *near* the scored one: same task,
and close in the program's categorical features (recipe slots; none for
free-form code, where "near" is "same task").

δ is a back-off estimate over the levels of the Hamming distance d between
feature vectors, from coarse to fine, each level shrunk towards the coarser
one with a pseudo-count κ:

    δ_{F+1} = 0
    δ_d     = (Σ_{j: task_j = task, dist ≤ d} w_j e_j + κ δ_{d+1}) /
              (Σ_{j: task_j = task, dist ≤ d} w_j + κ)        for d = F, …, 0

so with no neighbours δ = 0 (the global map alone), with many neighbours on
the task the task's mean residual, and with repeated executions of the very
program (d = 0) mostly that program's own residual. The caller keeps it out
of sample: a row never counts its own execution (`exclude`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def local_offsets(
    task: jax.Array,
    features: jax.Array,
    mem_task: jax.Array,
    mem_features: jax.Array,
    mem_resid: jax.Array,
    mem_weight: jax.Array,
    *,
    prior_count: float,
    exclude: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Back-off local offsets δ of shape [N] and the weight of exact neighbours [N].

    Args:
      task: int task ids of the scored rows, shape [N].
      features: int categorical program features, shape [N, F] (F may be 0).
      mem_task: task ids of the remembered executions, shape [M].
      mem_features: their features, shape [M, F].
      mem_resid: their residuals r − g(r̂), shape [M].
      mem_weight: their weights, shape [M]; 0 marks an empty slot.
      prior_count: κ > 0, the pseudo-count of each level's shrinkage.
      exclude: optional int of shape [N]: a memory slot row i must not use
        (its own execution); out-of-range values exclude nothing.

    Returns:
      `(delta, exact)`: the offsets, and Σ w_j over the exact neighbours (same
      task, d = 0), both float32 of shape [N].

    Example:
      >>> d, n = local_offsets(jnp.array([0]), jnp.zeros((1, 0), int), jnp.array([0, 0]),
      ...                      jnp.zeros((2, 0), int), jnp.array([0.3, 0.3]), jnp.ones(2),
      ...                      prior_count=2.0)
      >>> round(float(d[0]), 3), float(n[0])
      (0.15, 2.0)
    """
    chex.assert_rank([task, features, mem_task, mem_features], [1, 2, 1, 2])
    chex.assert_equal_shape_prefix([task, features], 1)
    chex.assert_equal_shape([mem_task, mem_resid, mem_weight])
    chex.assert_equal_shape_suffix([features, mem_features], 1)
    num_features = features.shape[1]
    resid = jnp.where(mem_weight > 0, jnp.nan_to_num(mem_resid), 0.0).astype(jnp.float32)
    weight = jnp.where(jnp.isfinite(mem_resid), jnp.maximum(mem_weight, 0.0), 0.0)
    same = task[:, None] == mem_task[None, :]  # [N, M]
    if exclude is not None:
        same &= jnp.arange(mem_task.shape[0])[None, :] != exclude[:, None]
    w = jnp.where(same, weight[None, :], 0.0)
    dist = jnp.sum(features[:, None, :] != mem_features[None, :, :], axis=-1)  # [N, M]
    delta = jnp.zeros(task.shape, jnp.float32)
    exact = jnp.zeros(task.shape, jnp.float32)
    for level in range(num_features, -1, -1):  # Coarse to fine; F + 1 levels, static.
        w_level = jnp.where(dist <= level, w, 0.0)
        mass = jnp.sum(w_level, axis=1)
        delta = (w_level @ resid + prior_count * delta) / (mass + prior_count)
        exact = mass
    return delta, exact
