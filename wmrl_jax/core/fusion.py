"""Inverse-variance fusion of two noisy estimates, and an online variance estimator.

The Inverse-Variance Denoising (IVD) step of WMRL fuses a debiased world-model
reward `r̃` (variance `σ²_wm`) with a real execution score `r` (variance
`σ²_real`) with variance-optimal weights:

    r* = (r̃ / σ²_wm + r / σ²_real) / (1 / σ²_wm + 1 / σ²_real),
    var(r*) = σ²_wm σ²_real / (σ²_wm + σ²_real),

which is below either stream's variance. `σ²_wm` is estimated online from
anchor residuals with an exponentially decayed mean and variance
(`ema_variance_init` / `ema_variance_update` / `ema_variance`; with `decay=1`
it pools all samples equally); `wmrl_jax.core.correction` shows the use.

Conventions shared by every function here:

* An infinite variance means "unknown": the value carries no information. A
  world-model prediction that could not be parsed is a prediction with infinite
  variance, and its value (possibly NaN) is never read when another source
  exists.
* A zero variance means "exact": that source wins outright.
* Estimators with too few samples report an infinite variance (unknown) unless
  the caller passes a prior through `default=`.

Every function is a pure function of arrays: jit-able, vmap-able, fixed shapes,
no Python branching on traced values. The estimator is an `init` / `update`
pair over a `NamedTuple` state.

Bad input raises ``ValueError`` naming the function and the argument: array
shapes are checked with chex assertions (static, free under `jax.jit`);
shapes that do not broadcast, complex values, a non-floating `dtype` and a
concrete `decay` outside [0, 1] are checked by value.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
Shape = tuple[int, ...]

# chex raises AssertionError by default; a wrong shape is bad input like any other.
_BAD_INPUT = {"exception_type": ValueError}


def _fusion_dtype(fn_name: str, **arrays: ArrayLike) -> jnp.dtype:
    """Common floating dtype of `arrays`: at least float32, float64 only under x64."""
    for name, x in arrays.items():
        if jnp.iscomplexobj(x):
            raise ValueError(f"{fn_name}: `{name}` must be real, got dtype {jnp.result_type(x)}.")
    return jnp.result_type(*arrays.values(), jnp.float32)


def _broadcast_shape(fn_name: str, **arrays: ArrayLike) -> Shape:
    """The common broadcast shape of `arrays` (chex checks one-way broadcasts only)."""
    shapes = {name: tuple(jnp.shape(x)) for name, x in arrays.items()}
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        listed = ", ".join(f"{name}{list(shape)}" for name, shape in shapes.items())
        raise ValueError(f"{fn_name}: shapes are not broadcastable: {listed}.") from None


def _clean_variance(var: Array) -> Array:
    """Maps negative and subnormal variances to exact zeros; keeps 0, inf and NaN.

    Negative variances are invalid and clipped at 0 (with zero gradient).
    Subnormal ones are flushed to 0 here because some backends (XLA:CPU among
    them) flush them anyway inside compiled code; flushing them explicitly makes
    results independent of the backend and of jit, and keeps gradients, which
    scale like 1 / variance, finite. NaN is left alone so that it propagates.
    """
    tiny = jnp.finfo(var.dtype).tiny
    return jnp.where((var < tiny) & (var != 0), jnp.zeros_like(var), var)


def _regular(var_a: Array, var_b: Array) -> Array:
    """Where the textbook formula applies: no infinite variance, not both zero."""
    both_zero = (var_a == 0) & (var_b == 0)
    return ~(jnp.isposinf(var_a) | jnp.isposinf(var_b) | both_zero)


@jax.custom_jvp
def _fusion_terms(var_a: Array, var_b: Array) -> tuple[Array, Array, Array]:
    """Weights on `a` and `b`, and the fused variance, for cleaned variances."""
    lo = jnp.minimum(var_a, var_b)
    hi = jnp.maximum(var_a, var_b)
    # Everything follows from one ratio t = lo / hi in [0, 1]: neither 1 / var
    # nor var_a + var_b is formed, so nothing overflows or underflows. It also
    # covers most edge cases: t = 0 when hi is inf (ignore that source) or lo
    # is 0 (exact source). Both 0 or both inf (0/0, inf/inf) weigh equally.
    tie = (hi == 0) | jnp.isposinf(lo)
    t = jnp.where(tie, 1.0, lo / jnp.where(tie, 1.0, hi))
    w_hi = t / (1 + t)  # weight on the noisier source, in [0, 1/2]
    w_lo = 1 - w_hi  # in [1/2, 1], so the subtraction loses nothing
    a_is_lo = var_a <= var_b
    w_a = jnp.where(a_is_lo, w_lo, w_hi)
    w_b = jnp.where(a_is_lo, w_hi, w_lo)
    # var_a var_b / (var_a + var_b) = lo w_lo, accurate even when hi / lo
    # exceeds the float range; it is var_b when var_a = inf, and inf or 0 when
    # both variances are.
    return w_a, w_b, lo * w_lo


@_fusion_terms.defjvp
def _fusion_terms_jvp(primals, tangents):
    # Differentiating through t = lo / hi would divide tangents by the larger
    # variance and multiply them back: 1 / 3e38 is subnormal, flushed to zero
    # in compiled code, and 1 / hi**2 overflows for small variances. The
    # closed forms below are exact and involve no such round trip:
    #   d w_a = (w_b d var_b - w_a d var_a) / (var_a + var_b),  d w_b = -d w_a,
    #   d fused_var = w_a² d var_a + w_b² d var_b.
    # Irregular entries have pinned weights; the fused variance follows the
    # surviving source there (inf_a: d fused_var = d var_b).
    var_a, var_b = primals
    dvar_a, dvar_b = tangents
    w_a, w_b, fused_var = _fusion_terms(var_a, var_b)
    regular = _regular(var_a, var_b)
    total = jnp.where(regular, var_a + var_b, 1.0)
    dw_a = jnp.where(regular, (w_b * dvar_b - w_a * dvar_a) / total, 0.0)
    one_inf = jnp.isposinf(var_a) ^ jnp.isposinf(var_b)
    dfused_var = jnp.where(
        regular | one_inf, jnp.square(w_a) * dvar_a + jnp.square(w_b) * dvar_b, 0.0
    )
    return (w_a, w_b, fused_var), (dw_a, -dw_a, dfused_var)


def fusion_weight(var_a: ArrayLike, var_b: ArrayLike) -> Array:
    """Weight on the first source in an inverse-variance fusion.

    `w_a = (1 / var_a) / (1 / var_a + 1 / var_b) = var_b / (var_a + var_b)`, in
    [0, 1]; the weight on the second source is `1 - w_a`. Special cases follow
    `inverse_variance_fuse`: 1 when `var_b` is inf or `var_a` is 0 (and the
    other is not), 0 in the mirrored cases, 1/2 when both are inf or both are 0.
    Negative and subnormal variances count as 0; a NaN variance gives NaN.

    Args:
      var_a: variance of the first source, any shape broadcastable with `var_b`.
      var_b: variance of the second source.

    Returns:
      `w_a` of the broadcast shape, float32 at least.

    Example:
      >>> float(fusion_weight(1.0, 3.0))
      0.75
      >>> float(fusion_weight(2.0, float("inf")))
      1.0
    """
    dtype = _fusion_dtype("fusion_weight", var_a=var_a, var_b=var_b)
    shape = _broadcast_shape("fusion_weight", var_a=var_a, var_b=var_b)
    var_a, var_b = (
        _clean_variance(jnp.broadcast_to(jnp.asarray(x, dtype), shape)) for x in (var_a, var_b)
    )
    w_a, _, _ = _fusion_terms(var_a, var_b)
    return w_a


def inverse_variance_fuse(
    a: ArrayLike, var_a: ArrayLike, b: ArrayLike, var_b: ArrayLike
) -> tuple[Array, Array]:
    """Fuses two independent unbiased estimates by inverse-variance weighting.

        fused     = (a / var_a + b / var_b) / (1 / var_a + 1 / var_b)
                  = (a var_b + b var_a) / (var_a + var_b),
        fused_var = var_a var_b / (var_a + var_b)  <=  min(var_a, var_b).

    Computed from the ratio of the smaller to the larger variance, so that
    variances anywhere in the float range neither overflow nor underflow, and
    the weights sum to 1 up to rounding. Edge cases:

    * `var_a = inf`: `a` is ignored (it may be NaN or inf):
      `fused = b`, `fused_var = var_b`; mirrored for `var_b = inf`.
    * Both inf: nothing is known. `fused = (a + b) / 2` (the equal-variance
      limit), skipping a NaN value if only one is NaN; `fused_var = inf`.
      Callers must treat an infinite variance as "unknown".
    * `var_a = 0` (and `var_b > 0`): `a` is exact: `fused = a`, `fused_var = 0`
      (`b` is ignored and may be NaN); mirrored for `var_b = 0`.
    * Both 0: `fused = (a + b) / 2`, `fused_var = 0`.
    * Negative variances are invalid and clipped at 0; subnormal variances are
      flushed to 0 (so "exact"), whatever the backend's denormal mode.
    * NaN variances, and NaN values with a non-zero weight, propagate.

    Gradients with respect to all four arguments are finite at every edge case
    above: where the weights are pinned (an infinite variance, both variances
    zero, clipped ones) they do not depend on the variances; at a single zero
    variance the one-sided derivative is returned. Elsewhere gradients are
    exact (closed forms, also in forward mode); those of `fused` with respect
    to the variances scale like `|a - b| / (var_a + var_b)`.

    Args:
      a: first estimate (e.g. the debiased world-model reward), any shape.
      var_a: variance of `a`, broadcastable with `a`, `b` and `var_b`.
      b: second estimate (e.g. the real execution score).
      var_b: variance of `b`.

    Returns:
      `(fused, fused_var)`, both of the broadcast shape of the four arguments,
      in their common floating dtype with float32 as the minimum (float64 is
      kept when x64 is enabled).

    Raises:
      ValueError: if the shapes do not broadcast or an argument is complex.

    Example:
      >>> fused, fused_var = inverse_variance_fuse(0.0, 1.0, 3.0, 3.0)
      >>> float(fused), float(fused_var)
      (0.75, 0.75)
      >>> fused, fused_var = inverse_variance_fuse(float("nan"), float("inf"), 3.0, 2.0)
      >>> float(fused), float(fused_var)
      (3.0, 2.0)
    """
    arrays = dict(a=a, var_a=var_a, b=b, var_b=var_b)
    dtype = _fusion_dtype("inverse_variance_fuse", **arrays)
    shape = _broadcast_shape("inverse_variance_fuse", **arrays)
    a, var_a, b, var_b = (jnp.broadcast_to(jnp.asarray(x, dtype), shape) for x in arrays.values())
    var_a, var_b = _clean_variance(var_a), _clean_variance(var_b)
    w_a, w_b, fused_var = _fusion_terms(var_a, var_b)
    # With nothing known about either source, still avoid returning NaN when
    # one of the values exists (an unparseable prediction next to a real one).
    both_inf = jnp.isposinf(var_a) & jnp.isposinf(var_b)
    skip_a = both_inf & jnp.isnan(a) & ~jnp.isnan(b)
    skip_b = both_inf & jnp.isnan(b) & ~jnp.isnan(a)
    w_a = jnp.where(skip_a, 0.0, jnp.where(skip_b, 1.0, w_a))
    w_b = jnp.where(skip_b, 0.0, jnp.where(skip_a, 1.0, w_b))
    # A non-finite value with zero weight is never read: 0 * NaN would poison
    # the value, and d(w * x)/dw = x the gradient (double-`where`). Finite
    # values with zero weight are read so that d fused / d var stays exact.
    a = jnp.where((w_a > 0) | jnp.isfinite(a), a, 0.0)
    b = jnp.where((w_b > 0) | jnp.isfinite(b), b, 0.0)
    fused = w_a * a + w_b * b
    return fused, fused_var


def _estimator_dtype(fn_name: str, dtype) -> jnp.dtype:
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{fn_name}: dtype must be floating, got {dtype}.")
    # Reward statistics are kept in float32 at least, whatever the model dtype.
    return jnp.promote_types(dtype, jnp.float32)


def _sample_shape(fn_name: str, shape) -> Shape:
    """`shape` as a tuple of ints: an int n is (n,)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        raise ValueError(f"{fn_name}: shape must be a tuple of non-negative ints, got {shape}.")
    return tuple(int(d) for d in shape)


def _batch_moments(
    fn_name: str, x: ArrayLike, mask: ArrayLike | None, sample_shape: Shape, dtype
) -> tuple[Array, Array, Array]:
    """Count, mean and centred sum of squares of the valid rows of `x` [N, *shape]."""
    x = jnp.asarray(x)
    chex.assert_shape(
        x,
        (None, *sample_shape),
        custom_message=f"{fn_name}: `x` must have shape [N, *{list(sample_shape)}] (the state's)",
        **_BAD_INPUT,
    )
    num = x.shape[0]
    if mask is None:
        mask = jnp.ones((num,), bool)
    mask = jnp.asarray(mask)
    chex.assert_shape(
        mask, (num,), custom_message=f"{fn_name}: `mask` must have shape [N] of `x`", **_BAD_INPUT
    )
    mask = mask.astype(bool)
    row_mask = mask.reshape((num,) + (1,) * len(sample_shape))
    count = jnp.sum(mask, dtype=jnp.int32)
    # Masked-out rows may hold anything (NaN included): replace them before use.
    x = jnp.where(row_mask, x.astype(dtype), 0.0)
    mean = jnp.sum(x, axis=0) / jnp.maximum(count, 1).astype(dtype)
    # Two-pass (centred) sum of squares: no cancellation within the batch.
    m2 = jnp.sum(jnp.where(row_mask, jnp.square(x - mean), 0.0), axis=0)
    return count, mean, m2


def _chan_combine(
    n_a: Array, mean_a: Array, m2_a: Array, n_b: Array, mean_b: Array, m2_b: Array
) -> tuple[Array, Array, Array]:
    """Pooled (total weight, mean, centred sum of squares) of two sets.

    Chan, Golub & LeVeque (1979): with n = n_a + n_b and d = mean_b - mean_a,
    mean = mean_a + d n_b / n and m2 = m2_a + m2_b + d² n_a n_b / n. Weights
    may be real (decayed) numbers; an empty union keeps `mean_a`.
    """
    n = n_a + n_b
    frac_b = jnp.where(n > 0, n_b / jnp.where(n > 0, n, 1.0), 0.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * frac_b
    m2 = m2_a + m2_b + jnp.square(delta) * (n_a * frac_b)
    return n, mean, m2


class EmaVarianceState(NamedTuple):
    """Exponentially decayed weighted mean and variance.

    Every sample enters with weight 1; the weight of everything older is
    multiplied by `decay` once per newer sample. Normalising by the accumulated
    weight (rather than by `1 / (1 - decay)`) removes the bias towards the
    initial zeros, as Adam's bias correction does.

    Attributes:
      mean: weighted mean, of shape [*shape].
      var: weighted population variance around `mean`, of shape [*shape].
      weight: sum of the sample weights `W`, of shape [].
      weight_sq: sum of the squared sample weights, of shape []; gives the
        effective sample size `W² / weight_sq` used to unbias `var`.
    """

    mean: Array
    var: Array
    weight: Array
    weight_sq: Array


def ema_variance_init(shape: Shape = (), dtype=jnp.float32) -> EmaVarianceState:
    """Empty exponentially decayed variance state for samples of shape `shape`.

    Args:
      shape: shape of one sample.
      dtype: floating dtype of the statistics; promoted to float32 at least.

    Returns:
      An `EmaVarianceState` with zero weight.

    Example:
      >>> state = ema_variance_init()
      >>> state = ema_variance_update(state, jnp.array([1.0, 3.0]), decay=0.9)
      >>> float(ema_variance(state))
      2.0
    """
    shape = _sample_shape("ema_variance_init", shape)
    dtype = _estimator_dtype("ema_variance_init", dtype)
    zeros = jnp.zeros(shape, dtype)
    scalar = jnp.zeros((), dtype)
    return EmaVarianceState(mean=zeros, var=zeros, weight=scalar, weight_sq=scalar)


def ema_variance_update(
    state: EmaVarianceState,
    x: ArrayLike,
    *,
    decay: ArrayLike,
    mask: ArrayLike | None = None,
) -> EmaVarianceState:
    """Folds a batch into an exponentially decayed mean and variance.

    The n valid samples of a batch count as n samples of weight 1 each, arriving
    together: the older weight is multiplied by `decay**n`, and the order of
    samples within a batch does not matter. A batch of one sample is the usual
    sequential EMA step; with `decay = 1` the state pools all samples equally
    (and `ema_variance` is the sample variance with ddof 1).

    Args:
      state: the current `EmaVarianceState`.
      x: samples of shape [N, *shape], where `shape` is that of `state.mean`.
      decay: forgetting factor per sample, in [0, 1]; may be traced.
      mask: optional bool of shape [N]; only samples where it is True count.
        A batch without valid samples leaves the state unchanged.

    Returns:
      The updated `EmaVarianceState`.

    Raises:
      ValueError: if shapes do not match, or a concrete `decay` is outside [0, 1].
    """
    if isinstance(decay, (int, float, np.number)) and not 0.0 <= decay <= 1.0:
        raise ValueError(f"ema_variance_update: decay must lie in [0, 1], got {decay}.")
    dtype = state.mean.dtype
    shape = tuple(state.mean.shape)
    n_b, mean_b, m2_b = _batch_moments("ema_variance_update", x, mask, shape, dtype)
    n_b = n_b.astype(dtype)
    # 0 ** 0 == 1: a batch with no valid samples does not decay the past.
    old = jnp.power(jnp.asarray(decay, dtype), n_b)
    w_old = state.weight * old
    weight, mean, m2 = _chan_combine(w_old, state.mean, state.var * w_old, n_b, mean_b, m2_b)
    var = jnp.where(weight > 0, m2 / jnp.where(weight > 0, weight, 1.0), 0.0)
    weight_sq = state.weight_sq * jnp.square(old) + n_b
    return EmaVarianceState(mean=mean, var=var, weight=weight, weight_sq=weight_sq)


def ema_variance(state: EmaVarianceState, *, default: ArrayLike = jnp.inf) -> Array:
    """Unbiased exponentially weighted variance of the samples so far.

    With weights w_i, `W = Σ w_i` and effective sample size
    `n_eff = W² / Σ w_i²`, the reliability-weights estimate is

        var_unbiased = var · n_eff / (n_eff - 1) = var · W / (W - Σ w_i² / W),

    which reduces to the ddof-1 sample variance when all weights are 1. With a
    single effective sample (`n_eff` within rounding of 1, which includes no
    samples at all) the variance is unknown and `default` is returned.

    Args:
      state: an `EmaVarianceState`.
      default: returned when the variance is unknown. The default, inf, means
        "unknown" to `inverse_variance_fuse`; pass a prior variance instead
        to fall back on it. Broadcastable to `state.mean.shape`.

    Returns:
      Variance of shape [*shape]; never NaN for finite inputs.
    """
    dtype = state.var.dtype
    weight = state.weight
    denom = weight - state.weight_sq / jnp.where(weight > 0, weight, 1.0)
    # n_eff - 1 at the rounding level of W is one sample seen through rounding.
    known = denom > jnp.finfo(dtype).eps * weight
    return jnp.where(
        known,
        state.var * weight / jnp.where(known, denom, 1.0),
        jnp.asarray(default, dtype),
    )
