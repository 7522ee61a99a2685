"""Prediction-powered GRPO (`wmrl_ppi`) and reliability weighting (`wmrl_weighted`).

A step samples B groups; n of them (the anchors) are executed. Real GRPO's
update is the mean over all B groups of each group's real-advantage gradient;
`anchors_only` estimates it from the anchors alone. Prediction-powered GRPO
(PPI; PPI++ with a tuned weight) adds a control variate built from the debiased
world model's advantages A_wm, which every group has:

    ĝ = (1/n) Σ_anchors g_real + λ · [ (1/B) Σ_all g_wm − (1/n) Σ_anchors g_wm ]

(the issue's form, n/B times the all-groups term minus the anchor term, divided
by n). The bracket has mean zero over the anchor draw whatever the world model
predicts, so E[ĝ] = E[anchors_only] = real GRPO's update. With
β = Cov(A_real, A_wm)/Var(A_wm) and r their correlation, its variance about the
batch's real gradient is anchors_only's times 1 − 2λβ·Var(A_wm)/Var(A_real) +
λ²·Var(A_wm)/Var(A_real): at the optimum λ = β, (1 − r²) times; counting the
batch's own sampling too, the effective number of anchor groups is
n_eff = 1 / ((1 − r²)/n + r²/B) (`effective_anchors`).

The surrogate without clipping is linear in the advantage, so ĝ is one
effective advantage per row (`ppi_advantages`, normalised like real GRPO's loss
over all B groups' rows):

    A_eff = λ·A_wm + [anchor]·(1/π_g)·(A_real − λ·A_wm),

π_g the group's inclusion probability (B/n under a uniform draw; the 1/π
weights keep a non-uniform draw, the "active" policy, unbiased). The clipped
GRPO loss consumes it unchanged. **Clipping**: the guarantee is exact for the
first gradient of a step, where the ratio is 1 and the clipped surrogate's
gradient equals the unclipped one; in later epochs clipping acts on A_eff (not
on each term), so the update is then a clipped version of an unbiased
direction, as real GRPO's is of its own. A deterministic anchor policy
("uncertain") has no inclusion probabilities and voids the guarantee.

λ is the online reliability (`reliability`): the within-group regression
coefficient of real on world-model advantages over the anchor rows,
Σ A_real·A_wm / Σ A_wm², accumulated over steps with an exponential `decay`,
clipped to [0, 1] and 0 until `warmup_rows` anchor rows were seen. It is the
variance-minimising λ when the rows' score vectors ∇log π are of similar size
and not correlated with the advantages. No 1/(1 + n/B) shrinkage: the
all-groups term here contains the anchors (the design is nested, its variance
∝ 1/n − 1/B), so the optimum is β itself. The weight used at a step comes from
earlier steps only, so it is independent of that step's draw and keeps ĝ
exactly unbiased. `wmrl_weighted` feeds `wmrl`'s rewards and scales the
advantages of its world-model-scored (non-anchor) groups by the same λ: a
useless world model contributes nothing, a good one everything (biased, with
less variance than `wmrl_ppi`).

All functions are pure and jit-compatible; the state is four scalars.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from wmrl_jax.core import grpo

ESTIMATORS = ("grpo", "ppi", "weighted")


class ReliabilityState(NamedTuple):
    """Decayed sums over anchor rows of the within-group advantages (float32 scalars).

    Attributes:
      cross: Σ A_real·A_wm.
      wm_sq: Σ A_wm².
      real_sq: Σ A_real² (for the correlation, a diagnostic).
      rows: the anchor rows counted (decayed like the sums).
    """

    cross: jax.Array
    wm_sq: jax.Array
    real_sq: jax.Array
    rows: jax.Array


def init() -> ReliabilityState:
    """The state before any anchor is seen."""
    zero = jnp.zeros((), jnp.float32)
    return ReliabilityState(zero, zero, zero, zero)


def reliability(state: ReliabilityState, *, warmup_rows: float) -> jax.Array:
    """λ in [0, 1]: Σ A_real·A_wm / Σ A_wm² clipped, 0 before `warmup_rows` rows.

    Example:
      >>> s = ReliabilityState(*map(jnp.float32, (3.0, 4.0, 9.0, 40.0)))
      >>> float(reliability(s, warmup_rows=32))
      0.75
    """
    beta = state.cross / jnp.where(state.wm_sq > 0, state.wm_sq, 1.0)
    ready = (state.rows >= warmup_rows) & (state.wm_sq > 0)
    return jnp.where(ready, jnp.clip(beta, 0.0, 1.0), 0.0)


def correlation(state: ReliabilityState) -> jax.Array:
    """The within-group correlation r of real and WM advantages so far (NaN: none)."""
    denominator = jnp.sqrt(state.wm_sq * state.real_sq)
    return jnp.where(
        denominator > 0, state.cross / jnp.where(denominator > 0, denominator, 1), jnp.nan
    )


def update(state: ReliabilityState, real_adv, wm_adv, both, *, decay: float) -> ReliabilityState:
    """Adds one step's anchor rows to the decayed sums.

    Args:
      state: the sums so far.
      real_adv, wm_adv: advantages of shape [N] (or [B, G]).
      both: bool of the same shape: rows with a real and a usable WM advantage.
      decay: weight of the past per step, in (0, 1].
    """
    chex.assert_equal_shape([real_adv, wm_adv, both])
    w = jnp.asarray(both, jnp.float32)
    real_adv, wm_adv = jnp.where(both, real_adv, 0.0), jnp.where(both, wm_adv, 0.0)
    return ReliabilityState(
        decay * state.cross + jnp.sum(w * real_adv * wm_adv),
        decay * state.wm_sq + jnp.sum(w * wm_adv**2),
        decay * state.real_sq + jnp.sum(w * real_adv**2),
        decay * state.rows + jnp.sum(w),
    )


def ppi_advantages(real_adv, wm_adv, anchor, inverse_pi, lam) -> jax.Array:
    """The effective advantage of prediction-powered GRPO, per row.

    ``A_eff = λ·A_wm + [anchor]·(1/π)·(A_real − λ·A_wm)``; fed to the GRPO loss over
    all groups' rows, its unclipped gradient is the PPI estimate of real GRPO's.

    Args:
      real_adv: real-reward advantages of shape [B, G] (0 off anchors).
      wm_adv: debiased-WM advantages of shape [B, G] (0 where unusable).
      anchor: bool of shape [B, G].
      inverse_pi: 1/π of each row's group, of shape [B, G] (B/n under a uniform draw).
      lam: the scalar weight λ.

    Example:
      >>> real, wm = jnp.array([[1.0, -1.0], [0.0, 0.0]]), jnp.array([[1.0, -1.0], [2.0, -2.0]])
      >>> anchor = jnp.array([[True, True], [False, False]])
      >>> ppi_advantages(real, wm, anchor, jnp.full((2, 2), 2.0), 0.5).tolist()
      [[1.5, -1.5], [1.0, -1.0]]
    """
    chex.assert_equal_shape([real_adv, wm_adv, anchor, inverse_pi])
    scale = jnp.where(anchor, inverse_pi, 0.0)
    return lam * wm_adv + scale * (real_adv - lam * wm_adv)


def weighted_advantages(adv, anchor, lam) -> jax.Array:
    """`wmrl_weighted`: the advantages of shape [B, G], scaled by λ off the anchor groups."""
    return jnp.where(anchor, adv, lam * adv)


def effective_anchors(r, n, num_groups):
    """PPI's effective number of anchor groups, 1 / ((1 − r²)/n + r²/B).

    Example:
      >>> [round(float(effective_anchors(r, 2, 20)), 4) for r in (0.0, 0.8, 1.0)]
      [2.0, 4.717, 20.0]
    """
    r2 = jnp.square(r)
    return 1.0 / ((1.0 - r2) / n + r2 / num_groups)


class Advantages(NamedTuple):
    """An estimator's advantages of shape [B, G], its new state and λ (the one it used)."""

    advantages: jax.Array
    state: ReliabilityState
    lam: jax.Array


def advantages(
    estimator: str, state: ReliabilityState, *, fed, valid, real, wm, anchor, weights,
    mode: str = "std", decay: float, warmup_rows: float,
) -> Advantages:  # fmt: skip
    """The advantages `estimator` feeds the GRPO loss; the trainer and the study call this.

    Args:
      estimator: "grpo" (group advantages of `fed`), "ppi" or "weighted" (static).
      state: the reliability state of the steps before (λ is read from it, then updated).
      fed: fed rewards of shape [B, G]; valid: bool [B, G], rows in the loss.
      real: real rewards of shape [B, G], NaN where not executed.
      wm: the debiased WM rewards of shape [B, G] under the map *before* this step's
        anchors (out of sample), NaN where unusable.
      anchor: bool [B, G], the anchor groups' rows.
      weights: float [B, G], each anchor row's `AnchorChoice.weights` (1 under a
        uniform draw; (n/B)/π under "active").
      mode: the group advantage mode (`grpo.group_advantages`).
      decay, warmup_rows: see `update`, `reliability`.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    per_group = jax.vmap(lambda r, m: grpo.group_advantages(r, mode=mode, mask=m))
    if estimator == "grpo":
        return Advantages(per_group(fed, valid), state, jnp.float32(1.0))
    lam = reliability(state, warmup_rows=warmup_rows)
    has_real = anchor & jnp.isfinite(real)
    has_wm = valid & jnp.isfinite(wm)
    real_adv = per_group(jnp.where(has_real, real, 0.0), has_real)
    wm_adv = per_group(jnp.where(has_wm, wm, 0.0), has_wm)
    state = update(state, real_adv, wm_adv, has_real & has_wm, decay=decay)
    if estimator == "weighted":
        return Advantages(weighted_advantages(per_group(fed, valid), anchor, lam), state, lam)
    b = anchor.shape[0]
    n = jnp.sum(jnp.any(anchor, axis=1))
    inverse_pi = jnp.where(n > 0, b / jnp.maximum(n, 1), 0.0) * weights
    return Advantages(ppi_advantages(real_adv, wm_adv, anchor, inverse_pi, lam), state, lam)
