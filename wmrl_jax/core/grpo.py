"""Group Relative Policy Optimisation (GRPO): advantages, clipped loss, KL, aggregation.

For every prompt, G completions are sampled from the old policy ``pi_old`` and
scored. GRPO needs no value network: a completion's advantage is its reward
relative to its group, ``A_i = (r_i - mean(r)) / (std(r) + eps)``, shared by all
its tokens. The policy is trained with the PPO clipped surrogate plus a KL
penalty to a frozen reference policy, per token t:

    rho_t  = pi(y_t | ...) / pi_old(y_t | ...)
    loss_t = -min(rho_t A, clip(rho_t, 1 - clip_low, 1 + clip_high) A)
             + kl_coef * KL_t(pi || pi_ref),

and the per-token losses are reduced over valid tokens (see `aggregate`).

Functions are pure, written for one group (advantages) or elementwise per
token, and batched by the caller with ``jax.vmap`` or broadcasting. Reward and
log-probability arithmetic runs in float32 whatever the input dtype.
String-valued hyperparameters (``mode``, ``kl_estimator``, ``aggregation``)
select code paths and must be static under ``jax.jit``.

Bad input raises ``ValueError`` naming the function and the argument, whether
it is a shape (checked at entry with chex assertions, which read only static
shapes and so cost nothing under ``jax.jit``) or a value (an unknown mode, a
negative clip range). The same holds in every module of `wmrl_jax.core`.

References: Shao et al. 2024 (DeepSeekMath, GRPO); Schulman et al. 2017 (PPO);
Yu et al. 2025 (DAPO, clip-higher); Liu et al. 2025 (Dr.GRPO); Ahmadian et al.
2024 (RLOO); Schulman 2020, "Approximating KL divergence" (k1, k2, k3).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

ADVANTAGE_MODES = ("std", "mean", "loo")
KL_ESTIMATORS = ("k1", "k2", "k3")
AGGREGATION_MODES = ("token_mean", "seq_mean_token_mean", "seq_sum_norm")

# exp(20) ~ 4.9e8 is far from float32 overflow (~3.4e38) while a log-ratio of 20
# between policy and reference already means the KL term is enormous.
K3_LOG_RATIO_BOUND = 20.0


def _f32(x) -> Array:
    return jnp.asarray(x, dtype=jnp.float32)


# chex raises AssertionError by default; a wrong shape is bad input like any other.
_BAD_INPUT = {"exception_type": ValueError}


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {choices}.")


def _is_static_number(x) -> bool:
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool)


def group_advantages(rewards, *, mode: str = "std", eps: float = 1e-6, mask=None) -> Array:
    """Group-relative advantages for ONE group of completions.

    With ``n`` valid members, ``mean`` and ``std`` (population, ddof=0) taken
    over the valid members only:

    * ``"std"`` (GRPO):        ``A_i = (r_i - mean) / (std + eps)``
    * ``"mean"`` (Dr.GRPO):    ``A_i = r_i - mean``
    * ``"loo"`` (RLOO):        ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean)``

    Masked members (whose rewards may hold anything, NaN included) get 0, and so
    does a group with fewer than 2 valid members. Equal valid rewards give
    exactly zeros with finite gradients. Batch over groups with ``jax.vmap``.

    Args:
      rewards: rewards of the group, of shape [G].
      mode: ``"std"``, ``"mean"`` or ``"loo"``; static under jit.
      eps: added to the std in ``"std"`` mode; unused otherwise.
      mask: optional validity mask of shape [G] (bool); all valid when None.

    Returns:
      Advantages of shape [G], float32.

    Raises:
      ValueError: on a rank other than 1, an empty group, a mask of another shape
        or an unknown mode.

    Example:
      >>> import jax.numpy as jnp
      >>> group_advantages(jnp.array([1.0, 2.0, 3.0, 4.0]), mode="mean").tolist()
      [-1.5, -0.5, 0.5, 1.5]
      >>> group_advantages(jnp.array([1.0, 2.0, 3.0, 4.0]), mode="loo").tolist()[::3]
      [-2.0, 2.0]
    """
    _check_choice("advantage mode", mode, ADVANTAGE_MODES)
    if _is_static_number(eps) and eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}.")
    rewards = _f32(rewards)
    chex.assert_rank(
        rewards,
        1,
        custom_message="group_advantages: `rewards` is one group [G]; vmap over groups",
        **_BAD_INPUT,
    )
    chex.assert_axis_dimension_gt(
        rewards,
        0,
        0,
        custom_message="group_advantages: `rewards` needs at least one member",
        **_BAD_INPUT,
    )
    if mask is None:
        valid = jnp.ones(rewards.shape, dtype=bool)
    else:
        valid = jnp.asarray(mask).astype(bool)
        chex.assert_equal_shape(
            [rewards, valid],
            custom_message="group_advantages: `rewards` and `mask`",
            **_BAD_INPUT,
        )

    weights = valid.astype(jnp.float32)
    count = jnp.sum(weights)
    safe_count = jnp.maximum(count, 1.0)
    rewards = jnp.where(valid, rewards, 0.0)
    # Centre on one valid member before averaging: equal rewards then give
    # exactly zero deviations (a plain mean can be off by one ulp), and large
    # reward offsets do not cost precision. The result does not depend on the
    # shift, so no gradient needs to flow through it.
    shift = jax.lax.stop_gradient(rewards[jnp.argmax(valid)])
    shifted = jnp.where(valid, rewards - shift, 0.0)
    centred = jnp.where(valid, shifted - jnp.sum(shifted) / safe_count, 0.0)

    if mode == "std":
        variance = jnp.sum(centred**2) / safe_count
        # Double where: sqrt has an infinite derivative at 0 and eps may be 0, so
        # the branch that is not taken must still see a safe argument.
        positive = variance > 0.0
        std = jnp.sqrt(jnp.where(positive, variance, 1.0))
        advantages = jnp.where(positive, centred / (std + eps), 0.0)
    elif mode == "mean":
        advantages = centred
    else:  # "loo"
        advantages = centred * (count / jnp.maximum(count - 1.0, 1.0))
    return jnp.where(count >= 2.0, advantages, 0.0)


def importance_ratio(logp, old_logp) -> Array:
    """Per-token importance ratio ``exp(logp - old_logp)``, in float32.

    It overflows for a log-ratio above ~88, far outside any trust region.

    Args:
      logp: log-probabilities of the sampled tokens under the policy, of any shape.
      old_logp: log-probabilities under the sampling policy, same shape as ``logp``.

    Returns:
      The ratio ``pi / pi_old``, float32, shape of ``logp``.

    Example:
      >>> import jax.numpy as jnp
      >>> importance_ratio(jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))).tolist()
      [2.0]
    """
    logp, old_logp = _f32(logp), _f32(old_logp)
    chex.assert_equal_shape(
        [logp, old_logp], custom_message="importance_ratio: `logp` and `old_logp`", **_BAD_INPUT
    )
    return jnp.exp(logp - old_logp)


def clipped_surrogate(
    logp, old_logp, advantages, *, clip_low: float = 0.2, clip_high: float | None = None
) -> tuple[Array, Array, Array]:
    """Per-token PPO clipped surrogate, as a loss (the negated objective).

    ``loss_t = -min(rho_t A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) A_t)``
    with ``rho_t = exp(logp_t - old_logp_t)``. ``clip_high`` defaults to
    ``clip_low`` (symmetric PPO clipping); ``clip_high > clip_low`` is DAPO's
    "clip-higher", which lets low-probability tokens with positive advantage grow
    further before the update is cut off.

    Args:
      logp: policy log-probabilities of the sampled tokens, e.g. of shape [B, T].
      old_logp: sampling-policy log-probabilities, same shape as ``logp``.
      advantages: advantages broadcastable to ``logp``'s shape, e.g. of shape
        [B, 1] (per sequence), [B, T] (per token) or a scalar.
      clip_low: lower clip range; the ratio is clipped below at ``1 - clip_low``.
      clip_high: upper clip range; the ratio is clipped above at ``1 + clip_high``.

    Returns:
      ``(loss, ratio, clipped)``, each of ``logp``'s shape: the per-token loss
      (float32), the importance ratio (float32) and a bool that is True where the
      clipped branch is strictly the minimum, i.e. where the token's gradient is
      zero (ratio out of range in the direction the advantage pushes it).

    Raises:
      ValueError: on mismatched shapes or clip ranges outside ``[0, 1)`` / ``[0, inf)``.

    Example:
      >>> import jax.numpy as jnp
      >>> loss, ratio, clipped = clipped_surrogate(
      ...     jnp.log(jnp.array([1.5, 1.5])), jnp.zeros(2), jnp.array([1.0, -1.0]))
      >>> [round(x, 4) for x in loss.tolist()], clipped.tolist()
      ([-1.2, 1.5], [True, False])
    """
    clip_high = clip_low if clip_high is None else clip_high
    if _is_static_number(clip_low) and not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must lie in [0, 1), got {clip_low}.")
    if _is_static_number(clip_high) and clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}.")
    ratio = importance_ratio(logp, old_logp)
    advantages = _f32(advantages)
    chex.assert_is_broadcastable(
        advantages.shape,
        ratio.shape,
        custom_message="clipped_surrogate: `advantages` must broadcast to the shape of `logp`",
        **_BAD_INPUT,
    )
    unclipped = ratio * advantages
    clipped_objective = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -jnp.minimum(unclipped, clipped_objective)
    clipped = clipped_objective < unclipped
    return loss, ratio, clipped


def _kl_inputs(fn_name: str, logp, ref_logp) -> tuple[Array, Array]:
    logp, ref_logp = _f32(logp), _f32(ref_logp)
    chex.assert_equal_shape(
        [logp, ref_logp], custom_message=f"{fn_name}: `logp` and `ref_logp`", **_BAD_INPUT
    )
    return logp, ref_logp


def kl_k1(logp, ref_logp) -> Array:
    """Per-token k1 estimate of KL(pi || pi_ref): ``logp - ref_logp``.

    Unbiased for the KL when the tokens are drawn from ``pi``, but high-variance
    and negative on some samples. Used directly as a loss term it does not pull
    the policy toward the reference: with the samples held fixed its gradient is
    ``grad log pi(x)``, and by the score-function identity
    ``E_{x~pi}[grad log pi(x)] = sum_x grad pi(x) = grad 1 = 0``, so its gradient
    is pure noise in expectation. k1 is useful as a reward penalty (where it is
    multiplied by the score function) or as a metric; as a loss prefer k2 or k3
    (whose expected gradients are ``grad KL(pi || pi_ref)`` and
    ``grad KL(pi_ref || pi)`` respectively).

    Args:
      logp: policy log-probabilities of tokens sampled from the policy, any shape.
      ref_logp: reference log-probabilities of the same tokens, same shape.

    Returns:
      Per-token estimates, float32, shape of ``logp``.

    Example:
      >>> import jax.numpy as jnp
      >>> kl_k1(jnp.array([-1.0]), jnp.array([-1.5])).tolist()
      [0.5]
    """
    logp, ref_logp = _kl_inputs("kl_k1", logp, ref_logp)
    return logp - ref_logp


def kl_k2(logp, ref_logp) -> Array:
    """Per-token k2 estimate of KL(pi || pi_ref): ``0.5 * (logp - ref_logp)**2``.

    Non-negative and low-variance but biased (it matches the KL to second order
    when the policies are close). As a loss its expected gradient under samples
    from ``pi`` is exactly ``grad KL(pi || pi_ref)``. Args and returns as in `kl_k1`.

    Example:
      >>> import jax.numpy as jnp
      >>> kl_k2(jnp.array([-1.0]), jnp.array([-1.5])).tolist()
      [0.125]
    """
    logp, ref_logp = _kl_inputs("kl_k2", logp, ref_logp)
    return 0.5 * jnp.square(logp - ref_logp)


def kl_k3(logp, ref_logp) -> Array:
    """Per-token k3 estimate of KL(pi || pi_ref), the default in `grpo_loss`.

    ``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1``: unbiased under samples
    from ``pi`` (``E[exp(ref_logp - logp)] = 1``), always >= 0 (``e^x >= 1 + x``),
    and low-variance (Schulman 2020). As a loss its expected gradient under
    samples from ``pi`` is ``grad KL(pi_ref || pi)``, which is zero only at
    ``pi == pi_ref``. The log-ratio inside the exponential is clamped to
    ``[-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND]`` = [-20, 20] so that it cannot
    overflow; the linear term is not clamped. Args and returns as in `kl_k1`.

    Example:
      >>> import jax.numpy as jnp
      >>> kl_k3(jnp.array([-1.0]), jnp.array([-1.0])).tolist()
      [0.0]
    """
    logp, ref_logp = _kl_inputs("kl_k3", logp, ref_logp)
    log_ratio = ref_logp - logp
    bounded = jnp.clip(log_ratio, -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return jnp.exp(bounded) - log_ratio - 1.0


_KL_FUNCTIONS: dict[str, Callable[[Array, Array], Array]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def _check_aggregation(mode: str, norm_constant) -> None:
    _check_choice("aggregation mode", mode, AGGREGATION_MODES)
    if mode == "seq_sum_norm":
        if norm_constant is None:
            raise ValueError("aggregation 'seq_sum_norm' requires norm_constant (e.g. max length).")
        if _is_static_number(norm_constant) and norm_constant <= 0:
            raise ValueError(f"norm_constant must be positive, got {norm_constant}.")


def aggregate(values, mask, *, mode: str = "token_mean", norm_constant: float | None = None):
    """Reduces per-token values of shape [B, T] to a scalar over valid tokens.

    With ``m`` the mask and ``n_b = sum_t m_bt``:

    * ``"token_mean"``: ``sum_bt v m / max(sum_bt m, 1)``, every valid token weighs
      the same (long sequences weigh more).
    * ``"seq_mean_token_mean"``: ``mean_{b: n_b > 0} (sum_t v_bt m_bt / n_b)``,
      every non-empty sequence weighs the same (original GRPO).
    * ``"seq_sum_norm"``: ``sum_bt v m / (B * norm_constant)`` (Dr.GRPO), a
      length-independent normaliser; ``norm_constant`` is typically the maximum
      generation length.

    Masked values are ignored even when NaN or inf; an all-false mask gives 0.

    Args:
      values: per-token values of shape [B, T].
      mask: validity mask of shape [B, T] (bool, or 0/1 numbers).
      mode: one of `AGGREGATION_MODES`; static under jit.
      norm_constant: positive normaliser, required by ``"seq_sum_norm"``.

    Returns:
      A float32 scalar.

    Raises:
      ValueError: on ranks other than 2, mismatched shapes, an unknown mode, or a
        missing or non-positive ``norm_constant`` for ``"seq_sum_norm"``.

    Example:
      >>> import jax.numpy as jnp
      >>> values = jnp.array([[1.0, 3.0], [5.0, 0.0]])
      >>> mask = jnp.array([[True, True], [True, False]])
      >>> float(aggregate(values, mask)), float(aggregate(values, mask, mode="seq_mean_token_mean"))
      (3.0, 3.5)
      >>> float(aggregate(values, mask, mode="seq_sum_norm", norm_constant=4))
      1.125
    """
    _check_aggregation(mode, norm_constant)
    values = _f32(values)
    valid = jnp.asarray(mask).astype(bool)
    chex.assert_rank(values, 2, custom_message="aggregate: `values` is [B, T]", **_BAD_INPUT)
    chex.assert_equal_shape(
        [values, valid], custom_message="aggregate: `values` and `mask`", **_BAD_INPUT
    )

    weights = valid.astype(jnp.float32)
    masked = jnp.where(valid, values, 0.0)
    if mode == "token_mean":
        return jnp.sum(masked) / jnp.maximum(jnp.sum(weights), 1.0)
    if mode == "seq_mean_token_mean":
        tokens_per_seq = jnp.sum(weights, axis=-1)
        seq_means = jnp.sum(masked, axis=-1) / jnp.maximum(tokens_per_seq, 1.0)
        nonempty = (tokens_per_seq > 0).astype(jnp.float32)
        return jnp.sum(seq_means * nonempty) / jnp.maximum(jnp.sum(nonempty), 1.0)
    num_seqs = max(values.shape[0], 1)
    return jnp.sum(masked) / (num_seqs * _f32(norm_constant))


def grpo_loss(
    logp,
    old_logp,
    ref_logp,
    advantages,
    mask,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    aggregation: str = "token_mean",
    norm_constant: float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """GRPO policy loss over a batch of sequences, with training metrics.

    Per token ``clipped_surrogate(...)[0] + kl_coef * kl_<kl_estimator>(logp, ref_logp)``,
    reduced with `aggregate`. ``old_logp``, ``ref_logp`` and ``advantages`` are
    constants (gradients stopped). Masked log-probs are replaced by 0 first, so
    padding may hold anything (-inf, NaN) without reaching the loss or its gradient.

    Args:
      logp: policy log-probabilities of the sampled tokens, of shape [B, T].
      old_logp: sampling-policy log-probabilities, of shape [B, T].
      ref_logp: reference-policy log-probabilities, of shape [B, T]; may be None
        when ``kl_coef`` is a static 0.
      advantages: per-sequence advantages, of shape [B] (e.g. `group_advantages`
        vmapped over groups and flattened).
      mask: valid-token mask (completion tokens, not prompt or padding), of
        shape [B, T].
      clip_low, clip_high: clip ranges, see `clipped_surrogate`.
      kl_coef: weight of the KL-to-reference term.
      kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``; static under jit.
      aggregation: reduction mode of `aggregate`; static under jit.
      norm_constant: normaliser for ``aggregation="seq_sum_norm"``.

    Returns:
      ``(loss, metrics)``: the float32 scalar loss and a dict of float32 scalars.
      ``"loss"`` is the returned loss; the others are means over valid tokens:
      ``"pg_loss"`` (clipped surrogate), ``"kl"`` (the chosen estimator; 0 when
      ``ref_logp`` is None), ``"clip_frac"``, ``"ratio_mean"``, ``"adv_mean"``,
      and ``"ratio_min"`` / ``"ratio_max"`` over valid tokens (1 when there are
      none). With ``aggregation="token_mean"``, ``loss == pg_loss + kl_coef * kl``.

    Raises:
      ValueError: on wrong ranks or shapes, unknown modes, or a missing ``ref_logp``
        or ``norm_constant``.

    Example:
      >>> import jax.numpy as jnp
      >>> logp = jnp.log(jnp.full((2, 3), 0.5))
      >>> loss, metrics = grpo_loss(logp, logp, logp, jnp.array([1.0, -1.0]),
      ...                           jnp.ones((2, 3), bool), kl_coef=0.1)
      >>> float(loss), float(metrics["clip_frac"]), float(metrics["ratio_mean"])
      (0.0, 0.0, 1.0)
    """
    _check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    _check_aggregation(aggregation, norm_constant)
    logp, old_logp, advantages = _f32(logp), _f32(old_logp), _f32(advantages)
    valid = jnp.asarray(mask).astype(bool)
    chex.assert_rank(logp, 2, custom_message="grpo_loss: `logp` is [B, T]", **_BAD_INPUT)
    chex.assert_equal_shape(
        [logp, old_logp, valid],
        custom_message="grpo_loss: `logp`, `old_logp` and `mask`",
        **_BAD_INPUT,
    )
    chex.assert_shape(
        advantages,
        logp.shape[:1],
        custom_message="grpo_loss: `advantages` is [B], one per sequence",
        **_BAD_INPUT,
    )
    if ref_logp is None:
        if not (_is_static_number(kl_coef) and kl_coef == 0):
            raise ValueError("ref_logp is required unless kl_coef is a static 0.")
    else:
        ref_logp = _f32(ref_logp)
        chex.assert_equal_shape(
            [logp, ref_logp], custom_message="grpo_loss: `logp` and `ref_logp`", **_BAD_INPUT
        )

    # Double where: padding may hold -inf/NaN log-probs, whose exp or square
    # would turn the zero cotangent of a masked token into NaN.
    def clean(x):
        return jnp.where(valid, x, 0.0)

    logp = clean(logp)
    old_logp = jax.lax.stop_gradient(clean(old_logp))
    advantages = jax.lax.stop_gradient(advantages)

    pg_tokens, ratio, clipped = clipped_surrogate(
        logp, old_logp, advantages[:, None], clip_low=clip_low, clip_high=clip_high
    )
    if ref_logp is None:
        kl_tokens = jnp.zeros_like(logp)
    else:
        ref_logp = jax.lax.stop_gradient(clean(ref_logp))
        kl_tokens = _KL_FUNCTIONS[kl_estimator](logp, ref_logp)
    loss = aggregate(
        pg_tokens + kl_coef * kl_tokens, valid, mode=aggregation, norm_constant=norm_constant
    )

    def token_mean(x):
        return aggregate(x, valid, mode="token_mean")

    any_valid = jnp.any(valid)
    lowest = jnp.min(jnp.where(valid, ratio, jnp.inf), initial=jnp.inf)
    highest = jnp.max(jnp.where(valid, ratio, -jnp.inf), initial=-jnp.inf)
    metrics = {
        "loss": loss,
        "pg_loss": token_mean(pg_tokens),
        "kl": token_mean(kl_tokens),
        "clip_frac": token_mean(clipped),
        "ratio_mean": token_mean(ratio),
        "ratio_min": jnp.where(any_valid, lowest, 1.0),
        "ratio_max": jnp.where(any_valid, highest, 1.0),
        "adv_mean": token_mean(jnp.broadcast_to(advantages[:, None], logp.shape)),
    }
    return loss, metrics
