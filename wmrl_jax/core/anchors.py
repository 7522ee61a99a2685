"""Anchors chosen where they pay, with known inclusion probabilities.

The paper anchors groups uniformly at random, so the anchor pairs `(r̂, r)`
are a uniform sample of the step's rows and a map fitted on them estimates
E[r | r̂] over the whole batch. An active policy (execute what the world
model is unsure of, or what the policy is about to exploit) breaks that: the
anchors over-represent some tasks or programs, and an unweighted isotonic fit
on them is biased towards those. The fix is the survey statistician's: draw
the anchors with known inclusion probabilities π and weight each anchor pair
by 1/π (Horvitz–Thompson), so the weighted fit estimates the same map as a
uniform draw.

`inclusion_probabilities` turns nonnegative group scores into probabilities
that sum to the number of anchors k, each ≤ 1, with a uniform share mixed in
(so every group keeps π ≥ share·k/B > 0 and the weights stay bounded).
`systematic_sample` draws exactly k groups with exactly those marginal
probabilities (systematic sampling over a random order). Both are pure and
jit-able; the trainer and the controlled study call the same functions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def inclusion_probabilities(scores: jax.Array, k: int, *, uniform_share: float) -> jax.Array:
    """Inclusion probabilities of shape [B] proportional to `scores`, summing to `k`.

    π ∝ (1 − share)·s/Σs + share/B, scaled to sum to k; probabilities above 1
    are capped at 1 and the excess is spread over the rest in proportion
    (at most B rounds, static under jit).

    Args:
      scores: nonnegative group scores of shape [B]; NaN or negative count as 0.
        All-zero scores give the uniform k/B.
      k: number of groups to draw, 0 ≤ k ≤ B (static).
      uniform_share: in (0, 1]: the mixed-in uniform share.

    Raises:
      ValueError: on `k` outside [0, B] or `uniform_share` outside (0, 1].

    Example:
      >>> p = inclusion_probabilities(jnp.array([0., 0., 9.]), 1, uniform_share=0.25)
      >>> [round(float(x), 3) for x in p]
      [0.083, 0.083, 0.833]
    """
    b = scores.shape[0]
    if not 0 <= k <= b:
        raise ValueError(f"k must be in [0, {b}], got {k}")
    if not 0.0 < uniform_share <= 1.0:
        raise ValueError(f"uniform_share must be in (0, 1], got {uniform_share}")
    s = jnp.where(jnp.isfinite(scores) & (scores > 0), scores, 0.0).astype(jnp.float32)
    total = jnp.sum(s)
    share = jnp.where(total > 0, s / jnp.where(total > 0, total, 1.0), 1.0 / b)
    base = (1.0 - uniform_share) * share + uniform_share / b

    def cap(_, p):
        full = p >= 1.0
        free = jnp.sum(jnp.where(full, 0.0, p))
        room = k - jnp.sum(full)
        scaled = jnp.where(full, 1.0, p * room / jnp.where(free > 0, free, 1.0))
        return jnp.minimum(scaled, 1.0)

    return jax.lax.fori_loop(0, b, cap, base * k)


def systematic_sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draws groups with marginal inclusion probabilities `probs`: bool [B].

    The groups are put in a random order, and a single uniform u selects the
    groups whose cumulative-probability interval contains one of u, u+1, ….
    With every π ≤ 1 and Σπ = k an integer, exactly k groups are drawn and
    group g is drawn with probability π_g.

    Args:
      key: PRNG key.
      probs: inclusion probabilities of shape [B], each in [0, 1], summing
        to an integer (`inclusion_probabilities`).

    Example:
      >>> mask = systematic_sample(jax.random.key(0), jnp.array([0.5, 0.5, 1.0]))
      >>> int(mask.sum())
      2
    """
    k_order, k_u = jax.random.split(key)
    b = probs.shape[0]
    order = jax.random.permutation(k_order, b)
    p = probs[order].astype(jnp.float32)
    upper = jnp.cumsum(p)
    # Round the running sums so float error cannot add or drop a point.
    upper = jnp.round(upper * 1e5) / 1e5
    lower = jnp.concatenate([jnp.zeros(1, upper.dtype), upper[:-1]])
    u = jax.random.uniform(k_u)
    hit = jnp.floor(upper - u) > jnp.floor(lower - u)
    return jnp.zeros(b, bool).at[order].set(hit)


def ipw_weights(anchor_groups: jax.Array, probs: jax.Array) -> jax.Array:
    """Per-group weights of the anchor pairs, shape [B]: (k/B)/π on drawn groups, 0 elsewhere.

    Normalised so a uniform draw (π = k/B) weighs every anchor 1: the weights
    rescale, they do not change the map's effective sample size under `random`.
    """
    k = jnp.sum(anchor_groups)
    b = probs.shape[0]
    safe = jnp.where(probs > 0, probs, 1.0)
    return jnp.where(anchor_groups & (probs > 0), (k / b) / safe, 0.0).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("k", "uniform_share"))
def draw(
    key: jax.Array, scores: jax.Array, *, k: int, uniform_share: float
) -> tuple[jax.Array, jax.Array]:
    """Draws k groups by `scores` (`inclusion_probabilities`, `systematic_sample`).

    Returns:
      `(groups, weights)`: bool [B], and the anchor weights [B] (`ipw_weights`).
    """
    probs = inclusion_probabilities(scores, k, uniform_share=uniform_share)
    groups = systematic_sample(key, probs)
    return groups, ipw_weights(groups, probs)
