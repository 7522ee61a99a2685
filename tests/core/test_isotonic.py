"""Tests for wmrl_jax.core.isotonic against scikit-learn, by hand, and across backends.

Every numerical test runs on both implementations ("native" C++ kernels and the
pure "xla" path). The XLA fit takes about a second to compile per shape (and
longer op by op), so the tests share a few module-level jitted functions and
fixed buffer sizes; `VariantsTest` runs the functions jitted and not (chex
variants).
"""

import doctest
import functools
import math
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression

from wmrl_jax.core import isotonic
from wmrl_jax.core.isotonic import IsotonicFit, isotonic_fit, isotonic_predict

NAN = math.nan
INF = math.inf

BACKENDS = ("native", "xla")
backend_param = pytest.mark.parametrize("backend", BACKENDS)

# Shared jitted entry points, so that shapes repeated across tests compile once.
fit_jit = jax.jit(isotonic_fit, static_argnames=("increasing", "backend"))
predict_jit = jax.jit(isotonic_predict, static_argnames=("backend",))


@functools.partial(jax.jit, static_argnames=("backend",))
def fit_predict_both(x, y, weights, mask, queries, *, backend):
    """Increasing and decreasing fits of one problem, and their values at `queries`."""
    out = []
    for increasing in (True, False):
        fit = isotonic_fit(x, y, weights=weights, mask=mask, increasing=increasing, backend=backend)
        out.append((fit, isotonic_predict(fit, queries, backend=backend)))
    return out


def as_np(tree):
    return jax.tree.map(np.asarray, tree)


def valid_slots(x, y, weights=None, mask=None):
    """The slots the contract says a fit uses: finite x and y, weight > 0, unmasked."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    if weights is not None:
        keep &= np.asarray(weights, np.float64) > 0
    if mask is not None:
        keep &= np.asarray(mask, bool)
    return keep


def sklearn_predict(x, y, queries, *, weights=None, mask=None, increasing=True):
    """The reference: scikit-learn in float64 on the valid subset (identity if empty)."""
    queries = np.asarray(queries, np.float64)
    keep = valid_slots(x, y, weights, mask)
    if not keep.any():
        return queries.copy()
    w = None if weights is None else np.asarray(weights, np.float64)[keep]
    model = IsotonicRegression(increasing=increasing, out_of_bounds="clip")
    model.fit(np.asarray(x, np.float64)[keep], np.asarray(y, np.float64)[keep], sample_weight=w)
    return model.predict(queries)


def check_fit_structure(fit, x, y, weights, mask, increasing, atol):
    """n_knots, knot positions, padding and monotonicity of one fit."""
    keep = valid_slots(x, y, weights, mask)
    distinct = np.unique(np.asarray(x, np.float64)[keep])  # -0.0 == 0.0 here too.
    k = int(fit.n_knots)
    assert k == distinct.size
    assert np.all(np.isfinite(fit.x)) and np.all(np.isfinite(fit.y))
    if k == 0:
        np.testing.assert_array_equal(fit.x, 0)
        np.testing.assert_array_equal(fit.y, 0)
        return
    np.testing.assert_array_equal(fit.x[:k], distinct)
    np.testing.assert_array_equal(fit.x[k:], fit.x[k - 1])
    np.testing.assert_array_equal(fit.y[k:], fit.y[k - 1])
    steps = np.diff(np.asarray(fit.y[:k], np.float64))
    assert np.all((steps if increasing else -steps) >= -atol)


# ----------------------------------------------------------------------------
# Docstring examples and hand-checked values.


def test_docstring_examples():
    result = doctest.testmod(isotonic, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 2
    assert result.failed == 0


@backend_param
def test_hand_values_increasing(backend):
    # y = [1, 0, 2] on x = [0, 1, 2]: the first two pool to 0.5.
    fit = fit_jit(jnp.array([2.0, 0.0, 1.0]), jnp.array([2.0, 1.0, 0.0]), backend=backend)
    fit = as_np(fit)
    assert int(fit.n_knots) == 3
    np.testing.assert_array_equal(fit.x, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(fit.y, [0.5, 0.5, 2.0])
    queries = jnp.array([-1.0, 0.0, 0.5, 1.5, 2.0, 5.0])
    np.testing.assert_allclose(
        predict_jit(fit, queries, backend=backend), [0.5, 0.5, 0.5, 1.25, 2.0, 2.0], rtol=1e-6
    )


@backend_param
def test_hand_values_decreasing(backend):
    # y = [3, 1, 2] on x = [0, 1, 2], non-increasing: the last two pool to 1.5.
    fit = fit_jit(
        jnp.array([0.0, 1.0, 2.0]), jnp.array([3.0, 1.0, 2.0]), increasing=False, backend=backend
    )
    np.testing.assert_array_equal(fit.y, [3.0, 1.5, 1.5])
    queries = jnp.array([-3.0, 0.5, 9.0])
    np.testing.assert_allclose(predict_jit(fit, queries, backend=backend), [3.0, 2.25, 1.5])


@backend_param
def test_hand_values_weighted_ties(backend):
    # x = 1 appears twice: (4 * 1 + 1 * 3) / 4 = 1.75 < 2 at x = 0, so everything
    # pools to (2 * 2 + 4 * 1.75) / 6 = 11 / 6.
    x, y, w = jnp.array([1.0, 0.0, 1.0]), jnp.array([4.0, 2.0, 1.0]), jnp.array([1.0, 2.0, 3.0])
    fit = fit_jit(x, y, weights=w, backend=backend)
    assert int(fit.n_knots) == 2
    np.testing.assert_array_equal(fit.x, [0.0, 1.0, 1.0])
    np.testing.assert_allclose(fit.y, [11 / 6] * 3, rtol=1e-6)
    # With the tie pooled by weighted mean the other way (w at x = 1 swapped):
    # (4 * 3 + 1 * 1) / 4 = 3.25 > 2, no violation.
    fit = fit_jit(x, y, weights=jnp.array([3.0, 2.0, 1.0]), backend=backend)
    np.testing.assert_allclose(fit.y[:2], [2.0, 3.25], rtol=1e-6)


@backend_param
def test_length_one_and_two(backend):
    queries = jnp.array([-5.0, 0.25, 1.0, 7.0])
    fit = fit_jit(jnp.array([1.0]), jnp.array([3.0]), backend=backend)
    assert int(fit.n_knots) == 1
    np.testing.assert_array_equal(predict_jit(fit, queries, backend=backend), [3.0] * 4)

    x, y = jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])
    fit = fit_jit(x, y, backend=backend)  # A violation: both pool to 0.5.
    np.testing.assert_array_equal(fit.y, [0.5, 0.5])
    np.testing.assert_array_equal(predict_jit(fit, queries, backend=backend), [0.5] * 4)
    fit = fit_jit(x, y, increasing=False, backend=backend)
    np.testing.assert_array_equal(fit.y, [1.0, 0.0])
    np.testing.assert_allclose(predict_jit(fit, queries, backend=backend), [1.0, 0.75, 0.0, 0.0])


# ----------------------------------------------------------------------------
# Invalid entries, empty and constant fits, special queries.


@backend_param
@pytest.mark.parametrize(
    "case",
    [
        dict(mask=[False] * 4),
        dict(weights=[0.0, -1.0, 0.0, NAN]),
        dict(x=[NAN, INF, -INF, NAN], y=[1.0, 2.0, 3.0, 4.0]),
        dict(y=[NAN, INF, -INF, NAN]),
    ],
    ids=["masked", "weights", "x_nonfinite", "y_nonfinite"],
)
def test_no_valid_entry_gives_identity(backend, case):
    x = case.get("x", [NAN, 1.0, INF, -2.0])
    y = case.get("y", [1.0, NAN, -INF, 2.0])
    weights = case.get("weights", [1.0] * 4)
    mask = case.get("mask", [True] * 4)
    fit = fit_jit(
        jnp.array(x),
        jnp.array(y),
        weights=jnp.array(weights),
        mask=jnp.array(mask),
        backend=backend,
    )
    assert int(fit.n_knots) == 0
    np.testing.assert_array_equal(fit.x, 0)  # No NaN leaks from the ignored slots.
    np.testing.assert_array_equal(fit.y, 0)
    queries = np.array([NAN, INF, -INF, -0.0, 3.5, -1e30], np.float32)
    np.testing.assert_array_equal(predict_jit(fit, queries, backend=backend), queries)


@backend_param
def test_single_valid_point_is_constant(backend):
    x = jnp.array([NAN, 2.0, 5.0, 2.0, -1.0])
    y = jnp.array([0.0, 4.0, NAN, 6.0, 9.0])
    weights = jnp.array([1.0, 1.0, 1.0, 3.0, 0.0])  # Two slots at x = 2: one knot.
    fit = fit_jit(x, y, weights=weights, backend=backend)
    assert int(fit.n_knots) == 1
    np.testing.assert_array_equal(fit.x, [2.0] * 5)
    np.testing.assert_allclose(fit.y, [5.5] * 5, rtol=1e-6)
    queries = jnp.array([-INF, 0.0, 2.0, 1e6, INF, NAN])
    np.testing.assert_allclose(predict_jit(fit, queries, backend=backend), [5.5] * 6, rtol=1e-6)


@backend_param
def test_nonfinite_entries_are_ignored(backend):
    # Clean problem: x = [0, 1, 2, 3], y = [0, 2, 1, 3]; corrupt slots around it,
    # masked and unmasked, must change nothing.
    x = jnp.array([0.0, NAN, 1.0, 7.0, 2.0, INF, 3.0, -9.0, -INF])
    y = jnp.array([0.0, 5.0, 2.0, NAN, 1.0, 1.0, 3.0, 100.0, 2.0])
    mask = jnp.array([True, True, True, True, True, False, True, False, True])
    fit = fit_jit(x, y, mask=mask, backend=backend)
    assert int(fit.n_knots) == 4
    np.testing.assert_array_equal(fit.x[:4], [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(fit.y[:4], [0.0, 1.5, 1.5, 3.0], rtol=1e-6)
    assert np.all(np.isfinite(fit.x)) and np.all(np.isfinite(fit.y))


@backend_param
def test_negative_zero_and_zero_are_one_tie(backend):
    for x in ([-0.0, 0.0, 1.0], [0.0, -0.0, 1.0]):
        fit = fit_jit(jnp.array(x), jnp.array([2.0, 0.0, 5.0]), backend=backend)
        assert int(fit.n_knots) == 2
        np.testing.assert_array_equal(fit.x[:2], [0.0, 1.0])
        assert not np.signbit(fit.x[0])
        np.testing.assert_allclose(fit.y[:2], [1.0, 5.0])
        np.testing.assert_allclose(
            predict_jit(fit, jnp.array([-0.0, 0.0, 0.5]), backend=backend), [1.0, 1.0, 3.0]
        )


@backend_param
def test_special_queries(backend):
    fit = fit_jit(jnp.array([0.0, 1.0, 2.0]), jnp.array([0.0, 1.0, 4.0]), backend=backend)
    queries = jnp.array([[NAN, INF, -INF], [-0.0, 1.5, NAN]])
    values = predict_jit(fit, queries, backend=backend)
    assert values.shape == (2, 3)
    np.testing.assert_array_equal(values, [[NAN, 4.0, 0.0], [0.0, 2.5, NAN]])
    # Queries are cast to the fit's dtype; any shape is kept.
    assert predict_jit(fit, jnp.array([0, 2]), backend=backend).dtype == jnp.float32
    assert predict_jit(fit, jnp.float32(0.5), backend=backend).shape == ()
    assert predict_jit(fit, jnp.zeros((2, 0)), backend=backend).shape == (2, 0)


def test_integer_and_bool_inputs_are_cast():
    # The cast happens before the backend dispatch: one backend suffices.
    fit = isotonic_fit(
        jnp.array([0, 1, 2]),
        jnp.array([1, 0, 2]),
        weights=jnp.array([1, 1, 2]),
        mask=jnp.array([1, 1, 0]),
        backend="native",
    )
    assert fit.x.dtype == jnp.float32 and fit.n_knots.dtype == jnp.int32
    np.testing.assert_array_equal(fit.y, [0.5, 0.5, 0.5])


# ----------------------------------------------------------------------------
# Property tests against scikit-learn.


@st.composite
def problems(draw, *, lengths, width):
    """A buffer with ties, weights, masks and corrupt slots; x on a coarse grid.

    Grid values (integer multiples of 0.25, 1 or 3) and `width`-bit floats are
    exact in the tested dtype, so scikit-learn sees the same inputs in float64,
    and distinct x are far apart, so exact ties are the only ties (near ties
    within the dtype's resolution are tested on their own).
    """
    n = draw(st.sampled_from(lengths))
    span = draw(st.sampled_from([0, 1, 3, 10, 1000]))  # span 0: one distinct x.
    step = draw(st.sampled_from([0.25, 1.0, 3.0]))
    ints = draw(st.lists(st.integers(-span, span), min_size=n, max_size=n))
    x = np.array(ints, np.float64) * step
    floats = st.floats(-1e3, 1e3, width=width, allow_subnormal=False)
    y = draw(
        st.one_of(
            st.lists(floats, min_size=n, max_size=n),
            st.lists(st.integers(-8, 8).map(lambda k: k / 4), min_size=n, max_size=n),
            floats.map(lambda c: [c] * n),  # Constant y.
        )
    )
    y = np.array(y, np.float64)

    # Each kind of invalid slot is absent half the time, so that many examples
    # keep most slots valid (long PAV merge chains).
    def slots(element, default):
        return st.one_of(st.just([default] * n), st.lists(element, min_size=n, max_size=n))

    weight = st.one_of(
        st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]), st.floats(2.0**-10, 10.0, width=width)
    )
    weights = np.array(draw(slots(weight, 1.0)), np.float64)
    mask = np.array(draw(slots(st.booleans(), True)))
    y = np.where(mask, y, y + 1e4)  # Far-off targets in masked slots: any leak would show.
    corrupt = draw(slots(st.sampled_from(["", "", "", "x_nan", "x_inf", "y_nan", "y_-inf"]), ""))
    for i, what in enumerate(corrupt):
        if what:
            target, value = what.split("_")
            (x if target == "x" else y)[i] = float(value)
    lo, hi = (-span - 3) * step, (span + 3) * step
    between = draw(st.lists(st.floats(lo, hi, width=width), min_size=6, max_size=6))
    grid = np.array(ints, np.float64) * step
    queries = np.concatenate([grid, grid + step / 2, [lo, hi], between])
    return x, y, weights, mask, queries


def check_against_sklearn(problem, backend, dtype, rel_tol):
    x, y, weights, mask, queries = problem
    args = [jnp.asarray(a.astype(dtype)) for a in (x, y, weights)]
    results = fit_predict_both(
        *args, jnp.asarray(mask), jnp.asarray(queries.astype(dtype)), backend=backend
    )
    keep = valid_slots(x, y, weights, mask)
    scale = max(1.0, float(np.max(np.abs(y[keep]), initial=0.0)))
    for increasing, (fit, values) in zip((True, False), as_np(results), strict=True):
        assert fit.x.dtype == dtype and values.dtype == dtype
        check_fit_structure(fit, x, y, weights, mask, increasing, atol=rel_tol * scale)
        expected = sklearn_predict(x, y, queries, weights=weights, mask=mask, increasing=increasing)
        np.testing.assert_allclose(values, expected, rtol=0, atol=rel_tol * scale)


@backend_param
@settings(max_examples=60, deadline=None)
@given(problem=problems(lengths=(1, 2, 12), width=32))
def test_matches_sklearn_float32(backend, problem):
    # Both paths round to float32 (the XLA one also sums the <= 12 terms w * y in
    # float32) and interpolate once: a few ulps (6e-8) of the scale max |y|, so
    # 1e-5 of the scale leaves a wide margin.
    check_against_sklearn(problem, backend, np.float32, rel_tol=1e-5)


@backend_param
@settings(max_examples=40, deadline=None)
@given(problem=problems(lengths=(12,), width=64))
def test_matches_sklearn_float64(backend, problem):
    # Scoped: only this block runs with 64-bit types. Rounding is ~1e-15 of the
    # scale, so 1e-9 is loose yet far below any float32 fallback (~1e-7).
    with jax.enable_x64(True):
        check_against_sklearn(problem, backend, np.float64, rel_tol=1e-9)


# ----------------------------------------------------------------------------
# Larger problems: native vs XLA vs scikit-learn.


def random_problem(rng, n, pattern, dtype=np.float32):
    if pattern == "ties":
        x = rng.integers(0, 20, n) * 0.5
    elif pattern == "distinct":
        x = rng.permutation(n) * 0.25
    elif pattern == "sorted":  # Exercises the native already-sorted shortcut.
        x = np.sort(rng.integers(-n, n, n)) * 1.0
    elif pattern == "reversed":
        x = np.sort(rng.integers(-n, n, n))[::-1] * 1.0
    else:  # "worst": the most PAV merges (see below).
        x = np.arange(n) * 1.0
    y = x / max(1, n) + rng.normal(size=n)
    weights = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0.1, 2.0, n))
    mask = rng.random(n) < 0.9
    if pattern == "worst":
        y, weights, mask = -x, np.ones(n), np.ones(n, bool)
    queries = np.concatenate([x, x + 0.125, rng.uniform(x.min() - 5, x.max() + 5, n), [NAN]])
    return tuple(a.astype(dtype) for a in (x, y, weights)) + (mask, queries.astype(dtype))


@pytest.mark.parametrize("increasing", [True, False])
def test_native_matches_xla_and_sklearn_on_large_problems(increasing):
    n = 5000
    rng = np.random.default_rng(increasing)
    for pattern in ("ties", "distinct", "sorted", "reversed", "worst"):
        x, y, weights, mask, queries = random_problem(rng, n, pattern)
        fits, values = {}, {}
        for backend in ("native", "xla", "auto"):
            fit = fit_jit(x, y, weights=weights, mask=mask, increasing=increasing, backend=backend)
            fits[backend] = as_np(fit)
            values[backend] = np.asarray(predict_jit(fit, queries, backend=backend))
        # On the CPU "auto" is the native kernel: bit for bit.
        for a, b in zip(fits["auto"], fits["native"], strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(values["auto"], values["native"])
        # The XLA path sums in float32 (native in double): with n <= 5000 terms,
        # 1e-5 of the scale is a generous bound on the difference.
        scale = float(np.max(np.abs(y)))
        assert int(fits["native"].n_knots) == int(fits["xla"].n_knots)
        np.testing.assert_array_equal(fits["native"].x, fits["xla"].x)
        np.testing.assert_allclose(fits["native"].y, fits["xla"].y, rtol=0, atol=1e-5 * scale)
        np.testing.assert_allclose(values["native"], values["xla"], rtol=0, atol=1e-5 * scale)
        assert np.isnan(values["native"][-1]) and np.isnan(values["xla"][-1])
        expected = sklearn_predict(
            x, y, queries[:-1], weights=weights, mask=mask, increasing=increasing
        )
        for backend in BACKENDS:
            np.testing.assert_allclose(values[backend][:-1], expected, rtol=0, atol=1e-5 * scale)
            if pattern == "worst" and increasing:
                # Strictly decreasing targets under an increasing fit: each push
                # merges the whole stack (2n - 1 PAV steps) into one mean.
                np.testing.assert_allclose(fits[backend].y, -(n - 1) / 2, rtol=1e-6)


def test_native_radix_sort_on_a_very_large_problem():
    # From 65536 valid points the native sort switches to 11-bit digits; the
    # XLA path is not run here only to keep the test fast.
    rng = np.random.default_rng(17)
    n = 70_000
    x = (rng.integers(-20_000, 20_000, n) * 0.5).astype(np.float32)
    y = (x / 1e4 + rng.normal(size=n)).astype(np.float32)
    queries = rng.uniform(-11_000, 11_000, 500).astype(np.float32)
    fit = fit_jit(x, y, backend="native")
    expected = sklearn_predict(x, y, queries)
    np.testing.assert_array_equal(fit.x[: int(fit.n_knots)], np.unique(x))
    np.testing.assert_allclose(predict_jit(fit, queries, backend="native"), expected, atol=1e-5)


def test_native_matches_xla_float64():
    rng = np.random.default_rng(64)
    x, y, weights, mask, queries = random_problem(rng, 1000, "ties", np.float64)
    results = {}
    with jax.enable_x64(True):
        for backend in BACKENDS:
            fit = fit_jit(x, y, weights=weights, mask=mask, increasing=False, backend=backend)
            results[backend] = as_np((fit, predict_jit(fit, queries, backend=backend)))
    (fit_n, values_n), (fit_x, values_x) = results["native"], results["xla"]
    assert fit_n.x.dtype == np.float64 and values_x.dtype == np.float64
    np.testing.assert_array_equal(fit_n.x, fit_x.x)
    np.testing.assert_allclose(fit_n.y, fit_x.y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(values_n, values_x, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------
# vmap.


def batch_of_problems(rng, shape):
    """Problems of shape [..., n] on a grid of 100 values, with special rows first."""
    x = rng.integers(0, 100, shape) * 0.5
    y = rng.normal(size=shape)
    weights = rng.uniform(0.0, 2.0, shape)
    mask = rng.random(shape) < 0.8
    flat = mask.reshape(-1, shape[-1])
    flat[0] = False  # An empty row: the identity map.
    flat[1] = False
    flat[1, 3] = True  # A single valid slot: a constant map.
    return tuple(a.astype(np.float32) for a in (x, y, weights)) + (mask,)


def assert_fits_close(batched, single, atol):
    assert int(batched.n_knots) == int(single.n_knots)
    np.testing.assert_array_equal(batched.x, single.x)
    np.testing.assert_allclose(batched.y, single.y, rtol=0, atol=atol)


def test_vmap_matches_per_problem_and_backends():
    rng = np.random.default_rng(7)
    x, y, weights, mask = batch_of_problems(rng, (6, 200))
    # 70 queries against ~80 knots: the native sorted-merge predict path.
    queries = np.concatenate([np.arange(-2.0, 52.0, 0.8), [NAN, INF]]).astype(np.float32)
    per_row_queries = np.stack([queries + i for i in range(6)])
    results = {}
    for backend in BACKENDS:
        predict_one = functools.partial(isotonic_predict, backend=backend)

        def fit_one(x, y, weights, mask, backend=backend):
            return isotonic_fit(x, y, weights=weights, mask=mask, backend=backend)

        fits = jax.jit(jax.vmap(fit_one))(x, y, weights, mask)
        assert fits.x.shape == (6, 200) and fits.n_knots.shape == (6,)
        # A batch of fits against shared queries, against its own queries, and
        # one unbatched fit against a batch of queries.
        shared = jax.jit(jax.vmap(predict_one, in_axes=(0, None)))(fits, queries)
        own = jax.jit(jax.vmap(predict_one))(fits, per_row_queries)
        first = jax.tree.map(lambda a: a[2], fits)
        broadcast = jax.jit(jax.vmap(predict_one, in_axes=(None, 0)))(first, per_row_queries)
        for i in range(6):
            single = fit_jit(x[i], y[i], weights=weights[i], mask=mask[i], backend=backend)
            row = as_np(jax.tree.map(lambda a, i=i: a[i], fits))
            assert_fits_close(row, as_np(single), atol=1e-6)
            for got, q in ((shared[i], queries), (own[i], per_row_queries[i])):
                np.testing.assert_allclose(got, predict_jit(single, q, backend=backend), atol=1e-6)
            np.testing.assert_allclose(
                broadcast[i], predict_jit(first, per_row_queries[i], backend=backend), atol=1e-6
            )
            finite = queries[:-2]  # scikit-learn rejects NaN and inf queries.
            expected = sklearn_predict(x[i], y[i], finite, weights=weights[i], mask=mask[i])
            np.testing.assert_allclose(shared[i, :-2], expected, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(shared[0], queries)  # The empty row: the identity.
        assert np.unique(np.asarray(shared[1])).size == 1  # One valid slot: a constant.
        results[backend] = as_np((fits, shared, own, broadcast))
    native, xla = results["native"], results["xla"]
    for i in range(6):
        row = lambda tree, i=i: jax.tree.map(lambda a: a[i], tree)
        assert_fits_close(row(native[0]), row(xla[0]), atol=1e-5)
    for a, b in zip(native[1:], xla[1:], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@backend_param
def test_nested_vmap(backend):
    rng = np.random.default_rng(11)
    x, y, weights, mask = batch_of_problems(rng, (2, 3, 24))
    queries = np.linspace(-1.0, 51.0, 37, dtype=np.float32)

    def fit_predict(x, y, weights, mask, queries):
        fit = isotonic_fit(x, y, weights=weights, mask=mask, increasing=False, backend=backend)
        return fit, isotonic_predict(fit, queries, backend=backend)

    inner = jax.vmap(fit_predict, in_axes=(0, 0, 0, 0, None))
    fits, values = jax.jit(jax.vmap(inner, in_axes=(0, 0, 0, 0, None)))(
        x, y, weights, mask, queries
    )
    assert values.shape == (2, 3, 37) and fits.n_knots.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            expected = sklearn_predict(
                x[i, j],
                y[i, j],
                queries,
                weights=weights[i, j],
                mask=mask[i, j],
                increasing=False,
            )
            np.testing.assert_allclose(values[i, j], expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(values[0, 0], queries)


# ----------------------------------------------------------------------------
# jit.


class VariantsTest(chex.TestCase):
    """Fit and predict with and without `jax.jit` (chex variants), on both backends."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*BACKENDS)
    def test_fit_and_predict_match_sklearn(self, backend):
        x = jnp.array([3.0, 1.0, 1.0, 2.0, NAN, 0.0, 2.0])
        y = jnp.array([1.0, 4.0, 0.0, 2.0, 1.0, 3.0, -1.0])
        weights = jnp.array([1.0, 2.0, 0.5, 1.0, 1.0, 0.0, 3.0])
        mask = jnp.array([True, True, True, True, True, True, False])
        queries = jnp.array([-1.0, 0.5, 1.0, 1.5, 2.5, 3.0, 4.0, NAN])
        fit = self.variant(functools.partial(isotonic_fit, backend=backend))(
            x, y, weights=weights, mask=mask
        )
        values = self.variant(functools.partial(isotonic_predict, backend=backend))(fit, queries)
        expected = sklearn_predict(x, y, queries[:-1], weights=weights, mask=mask)
        np.testing.assert_allclose(values[:-1], expected, rtol=1e-6)
        assert np.isnan(values[-1])
        # Slot 5 has weight 0 and slot 6 is masked: knots at 1, 2, 3.
        assert int(fit.n_knots) == 3
        np.testing.assert_array_equal(fit.x[:3], [1.0, 2.0, 3.0])


@backend_param
def test_new_values_do_not_retrace(backend):
    traces = []

    @jax.jit
    def fit_predict(x, y, mask, queries):
        traces.append(None)  # Runs only while tracing.
        fit = isotonic_fit(x, y, mask=mask, backend=backend)
        return isotonic_predict(fit, queries, backend=backend)

    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.integers(0, 6, 16).astype(np.float32)
        y = rng.normal(size=16).astype(np.float32)
        mask = rng.random(16) < rng.uniform(0.0, 1.0)
        queries = rng.uniform(-1.0, 7.0, 10).astype(np.float32)
        np.testing.assert_allclose(
            fit_predict(x, y, mask, queries), sklearn_predict(x, y, queries, mask=mask), atol=1e-5
        )
    assert len(traces) == 1


# ----------------------------------------------------------------------------
# Errors.


def batched_fit():
    return IsotonicFit(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32))


@pytest.mark.parametrize("backend", [*BACKENDS, "auto"])
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda b: isotonic_fit(jnp.zeros((2, 3)), jnp.zeros((2, 3)), backend=b), r"shape \[n\]"),
        (lambda b: isotonic_fit(jnp.float32(1.0), jnp.float32(1.0), backend=b), r"shape \[n\]"),
        (
            lambda b: isotonic_fit(jnp.zeros(3), jnp.zeros(4), backend=b),
            r"\(3,\), \(4,\).*`x` and `y`",
        ),
        (lambda b: isotonic_fit(jnp.zeros(3), jnp.zeros((3, 1)), backend=b), "`x` and `y`"),
        (lambda b: isotonic_fit(jnp.zeros(0), jnp.zeros(0), backend=b), "at least one slot"),
        (
            lambda b: isotonic_fit(jnp.zeros(3), jnp.zeros(3), weights=jnp.ones(2), backend=b),
            r"shape \(2,\) but expected \(3\).*`weights` must have the shape \[n\] of `x`",
        ),
        (
            lambda b: isotonic_fit(
                jnp.zeros(3), jnp.zeros(3), mask=jnp.ones((1, 3), bool), backend=b
            ),
            r"shape \(1, 3\) but expected \(3\).*`mask` must have the shape \[n\] of `x`",
        ),
        (lambda b: isotonic_predict(batched_fit(), jnp.zeros(2), backend=b), "jax.vmap"),
        (
            lambda b: isotonic_predict(
                IsotonicFit(jnp.zeros(3), jnp.zeros(2), jnp.int32(1)), jnp.zeros(2), backend=b
            ),
            "fit of one problem",
        ),
        (
            lambda b: isotonic_predict(
                IsotonicFit(jnp.zeros(3), jnp.zeros(3), jnp.ones(1, jnp.int32)), 0.0, backend=b
            ),
            "fit of one problem",
        ),
    ],
    ids=[
        "x_rank2",
        "x_rank0",
        "y_length",
        "y_rank",
        "empty",
        "weights",
        "mask",
        "batched_fit",
        "knots_mismatch",
        "n_knots_rank",
    ],
)
def test_shape_errors(backend, call, message):
    # ValueError, though checked by chex assertions (which raise AssertionError by default).
    with pytest.raises(ValueError, match=message):
        call(backend)


def test_predict_with_batched_fit_needs_vmap():
    fits = jax.vmap(isotonic_fit)(jnp.zeros((2, 3)), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"use jax.vmap for a batch of fits"):
        isotonic_predict(fits, jnp.zeros(4))
    assert jax.vmap(isotonic_predict, in_axes=(0, None))(fits, jnp.zeros(4)).shape == (2, 4)


def test_bad_backend():
    fit = isotonic_fit(jnp.zeros(2), jnp.zeros(2))
    with pytest.raises(ValueError, match=r"backend must be one of .*'gpu'"):
        isotonic_fit(jnp.zeros(2), jnp.zeros(2), backend="gpu")
    with pytest.raises(ValueError, match=r"backend must be one of .*'Native'"):
        isotonic_predict(fit, jnp.zeros(2), backend="Native")


def test_native_disabled_falls_back_or_raises():
    # The native kernels load once per process, so this runs in a fresh one.
    script = """
import jax, jax.numpy as jnp
from wmrl_jax.core.isotonic import isotonic_fit, isotonic_predict
try:
    isotonic_fit(jnp.zeros(2), jnp.zeros(2), backend="native")
except RuntimeError as error:
    assert "WMRL_JAX_NATIVE=0" in str(error), error
else:
    raise SystemExit("backend='native' did not raise")
fit = jax.jit(isotonic_fit)(jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, 0.0, 2.0]))
assert jax.jit(isotonic_predict)(fit, jnp.array([1.5])).tolist() == [1.25]
"""
    env = {**os.environ, "WMRL_JAX_NATIVE": "0", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_near_ties_follow_sklearn_resolution_rule(backend):
    # Points closer than float32's resolution (1e-6) to a group's first point
    # join that group; scikit-learn pools them the same way.
    x = np.array([0.0, 5e-7, 9e-7, 1.2e-6, 2e-6, 2.05e-6, 0.5, 0.5 + 4e-7], np.float32)
    y = np.array([3.0, 1.0, 2.0, 0.5, 4.0, 0.0, 1.0, 2.0], np.float32)
    perm = np.random.default_rng(0).permutation(x.size)
    x, y = x[perm], y[perm]
    queries = np.linspace(-0.1, 0.6, 29).astype(np.float32)
    ref = IsotonicRegression(out_of_bounds="clip").fit(x, y)
    fit = isotonic_fit(jnp.asarray(x), jnp.asarray(y), backend=backend)
    # Groups {0, 5e-7, 9e-7}, {1.2e-6, 2e-6, 2.05e-6}, {0.5, 0.5 + 4e-7}.
    assert int(fit.n_knots) == 3
    np.testing.assert_array_equal(fit.x[:3], np.float32([0.0, 1.2e-6, 0.5]))
    np.testing.assert_allclose(
        isotonic_predict(fit, jnp.asarray(queries), backend=backend),
        ref.predict(queries),
        rtol=1e-5,
        atol=1e-6,
    )
