"""The WMRL reward correction: Online Debiasing and Inverse-Variance Denoising.

Every step the world model (WM) predicts a reward `r̂` (and optionally a
variance) for every sample; a fraction of samples (anchors) is also executed
for real, giving `r`. `make_reward_correction(...)` returns a
`RewardCorrection(init, update, debias)`, in the style of optax's
`GradientTransformation`:

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

The correction is a chain of small pieces (`wmrl_jax.core.correction_pieces`:
replicates, anchor buffer, isotonic debiasing, local offsets, σ²_wm, anchor
memory, and one way of forming the reward), each an `init`/`update` pair over
its own part of `CorrectionState`, none with a switch. The arms' settings
(``debias``, ``ivd``, ``use_real``, ``local``, ``wm_var``) only choose which
pieces are chained (`correction_pieces`); anchor memory acts where the caller
passes remembered means.

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

from wmrl_jax.core import correction_pieces as pieces
from wmrl_jax.core.correction_state import CorrectionState
from wmrl_jax.core.stats import masked_mean, rank_correlation

_WM_VAR_MODES = ("global", "per_sample")

# chex raises AssertionError by default; a wrong shape is bad input like any other.
_BAD_INPUT = {"exception_type": ValueError}


class RewardCorrection(NamedTuple):
    """The functions built by `make_reward_correction`.

    Attributes:
      init: `() -> CorrectionState`.
      update: `(state, pred_mean, pred_var, real, anchor_mask, *,
        real_replicate=None, ...) -> (rewards, state, diagnostics)`.
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


def _check_settings(
    capacity, decay, var_decay, real_var_prior, real_var_prior_count, wm_var, min_wm_var,
    min_anchors, local_features, local_prior_count,
):  # fmt: skip
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


def usable_predictions(pred_mean, pred_var) -> jax.Array:
    """bool of the shape of `pred_mean`: predictions the correction can use.

    A prediction that could not be made is one of infinite (or NaN) variance,
    whatever its mean (an agent may return a finite placeholder mean), or one
    whose mean is not finite.
    """
    pred_var = jnp.asarray(pred_var, jnp.float32)
    return jnp.isfinite(pred_mean) & ~(pred_var == jnp.inf) & ~jnp.isnan(pred_var)


def _diagnostics(state: CorrectionState, rows: pieces.Rows) -> dict[str, jax.Array]:
    """Float32 scalars describing one update; `state` is the updated one."""
    anchors, real, prior = rows.anchors, rows.real, rows.wm_prior
    return {
        "n_anchors": jnp.sum(anchors, dtype=jnp.float32),
        "n_unusable": jnp.sum(~rows.usable & ~rows.has_real, dtype=jnp.float32),
        "buffer_size": jnp.sum(state.valid, dtype=jnp.float32),
        "map_knots": state.fit.n_knots.astype(jnp.float32),
        "bias_raw": masked_mean(rows.pred - real, anchors),
        "bias_debiased": masked_mean(prior - real, anchors & rows.had_map),
        "abs_bias_raw": masked_mean(jnp.abs(rows.pred - real), anchors),
        "abs_bias_debiased": masked_mean(jnp.abs(prior - real), anchors & rows.had_map),
        "sigma2_wm": rows.sigma2_wm,
        "sigma2_real": rows.sigma2_real,
        "resid_var": rows.resid_var,
        "fused_weight_wm": masked_mean(rows.weight_wm, rows.has_real & rows.usable),
        "rank_corr": rank_correlation(state.pred, state.real, state.valid),
        "n_remembered": jnp.sum(rows.has_real_any & ~rows.has_real, dtype=jnp.float32),
        **rows.diagnostics,
    }


def chain(*chained: pieces.CorrectionPiece) -> tuple[Callable, Callable]:
    """`(init, update)` of `chained` in order, over one `CorrectionState`.

    Each piece reads and writes its own fields of the state; together the
    pieces must hold every field but ``step``, which the chain counts.
    ``update(state, rows) -> (rows, state)``.
    """
    owned = [f for p in chained for f in p.state._fields]
    missing = set(CorrectionState._fields) - set(owned) - {"step"}
    if missing or len(owned) != len(set(owned)):
        raise ValueError(f"correction chain: state fields unowned {sorted(missing)} or shared")

    def init() -> CorrectionState:
        fields = {}
        for piece in chained:
            fields.update(piece.init()._asdict())
        return CorrectionState(**fields, step=jnp.int32(0))

    def update(state: CorrectionState, rows: pieces.Rows):
        fields = {}
        for piece in chained:
            own = piece.state(*(getattr(state, f) for f in piece.state._fields))
            rows, own = piece.update(own, rows)
            fields.update(own._asdict())
        return rows, CorrectionState(**fields, step=state.step + 1)

    return init, update


def step_rows(
    pred_mean, pred_var, real, anchor_mask, *, real_replicate=None, known_real=None,
    known_count=None, task=None, features=None, anchor_weight=None, local: bool = False,
    local_features: int = 0,
) -> pieces.Rows:  # fmt: skip
    """The chain's input `Rows` for one step: the update's arguments, checked and filled in.

    `update(state, ...)` takes the same arguments after the state and returns
    `(rewards, new_state, diagnostics)`: corrected rewards r* of shape [N]
    (float32, finite), and a dict of float32 scalars.

    Args:
      pred_mean: WM predictions r̂ of shape [N] (NaN: unparseable).
      pred_var: WM predictive variances of shape [N] (inf or NaN:
        unparseable; the values are read with wm_var="per_sample").
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
      local: whether the chain has the local correction (then `task` is needed).
      local_features: F.
      anchor_weight: optional weights of this step's anchor pairs in the
        map's fit, shape [N]: 1/π for anchors drawn with inclusion
        probability π (`wmrl_jax.core.anchors.ipw_weights`); default 1.

    Raises:
      ValueError: if `pred_mean` is not of rank 1 or the other arrays do
        not have its shape.
    """
    pred_mean = jnp.asarray(pred_mean, jnp.float32)
    _check_update_shapes(
        pred_mean, pred_var, real, anchor_mask, real_replicate=real_replicate,
        known_real=known_real, known_count=known_count, task=task, anchor_weight=anchor_weight,
    )  # fmt: skip
    n, width = pred_mean.shape[0], max(local_features, 1)
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
    pred_var = jnp.asarray(pred_var, jnp.float32)
    execution = jnp.asarray(real, jnp.float32)  # one execution (a replicate pair: later)
    usable = usable_predictions(pred_mean, pred_var)
    has_real = jnp.asarray(anchor_mask, bool) & jnp.isfinite(execution)
    return pieces.Rows(
        pred=pred_mean, pred_var=pred_var, execution=execution, has_real=has_real,
        usable=usable, anchors=has_real & usable, replicate=real_replicate,
        known_real=known_real, known_count=known_count, task=task_ids, feat=feats,
        weight=weight.astype(jnp.float32), map_before=_identity, map_after=_identity,
        wm_prior=pred_mean, wm_unseen=pred_mean, wm=pred_mean,
    )  # fmt: skip


def _identity(pred):
    return jnp.asarray(pred, jnp.float32)


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
    """Builds the WMRL reward correction: the chain of pieces these settings choose.

    Args:
      capacity: anchor-buffer size C (fixed under jit).
      debias: chain `isotonic_debias` (Online Debiasing).
      ivd: form the reward with `inverse_variance_fusion` (Inverse-Variance
        Denoising). Without it, `real_replaces_wm` if `use_real`, else `wm_only`.
      use_real: see `ivd`.
      decay: per-step weight decay of older anchors in the fit (1: a plain
        window of the last C anchors).
      var_decay: per-sample decay of the residual-variance estimate.
      real_var_prior: prior for σ²_real, the variance of one real execution.
      real_var_prior_count: pseudo-count of the prior against replicate pairs.
      wm_var: "global" (one σ²_wm) or "per_sample" (chain `per_sample_variance`).
      min_wm_var: floor of σ²_wm, so fusion never trusts the WM as exact.
      min_anchors: the map is applied only once the buffer holds at least this
        many anchors; before, predictions pass through unchanged (a map fitted
        on a handful of points clips everything to their narrow range).
      increasing: direction of the map (the WM's scale is increasing in r).
      backend: isotonic backend ("auto", "native", "xla").
      local: chain `local_offsets` (`wmrl_jax.core.local`); `update` then
        takes `task` (and `features`).
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
    _check_settings(capacity, decay, var_decay, real_var_prior, real_var_prior_count,
                    wm_var, min_wm_var, min_anchors, local_features, local_prior_count)  # fmt: skip
    width = max(local_features, 1)  # Stored features; a constant column when F = 0.
    chained = [
        pieces.replicates(prior=real_var_prior, prior_count=real_var_prior_count),
        pieces.anchor_buffer(
            capacity=capacity, width=width, decay=decay, min_anchors=min_anchors,
            increasing=increasing, backend=backend,
        ),
    ]  # fmt: skip
    if debias:
        chained.append(pieces.isotonic_debias(backend=backend))
    if local:
        chained.append(pieces.local_offsets(prior_count=local_prior_count))
    chained.append(pieces.wm_variance(var_decay=var_decay, min_wm_var=min_wm_var))
    if wm_var == "per_sample":
        chained.append(pieces.per_sample_variance(min_wm_var=min_wm_var))
    chained.append(pieces.anchor_memory())
    if ivd:
        chained.append(pieces.inverse_variance_fusion())
    else:
        chained.append(pieces.real_replaces_wm() if use_real else pieces.wm_only())
    init, run = chain(*chained)

    def debias_fn(state, pred_mean):
        if not debias:
            return _identity(pred_mean)
        has_map = jnp.sum(state.valid) >= min_anchors
        return pieces.debiased(state.fit, has_map, pred_mean, backend=backend)

    def update(state, pred_mean, pred_var, real, anchor_mask, **extras):
        """`(rewards [N], new_state, diagnostics)` of one step; the arguments after the
        state are `step_rows`'s (ValueError on bad shapes)."""
        rows = step_rows(pred_mean, pred_var, real, anchor_mask, local=local,
                         local_features=local_features, **extras)  # fmt: skip
        rows, new_state = run(state, rows)
        return rows.rewards, new_state, _diagnostics(new_state, rows)

    return RewardCorrection(init, update, debias_fn)
