"""The WMRL reward correction: Online Debiasing and Inverse-Variance Denoising.

Every step the world model (WM) predicts a reward `r̂` (and optionally a
variance) for every sample; a fraction of samples (anchors) is also executed
for real, giving `r`. `make_reward_correction(...)` returns an
`(init, update)` pair, in the style of optax's `GradientTransformation`:

    correction = make_reward_correction(capacity=512)
    state = correction.init()
    rewards, state, diagnostics = correction.update(
        state, pred_mean, pred_var, real, anchor_mask)

`update` does, in order:

1. **Out-of-sample residuals.** The map fitted at the previous step, `g`, is
   applied to this step's anchors; `r - g(r̂)` feeds an exponentially decayed
   variance estimate. Residuals are out of sample, so the estimate is not
   shrunk by the map having seen these very points, and `r` is one execution
   (also where a replicate pair is averaged below), so it estimates
   `σ²_wm + σ²_real`; `σ²_wm` is that minus `σ²_real`, floored.
2. **Anchor buffer.** New anchor pairs `(r̂, r)` enter a fixed-capacity ring
   buffer (oldest out); with `decay < 1` older pairs also lose weight
   geometrically each step.
3. **Online Debiasing.** A weighted isotonic map `g` is refitted on the buffer
   (`wmrl_jax.core.isotonic`) and applied to all predictions: `r̃ = g(r̂)`.
4. **Inverse-Variance Denoising.** Where a real score exists,
   `r* = (r̃/σ²_wm + r/σ²_real) / (1/σ²_wm + 1/σ²_real)`
   (`wmrl_jax.core.fusion`); elsewhere `r* = r̃`. For a row executed this
   step `r̃` is `g(r̂)` under the map of step 1, fitted before its execution:
   the refitted map has seen `r`, so its error would share the real score's,
   and the weights assume the two errors independent (the local correction
   likewise leaves the row's own execution out).

The buffer and the σ² estimates are the state's pieces
(`wmrl_jax.core.correction_state`): `σ²_real` comes from replicate
executions when the caller provides them, shrunk towards a configured prior,
or from the prior alone; with ``wm_var="per_sample"`` `σ²_wm` is scaled by
the WM's own variance, `var̂_i / E_anchors[var̂]`.

Bad input loses nothing: a prediction that could not be parsed is passed as
NaN mean and/or infinite variance; an anchor with a NaN real score is not an
anchor. A sample with neither a usable prediction nor a real score gets the
buffer's mean real reward (an uninformative reward, so its group advantage is
near zero) and is counted in the diagnostics.

The ablation arms of the paper are switches: ``debias`` (isotonic map on/off)
and ``ivd`` (fusion on/off; when off, real scores replace predictions where
they exist if ``use_real``, otherwise they are ignored).

Bad input raises ``ValueError``: inconsistent array shapes in `update` (chex
assertions, static and free under `jax.jit`) and invalid settings in
`make_reward_correction`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from wmrl_jax.core import fusion, isotonic
from wmrl_jax.core import local as local_lib
from wmrl_jax.core.correction_state import (
    CorrectionState,
    RealScores,
    WmVariance,
    append_anchors,
    init_state,
    real_scores,
    wm_variance,
)
from wmrl_jax.core.stats import masked_mean, rank_correlation

_WM_VAR_MODES = ("global", "per_sample")

# chex raises AssertionError by default; a wrong shape is bad input like any other.
_BAD_INPUT = {"exception_type": ValueError}


class RewardCorrection(NamedTuple):
    """The functions built by `make_reward_correction`.

    Attributes:
      init: `() -> CorrectionState`.
      update: `(state, pred_mean, pred_var, real, anchor_mask, *,
        real_replicate=None) -> (rewards, state, diagnostics)`.
      debias: `(state, pred_mean) -> debiased`: the state's map applied to
        predictions of any shape (identity while debiasing is off or fewer
        than `min_anchors` anchors were seen), i.e. the WM-only reward stream.
    """

    init: Callable[[], CorrectionState]
    update: Callable[..., tuple[jax.Array, CorrectionState, dict[str, jax.Array]]]
    debias: Callable[[CorrectionState, jax.Array], jax.Array]


def _check_update_shapes(pred_mean, pred_var, real, anchor_mask, **optional) -> None:
    named = {"pred_var": pred_var, "real": real, "anchor_mask": anchor_mask}
    named.update({k: v for k, v in optional.items() if v is not None})
    others = "`, `".join(named)
    message = f"correction update: `pred_mean` must have shape [N], and `{others}` the same shape"
    chex.assert_rank(pred_mean, 1, custom_message=message, **_BAD_INPUT)
    chex.assert_equal_shape([pred_mean, *named.values()], custom_message=message, **_BAD_INPUT)


def _rewards(
    debiased, var_wm, real, var_real, usable_pred, has_real, fallback, *, ivd, use_real
) -> tuple[jax.Array, jax.Array]:
    """The rewards r* of shape [N] and the weight on the WM in each, of shape [N].

    With `ivd`, debiased predictions and real scores are fused by inverse
    variance where both exist, and a sample with one of them gets it as it is
    (even while its variance is unknown, inf); without `ivd` a real score
    replaces the prediction (if `use_real`). A sample with neither gets `fallback`.
    """
    if ivd:
        both = usable_pred & has_real
        fused, _ = fusion.inverse_variance_fuse(
            jnp.where(usable_pred, debiased, 0.0), var_wm, jnp.where(has_real, real, 0.0), var_real
        )
        one = jnp.where(usable_pred, debiased, jnp.where(has_real, real, fallback))
        weight_wm = jnp.where(both, fusion.fusion_weight(var_wm, var_real), usable_pred * 1.0)
        return jnp.where(both, fused, one), weight_wm
    replace = has_real & use_real
    weight_wm = jnp.where(replace, 0.0, 1.0)
    rewards = jnp.where(replace, real, debiased)
    return jnp.where(usable_pred | replace, rewards, fallback), weight_wm


def _diagnostics(
    state, pred_mean, real, prev, masks, had_map, wm: WmVariance, scores: RealScores, weight_wm
) -> dict[str, jax.Array]:
    """Float32 scalars describing one update; `state` is the updated one.

    `masks` is `(usable_pred, has_real, anchors)`, each bool of shape [N];
    `prev` is the previous map applied to `pred_mean` (out of sample).
    """
    usable_pred, has_real, anchors = masks
    return {
        "n_anchors": jnp.sum(anchors, dtype=jnp.float32),
        "n_unusable": jnp.sum(~usable_pred & ~has_real, dtype=jnp.float32),
        "buffer_size": jnp.sum(state.valid, dtype=jnp.float32),
        "map_knots": state.fit.n_knots.astype(jnp.float32),
        "bias_raw": masked_mean(pred_mean - real, anchors),
        "bias_debiased": masked_mean(prev - real, anchors & had_map),
        "abs_bias_raw": masked_mean(jnp.abs(pred_mean - real), anchors),
        "abs_bias_debiased": masked_mean(jnp.abs(prev - real), anchors & had_map),
        "sigma2_wm": wm.sigma2_wm,
        "sigma2_real": scores.sigma2_real,
        "resid_var": wm.resid_var,
        "fused_weight_wm": masked_mean(weight_wm, has_real & usable_pred),
        "rank_corr": rank_correlation(state.pred, state.real, state.valid),
    }


def make_reward_correction(
    *,
    capacity: int = 1024,
    debias: bool = True,
    ivd: bool = True,
    use_real: bool = True,
    decay: float = 1.0,
    var_decay: float = 0.99,
    real_var_prior: float = 1e-3,
    real_var_prior_count: float = 4.0,
    wm_var: str = "global",
    min_wm_var: float = 1e-6,
    min_anchors: int = 8,
    increasing: bool = True,
    backend: str = "auto",
    local: bool = False,
    local_features: int = 0,
    local_prior_count: float = 2.0,
) -> RewardCorrection:
    """Builds the WMRL reward correction.

    Args:
      capacity: anchor-buffer size C (fixed under jit).
      debias: apply the isotonic map fitted on anchors (Online Debiasing).
      ivd: fuse debiased predictions with real scores (Inverse-Variance
        Denoising). Without it, real scores replace predictions where they
        exist if `use_real`, and are ignored otherwise.
      use_real: see `ivd`.
      decay: per-step weight decay of older anchors in the fit (1: a plain
        window of the last C anchors).
      var_decay: per-sample decay of the residual-variance estimate.
      real_var_prior: prior for σ²_real, the variance of one real execution.
      real_var_prior_count: pseudo-count of the prior against replicate pairs.
      wm_var: "global" (one σ²_wm) or "per_sample" (scaled by the WM's own
        variance per sample).
      min_wm_var: floor of σ²_wm, so fusion never trusts the WM as exact.
      min_anchors: the map is applied only once the buffer holds at least this
        many anchors; before, predictions pass through unchanged (a map fitted
        on a handful of points clips everything to their narrow range).
      increasing: direction of the map (the WM's scale is increasing in r).
      backend: isotonic backend ("auto", "native", "xla").
      local: add the local correction (`wmrl_jax.core.local`) to the debiased
        predictions: the shrunk residuals of executed programs of the same
        task and nearby features, out of sample (a row never uses its own
        execution); `update` then takes `task` (and `features`).
      local_features: F, the number of categorical program features per row
        (0: "near" is "same task").
      local_prior_count: κ, the pseudo-count of each back-off level.

    Returns:
      A `RewardCorrection(init, update, debias)`.

    Raises:
      ValueError: on a setting outside its range or an unknown `wm_var`.

    Example:
      >>> c = make_reward_correction(capacity=8)
      >>> state = c.init()
      >>> rewards, state, diag = c.update(
      ...     state, jnp.array([0.9, 0.8]), jnp.ones(2), jnp.array([0.5, jnp.nan]),
      ...     jnp.array([True, False]))
      >>> rewards.shape
      (2,)
    """
    if min_anchors < 1:
        raise ValueError(f"min_anchors must be >= 1, got {min_anchors}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if wm_var not in _WM_VAR_MODES:
        raise ValueError(f"wm_var must be one of {_WM_VAR_MODES}, got {wm_var!r}")
    if not 0.0 < decay <= 1.0 or not 0.0 < var_decay <= 1.0:
        raise ValueError(f"decay and var_decay must be in (0, 1], got {decay}, {var_decay}")
    if real_var_prior <= 0 or real_var_prior_count < 0 or min_wm_var <= 0:
        raise ValueError("real_var_prior and min_wm_var must be > 0, real_var_prior_count >= 0")
    if local_features < 0 or local_prior_count <= 0:
        raise ValueError("local_features must be >= 0 and local_prior_count > 0")
    width = max(local_features, 1)  # Stored features; a constant column when F = 0.

    real_settings = dict(prior=real_var_prior, prior_count=real_var_prior_count)
    wm_settings = dict(
        var_decay=var_decay, min_wm_var=min_wm_var, per_sample=wm_var == "per_sample"
    )

    def init() -> CorrectionState:
        return init_state(capacity, width)

    def debias_fn(state, pred_mean):
        pred_mean = jnp.asarray(pred_mean, jnp.float32)
        if not debias:
            return pred_mean
        mapped = isotonic.isotonic_predict(state.fit, pred_mean, backend=backend)
        return jnp.where(jnp.sum(state.valid) >= min_anchors, mapped, pred_mean)

    def local_fn(state, task_ids, feats, exclude=None, map_state=None):
        """Local offsets of shape [N] from `state`'s buffer, residuals under its map
        (or under `map_state`'s)."""
        resid = state.real - debias_fn(state if map_state is None else map_state, state.pred)
        weight = jnp.where(state.valid, state.weight, 0.0)
        return local_lib.local_offsets(
            task_ids, feats, state.task, state.feat, resid, weight,
            prior_count=local_prior_count, exclude=exclude,
        )  # fmt: skip

    def row_inputs(n, task, features, anchor_weight):
        """Task ids [N], features [N, width] and anchor weights [N], defaults filled in."""
        if local and task is None:
            raise ValueError("correction update: the local correction needs `task` ids")
        task_ids = jnp.zeros(n, jnp.int32) if task is None else jnp.asarray(task, jnp.int32)
        if features is None:
            feats = jnp.zeros((n, width), jnp.int32)
        else:
            feats = jnp.asarray(features, jnp.int32)
            if feats.shape != (n, local_features) or local_features == 0:
                raise ValueError(
                    f"correction update: `features` must have shape [N, {local_features}] "
                    f"(local_features), got {feats.shape}"
                )
        weight = jnp.ones(n) if anchor_weight is None else jnp.asarray(anchor_weight)
        return task_ids, feats, weight.astype(jnp.float32)

    def update(
        state,
        pred_mean,
        pred_var,
        real,
        anchor_mask,
        *,
        real_replicate=None,
        known_real=None,
        known_count=None,
        task=None,
        features=None,
        anchor_weight=None,
    ):
        """Corrects one step's rewards.

        Args:
          state: a `CorrectionState`.
          pred_mean: WM predictions r̂ of shape [N] (NaN: unparseable).
          pred_var: WM predictive variances of shape [N] (inf: unparseable;
            only used with wm_var="per_sample" and to mark unusable samples).
          real: real rewards r of shape [N] (NaN or anything where not run).
          anchor_mask: bool of shape [N], samples that were executed.
          real_replicate: optional second real score of shape [N] (NaN where
            absent); pairs estimate σ²_real and the mean is used as `r`.
          known_real: optional anchor memory of shape [N]: the mean real reward
            of the sample's program from earlier executions (NaN where never
            executed). Used for samples not executed this step, as a real
            score of variance σ²_real / `known_count`; never appended to the
            map's buffer (that pair was appended when it was executed).
          known_count: executions behind `known_real`, shape [N].
          task: int task ids of shape [N] (needed with `local`); stored with
            the anchors.
          features: int program features of shape [N, local_features] (local
            correction; default: none, i.e. same task is near).
          anchor_weight: optional weights of this step's anchor pairs in the
            map's fit, shape [N]: 1/π for anchors drawn with inclusion
            probability π (`wmrl_jax.core.anchors.ipw_weights`); default 1.

        Returns:
          `(rewards, new_state, diagnostics)`: corrected rewards r* of shape
          [N] (float32, finite), and a dict of float32 scalars.

        Raises:
          ValueError: if `pred_mean` is not of rank 1 or the other arrays do
            not have its shape.
        """
        pred_mean = jnp.asarray(pred_mean, jnp.float32)
        _check_update_shapes(
            pred_mean, pred_var, real, anchor_mask, real_replicate=real_replicate,
            known_real=known_real, known_count=known_count, task=task,
            anchor_weight=anchor_weight,
        )  # fmt: skip
        task_ids, feats, weight = row_inputs(pred_mean.shape[0], task, features, anchor_weight)
        pred_var = jnp.asarray(pred_var, jnp.float32)
        real = jnp.asarray(real, jnp.float32)
        usable_pred = jnp.isfinite(pred_mean) & ~(pred_var == jnp.inf) & ~jnp.isnan(pred_var)
        has_real = jnp.asarray(anchor_mask, bool) & jnp.isfinite(real)
        scores = real_scores(state, real, has_real, real_replicate, **real_settings)
        single, real = real, scores.real  # one execution; the replicate mean where paired

        # 1. Out-of-sample residuals against the previous map.
        anchors = has_real & usable_pred
        had_map = jnp.sum(state.valid) >= min_anchors
        prev = held_out = debias_fn(state, pred_mean)  # the map fitted before this step
        if local:  # This step's anchors are not in the buffer yet: out of sample.
            prev = prev + local_fn(state, task_ids, feats)[0]
        resid_mask = anchors & (had_map | (not debias))
        wm = wm_variance(
            state,
            single - prev,  # variance σ²_wm + σ²_real: one execution against the map
            resid_mask,
            pred_var,
            anchors,
            usable_pred,
            scores.sigma2_real,
            **wm_settings,
        )

        # 2-3. Append anchors, refit the map, debias every prediction.
        buffer, slots = append_anchors(
            state, pred_mean, real, anchors, capacity, decay,
            weight=weight, task=task_ids, feat=feats,
        )  # fmt: skip
        fit = isotonic.isotonic_fit(
            buffer.pred,
            buffer.real,
            weights=buffer.weight,
            mask=buffer.valid,
            increasing=increasing,
            backend=backend,
        )
        refit = state._replace(fit=fit, **buffer._asdict())
        debiased = debias_fn(refit, pred_mean)
        offsets = exact = jnp.zeros_like(pred_mean)
        if local:  # A row never counts its own execution (`slots`).
            offsets, exact = local_fn(refit, task_ids, feats, exclude=slots)
            debiased = debiased + offsets
            # This step's other anchors count, as residuals under the map fitted before.
            held_out += local_fn(refit, task_ids, feats, exclude=slots, map_state=state)[0]
        prior_mean = masked_mean(buffer.real, buffer.valid)
        fallback = jnp.where(jnp.isnan(prior_mean), 0.0, prior_mean)

        # 4. Fuse where a real score exists: executed now, or remembered.
        fused_real, var_real, has_any = real, scores.var_real, has_real
        if known_real is not None:
            count = jnp.asarray(known_count, jnp.float32)
            known = jnp.asarray(known_real, jnp.float32)
            remembered = ~has_real & jnp.isfinite(known) & (count > 0)
            fused_real = jnp.where(remembered, known, real)
            var_real = jnp.where(
                remembered, scores.sigma2_real / jnp.maximum(count, 1), scores.var_real
            )
            has_any = has_real | remembered
        # A row executed now is fused with a WM stream that has not seen its execution:
        # the map fitted before (the refitted one has, and its error would be correlated
        # with the real score's, which the fusion's weights assume away).
        rewards, weight_wm = _rewards(
            jnp.where(has_real, held_out, debiased) if ivd else debiased,
            wm.var_wm,
            fused_real,
            var_real,
            usable_pred,
            has_any,
            fallback,
            ivd=ivd,
            use_real=use_real,
        )

        new_state = CorrectionState(
            **buffer._asdict(),
            fit=fit,
            resid=wm.resid,
            pred_var=wm.pred_var_stats,
            replicate_sq=scores.replicate_sq,
            replicate_count=scores.replicate_count,
            step=state.step + 1,
        )
        masks = (usable_pred, has_real, anchors)
        diagnostics = _diagnostics(
            new_state, pred_mean, real, prev, masks, had_map, wm, scores, weight_wm
        )
        diagnostics["n_remembered"] = jnp.sum(has_any & ~has_real, dtype=jnp.float32)
        if local:
            diagnostics["local_abs_offset"] = masked_mean(jnp.abs(offsets), usable_pred)
            diagnostics["local_exact_weight"] = masked_mean(exact, usable_pred)
        return rewards, new_state, diagnostics

    return RewardCorrection(init, update, debias_fn)
