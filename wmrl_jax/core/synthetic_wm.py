"""A synthetic world model of a chosen quality: predictions with a target within-group
Spearman correlation q to the truth (a Gaussian copula, built one GRPO group at a time).

For one group of n rows with true values `x` (already passed through the world
model's monotone distortion), the prediction is

    u   = standardised normal scores of x's ranks (ties: mean ranks)
    z   = ρ·u + sqrt(1 − ρ²)·ε,        ε ~ N(0, 1) per row (fresh per query)
    r̂   = F(z)

where F is the piecewise-linear map through the points (u_i, x_i), extended
beyond them with slope sd(x): strictly increasing wherever x is, so r̂ ranks
the rows as z does, and at ρ = 1 (q = 1) r̂ = x exactly — the distortion is all
that is left. Under a Gaussian copula with Pearson ρ the Spearman correlation is
ρ_s = (6/π)·asin(ρ/2), so ρ = 2·sin(π·q/6) (`population_pearson`). The sample
attenuation of small groups (Moran's E[r_s] for n random draws) does not
apply: u is not drawn, it is the group's own ranks, standardised exactly. The
mean within-group Spearman — what the studies report — measured on 4,000
groups of 8 is within 0.025 of q for q in [0, 1], with or without tied truths
(`tests/core/test_synthetic_wm.py`). Blind spots a caller adds, and groups whose
truths are all equal, move the realised value; callers measure it
(`wmrl_jax.core.stats.group_rank_correlation`).

A row may be *missed* (a failing program whose failure the world model does not
foresee): its u is replaced by 0, the group's typical program, before the noise.

Pure functions of arrays; `group_predictions` is written for one group and
`synthetic_predictions` vmaps it over groups. The returned variance is the
noise's variance on the reward scale under the Gaussian approximation,
(1 − ρ²)·Var(x) over the group, floored at `min_var`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from wmrl_jax.core.stats import _ranks

__all__ = [
    "group_predictions",
    "population_pearson",
    "population_spearman",
    "synthetic_predictions",
]


def population_spearman(rho):
    """Spearman's ρ_s of a bivariate normal with Pearson `rho`: (6/π)·asin(ρ/2).

    Example:
      >>> round(float(population_spearman(1.0)), 6)
      1.0
    """
    return 6.0 / math.pi * jnp.arcsin(jnp.asarray(rho, jnp.float32) / 2.0)


def population_pearson(q):
    """The inverse of `population_spearman`: ρ = 2·sin(π·q/6)."""
    return 2.0 * jnp.sin(math.pi * jnp.asarray(q, jnp.float32) / 6.0)


def _normal_scores(x, mask):
    """Standardised normal scores of x's mean ranks over `mask` (0 elsewhere), [n]."""
    count = jnp.maximum(jnp.sum(mask), 1)
    scores = ndtri((_ranks(x, mask) + 0.5) / count)
    scores = jnp.where(mask, scores, 0.0)
    mean = jnp.sum(scores) / count
    centred = jnp.where(mask, scores - mean, 0.0)
    sd = jnp.sqrt(jnp.sum(centred**2) / count)
    return jnp.where(sd > 0, centred / jnp.where(sd > 0, sd, 1.0), 0.0)


def _through_points(z, u, x, mask, slope):
    """F(z): piecewise linear through the points (u, x) over `mask`, slope `slope` beyond."""
    order = jnp.argsort(jnp.where(mask, u, jnp.inf))
    us, xs = u[order], x[order]
    count = jnp.sum(mask)
    last = jnp.maximum(count - 1, 0)
    u_lo, u_hi, x_lo, x_hi = us[0], us[last], xs[0], xs[last]
    # Beyond the last point every element is the last one: jnp.interp reads a sorted grid.
    us = jnp.where(jnp.arange(u.shape[0]) <= last, us, u_hi)
    xs = jnp.where(jnp.arange(x.shape[0]) <= last, xs, x_hi)
    inside = jnp.interp(z, us, xs)
    below = x_lo + slope * (z - u_lo)
    above = x_hi + slope * (z - u_hi)
    return jnp.where(z < u_lo, below, jnp.where(z > u_hi, above, inside))


def group_predictions(x, mask, noise, missed, *, q, min_var: float = 1e-6):
    """One group's synthetic predictions of target within-group Spearman `q`.

    Args:
      x: the (distorted) true values of shape [n]; read where `mask`.
      mask: bool [n], rows that get a prediction (a program with a known truth).
      noise: standard normal draws of shape [n] (ε, fresh per query).
      missed: bool [n], rows predicted as the group's typical program (u = 0).
      q: target Spearman in [-1, 1] (scalar).
      min_var: floor of the returned variance.

    Returns:
      `(mean, var)` of shape [n]: NaN and inf outside `mask`.
    """
    x = jnp.asarray(x, jnp.float32)
    count = jnp.sum(mask)
    u = _normal_scores(x, mask)
    rho = population_pearson(q)
    latent = jnp.where(missed, 0.0, u)
    z = rho * latent + jnp.sqrt(jnp.maximum(1.0 - rho**2, 0.0)) * noise
    denom = jnp.maximum(count, 1)
    mean_x = jnp.sum(jnp.where(mask, x, 0.0)) / denom
    var_x = jnp.sum(jnp.where(mask, (x - mean_x) ** 2, 0.0)) / denom
    slope = jnp.sqrt(var_x)
    pred = _through_points(z, u, jnp.where(mask, x, 0.0), mask, slope)
    # A group of one row (or of rows all equal) has no ranks to scramble: its value.
    pred = jnp.where(count > 1, pred, jnp.where(mask, x, jnp.nan))
    var = jnp.maximum((1.0 - rho**2) * var_x, min_var)
    return jnp.where(mask, pred, jnp.nan), jnp.where(mask, var, jnp.inf)


def synthetic_predictions(x, mask, noise, missed, *, q, min_var: float = 1e-6):
    """`group_predictions` over groups: every argument of shape [B, G]; `q` a scalar."""
    fn = lambda a, m, e, s: group_predictions(a, m, e, s, q=q, min_var=min_var)  # noqa: E731
    return jax.vmap(fn)(x, mask, noise, missed)
