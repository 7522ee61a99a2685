"""The pieces the reward correction is chained from, each an optax-style pure pair.

A piece is `CorrectionPiece(init, update, state)`: `init() -> S` returns its
state (a `NamedTuple` whose fields are fields of `CorrectionState`, so the
chained state keeps the checkpointed layout; `EmptyState` when it remembers
nothing) and `update(S, rows) -> (rows, S)` reads and extends `Rows`, the
step's streams. No piece has a switch: an arm is a choice of pieces
(`wmrl_jax.core.correction.make_reward_correction`), in this order:

    replicates → anchor_buffer → [isotonic_debias] → [local_offsets]
      → wm_variance → [per_sample_variance] → [anchor_memory]
      → one of inverse_variance_fusion | real_replaces_wm | wm_only

The WM streams of `Rows` (each of shape [N]):

* ``wm_prior``: the prediction under the map fitted before this step (plus
  the local offsets of earlier executions): its residuals on this step's
  anchors are out of sample and feed σ²_wm;
* ``wm_unseen``: what an executed row is fused with: the map fitted before,
  plus local offsets from every execution but the row's own, so its error
  is independent of the row's real score;
* ``wm``: every other row's stream, under the map refitted on this step's anchors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from wmrl_jax.core import correction_state as cs
from wmrl_jax.core import fusion, isotonic
from wmrl_jax.core import local as local_lib
from wmrl_jax.core.stats import masked_mean


class Rows(NamedTuple):
    """One step's rows as they flow through the chain (arrays of shape [N] unless noted).

    Inputs: ``pred``, ``pred_var``, ``execution`` (one real execution, NaN
    where none), ``has_real`` (executed with a finite score), ``usable`` (a
    prediction with finite mean and variance), ``anchors`` (both),
    ``replicate``, ``known_real``, ``known_count`` (None where not given),
    ``task`` [N], ``feat`` [N, max(F, 1)], ``weight`` (anchor weights).
    Set by the pieces: the real stream (``real``, ``var_real``,
    ``sigma2_real``; ``real_any``, ``var_real_any``, ``has_real_any`` add
    remembered means), the anchor buffer before and after this step's
    anchors, the maps, the WM streams (module docstring) and their
    variances, the ``fallback`` reward, the ``rewards`` with the WM's
    ``weight_wm`` in each, and extra ``diagnostics``.
    """

    pred: jax.Array
    pred_var: jax.Array
    execution: jax.Array
    has_real: jax.Array
    usable: jax.Array
    anchors: jax.Array
    replicate: jax.Array | None
    known_real: jax.Array | None
    known_count: jax.Array | None
    task: jax.Array
    feat: jax.Array
    weight: jax.Array
    real: Any = None
    var_real: Any = None
    sigma2_real: Any = None
    buffer_before: Any = None  # `AnchorMapState` before this step's anchors
    buffer: Any = None  # ... and after
    slots: Any = None  # [N] each row's buffer slot (capacity where not written)
    had_map: Any = None  # scalar bool: the buffer held enough anchors for a map
    has_map: Any = None  # ... and holds them now
    map_before: Callable | None = None  # the map fitted before this step
    map_after: Callable | None = None
    prior_gate: Any = True  # scalar bool: `wm_prior`'s residuals may feed σ²_wm
    wm_prior: Any = None
    wm_unseen: Any = None
    wm: Any = None
    var_wm: Any = None
    sigma2_wm: Any = None
    resid_var: Any = None
    pred_var_mean: Any = None
    real_any: Any = None
    var_real_any: Any = None
    has_real_any: Any = None
    fallback: Any = None
    rewards: Any = None
    weight_wm: Any = None
    diagnostics: dict = {}


class EmptyState(NamedTuple):
    """The state of a piece that remembers nothing."""


class CorrectionPiece(NamedTuple):
    """`init() -> state`, `update(state, rows) -> (rows, state)`; `state`: the state's
    class, whose fields are fields of `CorrectionState`."""

    init: Callable[[], NamedTuple]
    update: Callable[[NamedTuple, Rows], tuple[Rows, NamedTuple]]
    state: type


def _stateless(update: Callable[[Rows], Rows]) -> CorrectionPiece:
    return CorrectionPiece(EmptyState, lambda state, rows: (update(rows), state), EmptyState)


# -- the real stream ----------------------------------------------------------
class ReplicateState(NamedTuple):
    """Sums of `(r_1 - r_2)^2 / 2` over replicate pairs, and their count."""

    replicate_sq: jax.Array
    replicate_count: jax.Array


def replicates(*, prior: float, prior_count: float) -> CorrectionPiece:
    """σ²_real from replicate pairs shrunk towards `prior`; a pair's mean is the real score."""

    def init():
        return ReplicateState(jnp.float32(0), jnp.float32(0))

    def update(state, rows):
        scores = cs.real_scores(
            state, rows.execution, rows.has_real, rows.replicate, prior=prior,
            prior_count=prior_count,
        )  # fmt: skip
        rows = rows._replace(
            real=scores.real, var_real=scores.var_real, sigma2_real=scores.sigma2_real,
            real_any=scores.real, var_real_any=scores.var_real, has_real_any=rows.has_real,
        )  # fmt: skip
        return rows, ReplicateState(scores.replicate_sq, scores.replicate_count)

    return CorrectionPiece(init, update, ReplicateState)


def anchor_memory() -> CorrectionPiece:
    """Rows not executed now but executed before: their remembered mean real reward, of
    variance σ²_real / executions, joins the real stream (never the map's buffer)."""

    def update(rows):
        if rows.known_real is None:
            return rows
        count = jnp.asarray(rows.known_count, jnp.float32)
        known = jnp.asarray(rows.known_real, jnp.float32)
        remembered = ~rows.has_real & jnp.isfinite(known) & (count > 0)
        return rows._replace(
            real_any=jnp.where(remembered, known, rows.real),
            var_real_any=jnp.where(
                remembered, rows.sigma2_real / jnp.maximum(count, 1), rows.var_real
            ),
            has_real_any=rows.has_real | remembered,
        )

    return _stateless(update)


# -- the anchor buffer and the map ----------------------------------------------
class AnchorMapState(NamedTuple):
    """The anchor ring buffer (`correction_state.AnchorBuffer`'s fields) and its map."""

    pred: jax.Array
    real: jax.Array
    weight: jax.Array
    valid: jax.Array
    task: jax.Array
    feat: jax.Array
    next_slot: jax.Array
    fit: isotonic.IsotonicFit


def anchor_buffer(
    *, capacity: int, width: int, decay: float, min_anchors: int, increasing: bool, backend: str
) -> CorrectionPiece:
    """Appends this step's anchor pairs to the ring buffer and refits the isotonic map.

    Sets ``buffer_before``, ``buffer``, ``slots``, ``had_map``/``has_map`` (at
    least `min_anchors` anchors) and ``fallback`` (the buffer's mean real
    reward, 0 while empty: the reward of a row with neither stream).
    """

    def init():
        s = cs.init_state(capacity, width)
        return AnchorMapState(*(getattr(s, f) for f in AnchorMapState._fields))

    def update(state, rows):
        appended, slots = cs.append_anchors(
            state, rows.pred, rows.real, rows.anchors, capacity, decay,
            weight=rows.weight, task=rows.task, feat=rows.feat,
        )  # fmt: skip
        fit = isotonic.isotonic_fit(
            appended.pred, appended.real, weights=appended.weight, mask=appended.valid,
            increasing=increasing, backend=backend,
        )  # fmt: skip
        new = AnchorMapState(*appended, fit)
        prior_mean = masked_mean(new.real, new.valid)
        rows = rows._replace(
            buffer_before=state, buffer=new, slots=slots,
            had_map=jnp.sum(state.valid) >= min_anchors, has_map=jnp.sum(new.valid) >= min_anchors,
            fallback=jnp.where(jnp.isnan(prior_mean), 0.0, prior_mean),
        )  # fmt: skip
        return rows, new

    return CorrectionPiece(init, update, AnchorMapState)


def debiased(fit: isotonic.IsotonicFit, has_map, pred, *, backend: str) -> jax.Array:
    """`pred` under `fit` where `has_map` (enough anchors), else unchanged (float32)."""
    pred = jnp.asarray(pred, jnp.float32)
    return jnp.where(has_map, isotonic.isotonic_predict(fit, pred, backend=backend), pred)


def isotonic_debias(*, backend: str) -> CorrectionPiece:
    """Online Debiasing: the WM streams go through the isotonic maps (before and after)."""

    def update(rows):
        before = lambda p: debiased(rows.buffer_before.fit, rows.had_map, p, backend=backend)
        after = lambda p: debiased(rows.buffer.fit, rows.has_map, p, backend=backend)
        wm_prior = before(rows.pred)
        return rows._replace(
            map_before=before, map_after=after, prior_gate=rows.had_map,
            wm_prior=wm_prior, wm_unseen=wm_prior, wm=after(rows.pred),
        )  # fmt: skip

    return _stateless(update)


def local_offsets(*, prior_count: float) -> CorrectionPiece:
    """Adds the local correction (`wmrl_jax.core.local`) to the WM streams, out of sample:
    ``wm_prior`` from earlier executions only, ``wm`` and ``wm_unseen`` from every
    execution but the row's own (``wm_unseen``'s residuals under the map fitted before)."""

    def offsets(buffer, resid_map, rows, exclude=None):
        resid = buffer.real - resid_map(buffer.pred)
        weight = jnp.where(buffer.valid, buffer.weight, 0.0)
        return local_lib.local_offsets(
            rows.task, rows.feat, buffer.task, buffer.feat, resid, weight,
            prior_count=prior_count, exclude=exclude,
        )  # fmt: skip

    def update(rows):
        prior = offsets(rows.buffer_before, rows.map_before, rows)[0]
        delta, exact = offsets(rows.buffer, rows.map_after, rows, exclude=rows.slots)
        unseen = offsets(rows.buffer, rows.map_before, rows, exclude=rows.slots)[0]
        diagnostics = {
            **rows.diagnostics,
            "local_abs_offset": masked_mean(jnp.abs(delta), rows.usable),
            "local_exact_weight": masked_mean(exact, rows.usable),
        }
        return rows._replace(
            wm_prior=rows.wm_prior + prior, wm=rows.wm + delta,
            wm_unseen=rows.wm_unseen + unseen, diagnostics=diagnostics,
        )  # fmt: skip

    return _stateless(update)


# -- the WM stream's variance ----------------------------------------------------
class WmVarianceState(NamedTuple):
    """Decayed moments of the out-of-sample residuals and of the WM's own variances."""

    resid: fusion.EmaVarianceState
    pred_var: fusion.EmaVarianceState


def wm_variance(*, var_decay: float, min_wm_var: float) -> CorrectionPiece:
    """σ²_wm: the decayed variance of ``execution - wm_prior`` on anchors (σ²_wm + σ²_real,
    one execution against the map), minus σ²_real, floored; the same for every usable row."""

    def init():
        return WmVarianceState(fusion.ema_variance_init(), fusion.ema_variance_init())

    def update(state, rows):
        wm = cs.wm_variance(
            state, rows.execution - rows.wm_prior, rows.anchors & rows.prior_gate,
            rows.pred_var, rows.anchors, rows.usable, rows.sigma2_real,
            var_decay=var_decay, min_wm_var=min_wm_var, per_sample=False,
        )  # fmt: skip
        rows = rows._replace(
            var_wm=wm.var_wm, sigma2_wm=wm.sigma2_wm, resid_var=wm.resid_var,
            pred_var_mean=wm.pred_var_stats.mean,
        )  # fmt: skip
        return rows, WmVarianceState(wm.resid, wm.pred_var_stats)

    return CorrectionPiece(init, update, WmVarianceState)


def per_sample_variance(*, min_wm_var: float) -> CorrectionPiece:
    """σ²_wm per row, scaled by the WM's own variance: `σ²_wm · var̂_i / E_anchors[var̂]`."""

    def update(rows):
        var_wm = cs.per_sample_scale(
            rows.sigma2_wm, rows.pred_var, rows.pred_var_mean, min_wm_var=min_wm_var
        )
        return rows._replace(var_wm=jnp.where(rows.usable, var_wm, jnp.inf))

    return _stateless(update)


# -- the fed rewards -------------------------------------------------------------
def inverse_variance_fusion() -> CorrectionPiece:
    """Inverse-Variance Denoising: a row with both streams gets their inverse-variance mean
    (an executed row's WM stream is ``wm_unseen``), a row with one gets it as it is (even
    while its variance is unknown), a row with neither the ``fallback``."""

    def update(rows):
        wm = jnp.where(rows.has_real, rows.wm_unseen, rows.wm)
        usable, has_real = rows.usable, rows.has_real_any
        both = usable & has_real
        fused, _ = fusion.inverse_variance_fuse(
            jnp.where(usable, wm, 0.0), rows.var_wm,
            jnp.where(has_real, rows.real_any, 0.0), rows.var_real_any,
        )  # fmt: skip
        one = jnp.where(usable, wm, jnp.where(has_real, rows.real_any, rows.fallback))
        weight_wm = jnp.where(both, fusion.fusion_weight(rows.var_wm, rows.var_real_any),
                              usable * 1.0)  # fmt: skip
        return rows._replace(rewards=jnp.where(both, fused, one), weight_wm=weight_wm)

    return _stateless(update)


def real_replaces_wm() -> CorrectionPiece:
    """A row with a real score is fed it; the others their WM stream (or the fallback)."""

    def update(rows):
        replace = rows.has_real_any
        rewards = jnp.where(replace, rows.real_any, rows.wm)
        return rows._replace(
            rewards=jnp.where(rows.usable | replace, rewards, rows.fallback),
            weight_wm=jnp.where(replace, 0.0, 1.0),
        )

    return _stateless(update)


def wm_only() -> CorrectionPiece:
    """Every row is fed its WM stream (the fallback where unusable); real scores are ignored."""

    def update(rows):
        return rows._replace(
            rewards=jnp.where(rows.usable, rows.wm, rows.fallback),
            weight_wm=jnp.ones_like(rows.wm),
        )

    return _stateless(update)
