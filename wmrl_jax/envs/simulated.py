"""A simulated research environment with known ground truth.

Each task has `K` candidate solutions with a true quality `q` in [0, 1] (a
leaderboard percentile). Executing a solution for real returns `q` plus fresh
noise. The world model (WM) returns a prediction that models the three kinds
of error described in DESIGN.md section 1:

    r̂ = distort(q) + blind_spot(task, solution) + noise
    distort(q) = offset + scale * q ** gamma          (monotone, non-linear)

* the distortion is monotone but non-linear (with gamma > 1 the WM compresses
  the low end of the scale and is optimistic by `offset`): (a);
* blind spots: a fixed fraction of poor solutions is over-rated by a fixed
  amount every time it is seen, a persistent per-solution error: (b);
* fresh Gaussian noise per query: (c).

Everything is a pure function of keys and arrays so whole studies jit and vmap.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from wmrl_jax.core import synthetic_wm


class SimulatedEnv(NamedTuple):
    """Ground truth of one simulated environment.

    Attributes:
      quality: true quality of each candidate, of shape [T, K], in [0, 1].
      blind_spot: persistent WM error of each candidate, of shape [T, K].
    """

    quality: jax.Array
    blind_spot: jax.Array


class WorldModelSpec(NamedTuple):
    """How the simulated WM errs (see the module docstring)."""

    offset: float = 0.45
    scale: float = 0.6
    gamma: float = 3.0
    noise: float = 0.15


def make_env(
    key: jax.Array,
    *,
    num_tasks: int,
    num_candidates: int,
    blind_spot_fraction: float = 0.1,
    blind_spot_size: float = 0.4,
) -> SimulatedEnv:
    """Samples the ground truth: qualities and the WM's blind spots.

    Blind spots fall only on candidates with quality below 0.5, so that a
    policy exploiting them really gets worse.

    Example:
      >>> env = make_env(jax.random.key(0), num_tasks=2, num_candidates=3)
      >>> env.quality.shape
      (2, 3)
    """
    k_quality, k_blind = jax.random.split(key)
    quality = jax.random.uniform(k_quality, (num_tasks, num_candidates))
    hit = jax.random.bernoulli(k_blind, blind_spot_fraction, quality.shape) & (quality < 0.5)
    return SimulatedEnv(quality, jnp.where(hit, blind_spot_size, 0.0))


def distort(quality: jax.Array, spec: WorldModelSpec) -> jax.Array:
    """The WM's noise-free, blind-spot-free view of a quality: monotone."""
    return spec.offset + spec.scale * quality**spec.gamma


def real_reward(key: jax.Array, quality: jax.Array, *, noise: float) -> jax.Array:
    """One real execution: the true quality plus fresh noise, any shape."""
    return quality + noise * jax.random.normal(key, quality.shape)


def wm_prediction(
    key: jax.Array, quality: jax.Array, blind_spot: jax.Array, spec: WorldModelSpec
) -> jax.Array:
    """One WM query per element: distortion + blind spot + fresh noise."""
    return distort(quality, spec) + blind_spot + spec.noise * jax.random.normal(key, quality.shape)


def wm_prediction_at_q(
    key: jax.Array, quality: jax.Array, blind_spot: jax.Array, spec: WorldModelSpec, *, q: float
) -> jax.Array:
    """WM queries of a chosen quality: for qualities of shape [B, G] (GRPO groups), the
    distortion scrambled within each group to a target within-group Spearman `q` with
    fresh noise (`wmrl_jax.core.synthetic_wm`, the trainer's synthetic world model),
    plus the blind spots; `spec.noise` is not read."""
    noise = jax.random.normal(key, quality.shape)
    none = jnp.zeros(quality.shape, bool)
    mean, _ = synthetic_wm.synthetic_predictions(distort(quality, spec), ~none, noise, none, q=q)
    return mean + blind_spot
