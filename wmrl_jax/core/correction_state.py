"""The reward correction's memory: the anchor buffer and the variance estimates.

`CorrectionState` is everything `wmrl_jax.core.correction` carries from one
step to the next, a pytree of fixed-shape arrays. This module holds its
pieces as pure functions of the state and one step's arrays:

* the anchor ring buffer (`append_anchors`): executed pairs `(r̂, r)` with
  their weights, task ids and program features; the oldest out, and with
  `decay < 1` older pairs losing weight geometrically each step;
* σ²_real (`real_scores`): the variance of one real execution, from replicate
  pairs, `(r_1 - r_2)^2 / 2` each (unbiased), shrunk towards a prior with a
  pseudo-count;
* σ²_wm (`wm_variance`): the exponentially decayed variance of out-of-sample
  residuals `r - g(r̂)`, which estimates `σ²_wm + σ²_real`, minus σ²_real,
  floored; optionally scaled per sample by the WM's own variance.

Shapes: N rows this step, C buffer slots, F program features.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from wmrl_jax.core import fusion, isotonic


class CorrectionState(NamedTuple):
    """State of the reward correction; a pytree of fixed-shape arrays.

    Attributes:
      pred: anchor buffer of WM predictions, of shape [C].
      real: anchor buffer of real rewards, of shape [C].
      weight: anchor weights, of shape [C] (decayed with age when decay < 1).
      valid: bool, of shape [C]: which buffer slots hold an anchor.
      task: int32 task ids of the anchors, of shape [C] (local correction).
      feat: int32 program features of the anchors, of shape [C, max(F, 1)].
      next_slot: int32 scalar, the ring-buffer write position.
      fit: the isotonic map fitted on the buffer at the last update.
      resid: decayed mean/variance of out-of-sample residuals `r - g(r̂)`.
      pred_var: decayed mean of the WM's own variances on anchors.
      replicate_sq: sum of `(r_1 - r_2)^2 / 2` over replicate pairs seen.
      replicate_count: number of replicate pairs seen (float32 scalar).
      step: int32 scalar, number of updates so far.
    """

    pred: jax.Array
    real: jax.Array
    weight: jax.Array
    valid: jax.Array
    task: jax.Array
    feat: jax.Array
    next_slot: jax.Array
    fit: isotonic.IsotonicFit
    resid: fusion.EmaVarianceState
    pred_var: fusion.EmaVarianceState
    replicate_sq: jax.Array
    replicate_count: jax.Array
    step: jax.Array


def init_state(capacity: int, width: int) -> CorrectionState:
    """An empty state: no anchors, an empty map, no residuals or replicates.

    Args:
      capacity: C, the buffer's slots.
      width: max(F, 1), the program features stored per anchor.
    """
    zeros = jnp.zeros(capacity, jnp.float32)
    return CorrectionState(
        pred=zeros,
        real=zeros,
        weight=zeros,
        valid=jnp.zeros(capacity, bool),
        task=jnp.zeros(capacity, jnp.int32),
        feat=jnp.zeros((capacity, width), jnp.int32),
        next_slot=jnp.int32(0),
        fit=isotonic.IsotonicFit(zeros, zeros, jnp.int32(0)),
        resid=fusion.ema_variance_init(),
        pred_var=fusion.ema_variance_init(),
        replicate_sq=jnp.float32(0),
        replicate_count=jnp.float32(0),
        step=jnp.int32(0),
    )


class AnchorBuffer(NamedTuple):
    """The anchor ring buffer's fields of `CorrectionState`."""

    pred: jax.Array
    real: jax.Array
    weight: jax.Array
    valid: jax.Array
    task: jax.Array
    feat: jax.Array
    next_slot: jax.Array


def append_anchors(state, pred, real, new, capacity, decay, *, weight, task, feat):
    """Writes the pairs marked by `new` into the ring buffer (last ones win).

    Args:
      state: the `CorrectionState` whose buffer is written.
      pred: WM predictions of shape [N].
      real: real rewards of shape [N].
      new: bool of shape [N], the rows to append.
      capacity: C, the buffer's slots.
      decay: factor on the weights of the anchors already held.
      weight: weights of the appended pairs in the map's fit, of shape [N].
      task: int32 task ids of shape [N].
      feat: int32 program features of shape [N, max(F, 1)].

    Returns:
      The new `AnchorBuffer` and each row's slot, int32 of shape [N]
      (`capacity` where the row was not written).
    """
    n_new = jnp.sum(new, dtype=jnp.int32)
    rank = jnp.cumsum(new, dtype=jnp.int32) - 1
    keep = new & (rank >= n_new - capacity)  # At most `capacity` distinct slots.
    slot = jnp.where(keep, (state.next_slot + rank - jnp.maximum(n_new - capacity, 0)), 0)
    slot = jnp.where(keep, slot % capacity, capacity)  # Out of range = dropped.
    buffer = AnchorBuffer(
        state.pred.at[slot].set(pred, mode="drop"),
        state.real.at[slot].set(real, mode="drop"),
        (state.weight * decay).at[slot].set(weight, mode="drop"),
        state.valid.at[slot].set(True, mode="drop"),
        state.task.at[slot].set(task, mode="drop"),
        state.feat.at[slot].set(feat, mode="drop"),
        (state.next_slot + jnp.minimum(n_new, capacity)) % capacity,
    )
    return buffer, slot


class RealScores(NamedTuple):
    """Real scores with replicates folded in, and the σ²_real estimate."""

    real: jax.Array  # [N], the replicate mean where a pair exists.
    var_real: jax.Array  # [N], σ²_real / the number of executions averaged.
    sigma2_real: jax.Array  # scalar
    replicate_sq: jax.Array  # scalar, updated state field.
    replicate_count: jax.Array  # scalar, updated state field.


def real_scores(state, real, has_real, real_replicate, *, prior, prior_count) -> RealScores:
    """σ²_real from replicate pairs, `(r_1 - r_2)^2 / 2` each, shrunk towards `prior`.

    Args:
      state: the `CorrectionState` holding the replicate sums so far.
      real: real rewards of shape [N], float32.
      has_real: bool of shape [N], where `real` is a usable execution.
      real_replicate: None, or a second score of shape [N] (NaN where absent).
      prior: the prior σ²_real.
      prior_count: its pseudo-count against replicate pairs.

    Returns:
      `RealScores`: `real` with each replicate pair averaged, the variance of
      each row's score and the updated replicate sums.
    """
    replicate_sq, replicate_count = state.replicate_sq, state.replicate_count
    n_real = has_real.astype(jnp.float32)
    if real_replicate is not None:
        rep = jnp.asarray(real_replicate, jnp.float32)
        pair = has_real & jnp.isfinite(rep)
        replicate_sq += jnp.sum(jnp.where(pair, 0.5 * (real - rep) ** 2, 0))
        replicate_count += jnp.sum(pair, dtype=jnp.float32)
        real = jnp.where(pair, 0.5 * (real + rep), real)
        n_real = n_real + pair
    sigma2_real = (replicate_sq + prior_count * prior) / (replicate_count + prior_count)
    var_real = sigma2_real / jnp.maximum(n_real, 1)
    return RealScores(real, var_real, sigma2_real, replicate_sq, replicate_count)


class WmVariance(NamedTuple):
    """σ²_wm from out-of-sample residuals, per sample and as a scalar."""

    var_wm: jax.Array  # [N]; inf where the prediction is unusable.
    sigma2_wm: jax.Array  # scalar, floored at `min_wm_var`.
    resid_var: jax.Array  # scalar, the variance of `r - g(r̂)` (σ²_wm + σ²_real).
    resid: fusion.EmaVarianceState  # updated state field.
    pred_var_stats: fusion.EmaVarianceState  # updated state field.


def wm_variance(
    state,
    resid,
    resid_mask,
    pred_var,
    anchors,
    usable_pred,
    sigma2_real,
    *,
    var_decay,
    min_wm_var,
    per_sample,
) -> WmVariance:
    """Folds this step's residuals into the decayed estimates and derives σ²_wm.

    Args:
      state: the `CorrectionState` holding the residual and WM-variance estimates.
      resid: out-of-sample residuals `r - g(r̂)` of shape [N], read where
        `resid_mask` holds.
      resid_mask: bool of shape [N].
      pred_var: the WM's own variances of shape [N].
      anchors: bool of shape [N], usable prediction and real score.
      usable_pred: bool of shape [N].
      sigma2_real: scalar σ²_real, subtracted from the residual variance.
      var_decay: per-sample decay of both estimates.
      min_wm_var: floor of σ²_wm.
      per_sample: scale σ²_wm by `pred_var / E_anchors[pred_var]`.

    Returns:
      `WmVariance`: σ²_wm per row (inf where unusable) and as a scalar, and the
      updated estimates.
    """
    resid_stats = fusion.ema_variance_update(state.resid, resid, decay=var_decay, mask=resid_mask)
    pred_var_stats = fusion.ema_variance_update(
        state.pred_var, pred_var, decay=var_decay, mask=anchors & jnp.isfinite(pred_var)
    )
    resid_var = fusion.ema_variance(resid_stats)
    sigma2_wm = jnp.maximum(resid_var - sigma2_real, min_wm_var)
    if per_sample:
        var_wm = per_sample_scale(sigma2_wm, pred_var, pred_var_stats.mean, min_wm_var=min_wm_var)
    else:
        var_wm = jnp.broadcast_to(sigma2_wm, pred_var.shape)
    var_wm = jnp.where(usable_pred, var_wm, jnp.inf)
    return WmVariance(var_wm, sigma2_wm, resid_var, resid_stats, pred_var_stats)


def per_sample_scale(sigma2_wm, pred_var, pred_var_mean, *, min_wm_var) -> jax.Array:
    """σ²_wm per row, `σ²_wm · var̂_i / E_anchors[var̂]`, floored at `min_wm_var`.

    Args:
      sigma2_wm: the scalar σ²_wm (inf while unknown).
      pred_var: the WM's own variances of shape [N].
      pred_var_mean: their decayed mean on anchors (scalar).
      min_wm_var: the floor.

    Returns:
      float32 of shape [N]; inf everywhere while σ²_wm is unknown.
    """
    scale = pred_var / jnp.maximum(pred_var_mean, 1e-12)
    # Floored per sample too: a WM that claims certainty (variance 0) must not be
    # trusted as exact.
    scaled = sigma2_wm * jnp.where(jnp.isfinite(scale), scale, 1.0)
    # Before σ²_wm is estimated (inf) every row's error is unknown, whatever its own
    # variance: inf, not inf x 0 = NaN for a WM that claims certainty.
    return jnp.where(jnp.isinf(sigma2_wm), jnp.inf, jnp.maximum(scaled, min_wm_var))
