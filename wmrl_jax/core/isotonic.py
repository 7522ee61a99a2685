"""Weighted isotonic regression with fixed shapes: fit and piecewise-linear apply.

`isotonic_fit` solves, for one problem,

    min_f  sum_i w_i (y_i - f(x_i))^2   subject to f non-decreasing (or non-increasing)

with the weighted pool-adjacent-violators algorithm (PAV), and returns the knots
of the fitted map; `isotonic_predict` evaluates it by linear interpolation
between knots, clipping outside the fitted range. Together they reproduce

    sklearn.isotonic.IsotonicRegression(increasing=..., out_of_bounds="clip")
        .fit(x, y, sample_weight=weights).predict(x_new)

for unsorted `x`, ties in `x`, zero weights, and the decreasing direction.
Ties follow scikit-learn's rule exactly: after sorting, a point joins the
current group while it lies less than the dtype's resolution (1e-6 in
float32, 1e-15 in float64) above the group's first point; a group is pooled
by weighted mean and placed at its first point.

Everything has fixed shapes so the online anchor buffer can be fitted under
`jax.jit`: a buffer of `n` slots with a `mask` of valid entries compiles once.
Masked entries, entries with weight <= 0 and entries with a non-finite `x` or
`y` have no influence. Both functions are written for one problem and batch
with `jax.vmap` (e.g. one map per task).

Two implementations compute the same function:

* ``backend="native"``: C++ kernels called from XLA through the FFI on the CPU
  (radix sort, O(n) PAV, a sorted-merge predict), batched natively under
  `vmap`. Built on first use; see `wmrl_jax.core._native`.
* ``backend="xla"``: pure `jax.numpy` / `lax` (a stable sort, segment sums and
  a fixed-trip PAV loop that stays O(n) per problem under `vmap`); runs on any
  platform and is the reference the native path is tested against.

``backend="auto"`` (default) takes the native kernels on CPU when they are
available and the XLA path on every other platform.

Bad input raises ``ValueError`` naming the argument: shapes are checked at
entry with chex assertions (static, free under `jax.jit`), an unknown backend
by value. Asking for ``backend="native"`` where the kernels cannot be built
raises ``RuntimeError``.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax import lax

from wmrl_jax.core import _native

_BACKENDS = ("auto", "native", "xla")

# chex raises AssertionError by default; a wrong shape is bad input like any other.
_BAD_INPUT = {"exception_type": ValueError}


class IsotonicFit(NamedTuple):
    """Knots of a fitted monotone piecewise-linear map (one problem).

    Attributes:
      x: knot positions of shape [n], strictly increasing over the first
        `n_knots` entries; the remaining entries repeat the last knot.
      y: fitted values at the knots, of shape [n], padded the same way.
      n_knots: int32 scalar, the number of distinct valid `x` values. Zero
        means the fit saw no valid data; `isotonic_predict` then returns its
        input unchanged (the identity map: "no correction").
    """

    x: jax.Array
    y: jax.Array
    n_knots: jax.Array


def _float_dtype(*arrays) -> jnp.dtype:
    return jnp.result_type(*[a for a in arrays if a is not None], jnp.float32)


def _check_backend(backend: str) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")


def _dispatch(backend: str, native_fn, xla_fn, *args):
    """Calls the native kernel on CPU where allowed and available, else XLA."""
    _check_backend(backend)
    if backend == "xla":
        return xla_fn(*args)
    if not _native.load("isotonic"):
        if backend == "native":
            raise RuntimeError(
                "backend='native' requested but the native isotonic kernels could not be "
                "built or are disabled (WMRL_JAX_NATIVE=0); see the logged warning."
            )
        return xla_fn(*args)
    if backend == "native":
        return native_fn(*args)
    return lax.platform_dependent(*args, cpu=native_fn, default=xla_fn)


# ----------------------------------------------------------------------------
# Fit.


def _fit_native(x, y, w, increasing):
    shapes = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32),
    )
    call = jax.ffi.ffi_call(_native.target("WmrlIsotonicFit"), shapes, vmap_method="broadcast_all")
    return call(x, y, w, increasing=bool(increasing))


def _pav_blocks(gwy, gw, n_groups):
    """Weighted PAV over `n_groups` pooled points, as a fixed-trip loop.

    Each step either merges the top block of a stack into the one below it
    (when they violate monotonicity) or pushes the next point. Every point is
    pushed once and every merge pops one block, so 2n steps always suffice.

    Two details keep this O(n), measured rather than assumed:
    * the top block lives in scalar carries, and a step's write to the stack
      arrays is deferred to the start of the next step. A step therefore
      writes first and reads after, so no read of the old array is live when
      it is updated; reading before writing in the same step lets XLA fuse the
      read into consumers scheduled after the write, which forces a copy of
      the whole stack every step (O(n^2));
    * the trip count is fixed, so under `vmap` the loop predicate stays
      unbatched and batching never becomes a select over the whole carried
      state per step.

    Args:
      gwy: weighted sums sum(w*y) per pooled point, of shape [n].
      gw: weight sums per pooled point, of shape [n] (> 0 for the first
        `n_groups` entries).
      n_groups: int32 scalar, number of valid pooled points.

    Returns:
      `(bwy, bw, bend, top)`: block sums and one-past-the-end point index of
      each block, of shape [n], and the number of blocks.
    """
    n = gwy.shape[0]

    def write(stack, pending):
        pos, *values = pending
        return tuple(a.at[pos].set(v) for a, v in zip(stack, values, strict=True))

    def step(_, carry):
        i, top, cur, pending, stack = carry
        stack = write(stack, pending)
        below = jnp.maximum(top - 2, 0)
        prev_wy, prev_w, prev_end = (a[below] for a in stack)
        cur_wy, cur_w, cur_end = cur
        # Compare block means by cross-multiplying (weights are positive).
        merge = (top >= 2) & (prev_wy * cur_w > cur_wy * prev_w)
        push = ~merge & (i < n_groups)
        # A push stores the current top block at slot top - 1; otherwise slot
        # `below` is rewritten with its own value (a no-op).
        store = push & (top >= 1)
        pending = (
            jnp.where(store, top - 1, below),
            jnp.where(store, cur_wy, prev_wy),
            jnp.where(store, cur_w, prev_w),
            jnp.where(store, cur_end, prev_end),
        )
        ic = jnp.minimum(i, n - 1)
        cur = (
            jnp.where(merge, prev_wy + cur_wy, jnp.where(push, gwy[ic], cur_wy)),
            jnp.where(merge, prev_w + cur_w, jnp.where(push, gw[ic], cur_w)),
            jnp.where(push, i + 1, cur_end),
        )
        top = top - merge.astype(top.dtype) + push.astype(top.dtype)
        return i + push.astype(i.dtype), top, cur, pending, stack

    zero = jnp.zeros((), gwy.dtype)
    izero = jnp.int32(0)
    stack = (jnp.zeros_like(gwy), jnp.zeros_like(gw), jnp.zeros(n, jnp.int32))
    init = (izero, izero, (zero, zero, izero), (izero, zero, zero, izero), stack)
    _, top, cur, pending, stack = lax.fori_loop(0, 2 * n, step, init)
    stack = write(write(stack, pending), (jnp.maximum(top - 1, 0), *cur))
    return (*stack, top)


def _fit_xla(x, y, w, increasing):
    n = x.shape[0]
    sign = 1.0 if increasing else -1.0
    valid = w > 0
    order = jnp.argsort(jnp.where(valid, x, jnp.inf), stable=True)
    xs, ws, vs = x[order], jnp.where(valid, w, 0)[order], valid[order]
    ys = jnp.where(vs, sign * y[order], 0)
    # scikit-learn's tie rule: a point joins the current group while it lies
    # less than the dtype's resolution above the group's first point.
    resolution = jnp.asarray(jnp.finfo(x.dtype).resolution, x.dtype)

    def group_start(start, xi):
        new = xi - start >= resolution
        return jnp.where(new, xi, start), new

    _, new = lax.scan(group_start, xs[0], xs)
    first = vs & new.at[0].set(True)
    n_groups = jnp.sum(first, dtype=jnp.int32)
    gid = jnp.where(vs, jnp.cumsum(first, dtype=jnp.int32) - 1, n)
    gwy = jnp.zeros_like(ys).at[gid].add(ws * ys, mode="drop")
    gw = jnp.zeros_like(ws).at[gid].add(ws, mode="drop")
    gx = jnp.zeros_like(xs).at[jnp.where(first, gid, n)].set(xs, mode="drop")

    bwy, bw, bend, top = _pav_blocks(gwy, gw, n_groups)
    # Block index of each pooled point = number of blocks ending at or before it.
    ends = jnp.where(jnp.arange(n) < top, bend, n)
    block = jnp.cumsum(jnp.zeros(n + 1, jnp.int32).at[ends].add(1))[:n]
    block = jnp.minimum(block, jnp.maximum(top - 1, 0))
    denom = bw[block]
    fitted = sign * bwy[block] / jnp.where(denom > 0, denom, 1)

    last = jnp.maximum(n_groups - 1, 0)
    inside = jnp.arange(n) < n_groups
    empty = n_groups == 0
    knot_x = jnp.where(empty, 0, jnp.where(inside, gx, gx[last]))
    knot_y = jnp.where(empty, 0, jnp.where(inside, fitted, fitted[last]))
    return knot_x.astype(x.dtype), knot_y.astype(x.dtype), n_groups


def isotonic_fit(
    x: jax.Array,
    y: jax.Array,
    *,
    weights: jax.Array | None = None,
    mask: jax.Array | None = None,
    increasing: bool = True,
    backend: str = "auto",
) -> IsotonicFit:
    """Fits a weighted isotonic regression of `y` on `x` (one problem).

    Args:
      x: inputs of shape [n], in any order; ties (see the module docstring)
        are pooled by weighted mean.
      y: targets of shape [n].
      weights: non-negative sample weights of shape [n] (default: ones).
        Entries with weight <= 0 are ignored, as in scikit-learn.
      mask: bool of shape [n] marking the valid slots of a fixed-size buffer
        (default: all valid). Invalid slots have no influence at all.
      increasing: fit a non-decreasing map if True, non-increasing if False.
      backend: "auto", "native" (CPU FFI kernels) or "xla" (pure JAX).

    Returns:
      An `IsotonicFit` with knots of shape [n]. With no valid entry,
      `n_knots == 0` and the map is the identity.

    Example:
      >>> fit = isotonic_fit(jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, 0.0, 2.0]))
      >>> isotonic_predict(fit, jnp.array([0.0, 1.5, 5.0])).tolist()
      [0.5, 1.25, 2.0]
    """
    x = jnp.asarray(x)
    y = jnp.asarray(y)
    chex.assert_rank(
        x,
        1,
        custom_message="isotonic_fit: `x` must have shape [n]; vmap over independent problems",
        **_BAD_INPUT,
    )
    chex.assert_equal_shape([x, y], custom_message="isotonic_fit: `x` and `y`", **_BAD_INPUT)
    chex.assert_axis_dimension_gt(
        x, 0, 0, custom_message="isotonic_fit: `x` needs at least one slot", **_BAD_INPUT
    )
    for name, arr in (("weights", weights), ("mask", mask)):
        if arr is not None:
            chex.assert_shape(
                arr,
                x.shape,
                custom_message=f"isotonic_fit: `{name}` must have the shape [n] of `x`",
                **_BAD_INPUT,
            )
    dtype = _float_dtype(x, y, weights)
    x = x.astype(dtype)
    y = y.astype(dtype)
    w = jnp.ones_like(x) if weights is None else jnp.asarray(weights).astype(dtype)
    valid = jnp.isfinite(x) & jnp.isfinite(y)
    if mask is not None:
        valid = valid & jnp.asarray(mask).astype(bool)
    w = jnp.where(valid & (w > 0), w, 0)
    x = jnp.where(valid, jnp.where(x == 0, 0, x), 0)  # -0.0 and 0.0 are one tie.
    y = jnp.where(valid, y, 0)

    def native(x, y, w):
        return _fit_native(x, y, w, increasing)

    def xla(x, y, w):
        return _fit_xla(x, y, w, increasing)

    knot_x, knot_y, n_knots = _dispatch(backend, native, xla, x, y, w)
    return IsotonicFit(knot_x, knot_y, n_knots)


# ----------------------------------------------------------------------------
# Predict.


def _predict_native(kx, ky, k, t):
    call = jax.ffi.ffi_call(
        _native.target("WmrlIsotonicPredict"),
        jax.ShapeDtypeStruct(t.shape, t.dtype),
        vmap_method="broadcast_all",
    )
    return call(kx, ky, k, t)


def _predict_xla(kx, ky, k, t):
    n = kx.shape[0]
    if n == 1:
        value = jnp.broadcast_to(ky[0], t.shape)
    else:
        tc = jnp.clip(t, kx[0], kx[-1])  # kx[-1] is the last valid knot (padding).
        hi = jnp.clip(jnp.searchsorted(kx, tc, side="left"), 1, n - 1)
        x0, x1, y0, y1 = kx[hi - 1], kx[hi], ky[hi - 1], ky[hi]
        dx = x1 - x0
        slope = (y1 - y0) / jnp.where(dx > 0, dx, 1)
        value = jnp.where(dx > 0, slope * (tc - x0) + y0, y1)
        value = jnp.where(jnp.isnan(t), t, value)
    return jnp.where(k == 0, t, jnp.where(k == 1, ky[0], value))


def isotonic_predict(fit: IsotonicFit, x_new: jax.Array, *, backend: str = "auto") -> jax.Array:
    """Evaluates a fitted isotonic map, clipping outside the fitted range.

    Between knots the map is linear; below the first knot it is the first
    fitted value and above the last knot the last one (scikit-learn's
    ``out_of_bounds="clip"``). A fit with one knot is constant; a fit with no
    knot is the identity. NaN inputs give NaN (except for a constant map).

    Args:
      fit: an `IsotonicFit` for one problem (knots of shape [n]).
      x_new: points of any shape.
      backend: "auto", "native" or "xla", as in `isotonic_fit`.

    Returns:
      The map at `x_new`, with the shape of `x_new` and the dtype of the fit.

    Example:
      >>> fit = isotonic_fit(jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0]))
      >>> isotonic_predict(fit, jnp.array([[-1.0, 0.25]])).tolist()
      [[0.0, 0.25]]
    """
    one_problem = (
        "isotonic_predict: `fit.x`, `fit.y` and `fit.n_knots` must have shapes [n], [n] and [] "
        "(the fit of one problem; use jax.vmap for a batch of fits)"
    )
    chex.assert_rank(
        [fit.x, fit.y, fit.n_knots], [1, 1, 0], custom_message=one_problem, **_BAD_INPUT
    )
    chex.assert_equal_shape([fit.x, fit.y], custom_message=one_problem, **_BAD_INPUT)
    x_new = jnp.asarray(x_new)
    shape = x_new.shape
    t = x_new.astype(fit.x.dtype).reshape(-1)
    k = jnp.asarray(fit.n_knots, jnp.int32)
    out = _dispatch(backend, _predict_native, _predict_xla, fit.x, fit.y, k, t)
    return out.reshape(shape)
