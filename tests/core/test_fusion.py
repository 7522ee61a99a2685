"""Tests for wmrl_jax.core.fusion against hand values and float64 numpy references.

Tests of the pure functions' values run jitted and not, through chex variants
(`VariantsTest`, a `chex.TestCase` that pytest collects like any other test).
"""

import doctest
import functools
import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl_jax.core import fusion
from wmrl_jax.core.fusion import (
    EmaVarianceState,
    ema_variance,
    ema_variance_init,
    ema_variance_update,
    fusion_weight,
    inverse_variance_fuse,
)

INF = math.inf
NAN = math.nan


# ----------------------------------------------------------------------------
# float64 numpy references, written from the textbook formulas.


def ref_fuse(a, var_a, b, var_b):
    """Inverse-variance fusion for finite positive variances, in float64."""
    a, var_a, b, var_b = np.broadcast_arrays(
        *(np.asarray(x, np.float64) for x in (a, var_a, b, var_b))
    )
    precision = 1.0 / var_a + 1.0 / var_b
    return (a / var_a + b / var_b) / precision, 1.0 / precision


def ref_ema_variance(batches, masks, decay):
    """Weighted unbiased variance, each valid sample weight 1, older ones decayed per sample."""
    weights, rows = [], []
    for x, mask in zip(batches, masks, strict=True):
        new = [np.float64(row) for row, valid in zip(x, mask, strict=True) if valid]
        weights = [w * decay ** len(new) for w in weights] + [1.0] * len(new)
        rows += new
    w = np.asarray(weights)[:, None]
    x = np.asarray(rows).reshape(len(rows), -1)
    total = w.sum()
    mean = (w * x).sum(0) / total
    pop_var = (w * (x - mean) ** 2).sum(0) / total
    n_eff = total**2 / (w**2).sum()
    return mean, pop_var * n_eff / (n_eff - 1)


def random_broadcast_shapes(rng, num=4):
    rank = rng.integers(0, 4)
    full = tuple(int(d) for d in rng.integers(1, 5, size=rank))
    shapes = []
    for _ in range(num):
        shape = full[rng.integers(0, rank + 1) :]
        shapes.append(tuple(1 if rng.random() < 0.3 else d for d in shape))
    return np.broadcast_shapes(*shapes), shapes


# ----------------------------------------------------------------------------
# inverse_variance_fuse: reference and properties.


finite_f32 = dict(allow_nan=False, allow_infinity=False, allow_subnormal=False, width=32)
values = st.floats(-1e6, 1e6, **finite_f32)
variances = st.floats(float(np.float32(1e-30)), float(np.float32(1e30)), **finite_f32)


def arrays_of(elements, size=16):
    return hnp.arrays(np.float32, (size,), elements=elements)


@settings(max_examples=200, deadline=None)
@given(arrays_of(values), arrays_of(variances), arrays_of(values), arrays_of(variances))
def test_fuse_properties(a, var_a, b, var_b):
    fused, fused_var = (np.asarray(x) for x in inverse_variance_fuse(a, var_a, b, var_b))
    a, var_a, b, var_b = (np.float64(x) for x in (a, var_a, b, var_b))
    # float32 weights are exact to a few ulps, so the value error scales with
    # |a| + |b|; products below the smallest normal float may be flushed to 0.
    value_tol = 1e-6 * (np.abs(a) + np.abs(b)) + 4 * np.finfo(np.float32).tiny
    ref, ref_var = ref_fuse(a, var_a, b, var_b)
    assert np.all(np.abs(fused - ref) <= value_tol)
    np.testing.assert_allclose(fused_var, ref_var, rtol=1e-5)
    # Never worse than either source, and a convex combination of the two.
    assert np.all(fused_var <= np.minimum(var_a, var_b) * (1 + 1e-6))
    assert np.all(fused >= np.minimum(a, b) - value_tol)
    assert np.all(fused <= np.maximum(a, b) + value_tol)
    # Symmetric in the two sources (to an ulp: backends may contract into FMAs).
    swapped, swapped_var = inverse_variance_fuse(b, var_b, a, var_a)
    assert np.all(np.abs(swapped - fused) <= value_tol)
    np.testing.assert_allclose(swapped_var, fused_var, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(hnp.mutually_broadcastable_shapes(num_shapes=4, max_dims=3, max_side=3), st.integers(0, 99))
def test_fuse_broadcasts_like_numpy(shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes.input_shapes[::2])
    var_a, var_b = (rng.uniform(0.1, 10, s).astype(np.float32) for s in shapes.input_shapes[1::2])
    fused, fused_var = jax.jit(inverse_variance_fuse)(a, var_a, b, var_b)
    assert fused.shape == fused_var.shape == shapes.result_shape
    ref, ref_var = ref_fuse(a, var_a, b, var_b)
    np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused_var, ref_var, rtol=1e-5)


@settings(max_examples=100, deadline=None)
@given(variances, variances)
def test_fusion_weight_matches_reference(var_a, var_b):
    w = float(fusion_weight(np.float32(var_a), np.float32(var_b)))
    assert 0.0 <= w <= 1.0
    np.testing.assert_allclose(w, var_b / (np.float64(var_a) + var_b), rtol=1e-6, atol=1e-37)
    np.testing.assert_allclose(w + float(fusion_weight(var_b, var_a)), 1.0, rtol=1e-6)


# ----------------------------------------------------------------------------
# Edge cases: (a, var_a, b, var_b) -> (fused, fused_var), and whether gradients must be finite.

EDGE_CASES = {
    "inf_a": (1.0, INF, 2.0, 3.0, 2.0, 3.0),
    "inf_b": (1.0, 3.0, 2.0, INF, 1.0, 3.0),
    "both_inf_mean": (1.0, INF, 2.0, INF, 1.5, INF),
    "both_inf_nan_a": (NAN, INF, 2.0, INF, 2.0, INF),
    "both_inf_nan_b": (1.0, INF, NAN, INF, 1.0, INF),
    "nan_a_inf_var": (NAN, INF, 2.0, 3.0, 2.0, 3.0),
    "nan_b_inf_var": (1.0, 3.0, NAN, INF, 1.0, 3.0),
    "inf_value_inf_var": (INF, INF, 2.0, 3.0, 2.0, 3.0),
    "zero_a": (1.0, 0.0, 2.0, 3.0, 1.0, 0.0),
    "zero_b": (1.0, 3.0, 2.0, 0.0, 2.0, 0.0),
    "both_zero": (1.0, 0.0, 2.0, 0.0, 1.5, 0.0),
    "zero_a_inf_b": (1.0, 0.0, 2.0, INF, 1.0, 0.0),
    "zero_a_nan_b": (1.0, 0.0, NAN, 3.0, 1.0, 0.0),
    "tiny_equal": (1.0, 1e-30, 2.0, 1e-30, 1.5, 5e-31),
    "tiny_unequal": (1.0, 1e-30, 2.0, 3e-30, 1.25, 7.5e-31),
    "subnormal_vs_one": (1.0, 1e-40, 2.0, 1.0, 1.0, 0.0),
    "both_subnormal": (1.0, 1e-40, 2.0, 1e-45, 1.5, 0.0),
    "huge_equal": (1.0, 1e30, 2.0, 1e30, 1.5, 5e29),
    "huge_unequal": (1.0, 1e30, 2.0, 3e30, 1.25, 7.5e29),
    "near_max": (1.0, 3e38, 2.0, 3e38, 1.5, 1.5e38),
    "tiny_vs_huge": (1.0, 1e-30, 2.0, 1e30, 1.0, 1e-30),
    "negative_var_clipped": (1.0, -1.0, 2.0, 3.0, 1.0, 0.0),
    "minus_inf_var_clipped": (1.0, -INF, 2.0, 3.0, 1.0, 0.0),
}
# Garbage in, NaN out: neither value nor gradient is promised to be finite.
NAN_CASES = {
    "nan_var": (1.0, NAN, 2.0, 3.0, NAN, NAN),
    "nan_value_finite_var": (NAN, 1.0, 2.0, 1.0, NAN, 0.5),
    "both_inf_both_nan": (NAN, INF, NAN, INF, NAN, INF),
}
ALL_CASES = {**EDGE_CASES, **NAN_CASES}


@pytest.mark.parametrize("case_id", list(EDGE_CASES))
def test_fuse_gradients_finite_at_edges(case_id):
    args = tuple(np.float32(x) for x in EDGE_CASES[case_id][:4])
    for output in (0, 1):
        fn = lambda *x, output=output: inverse_variance_fuse(*x)[output]
        grads = jax.grad(fn, argnums=(0, 1, 2, 3))(*args)
        jac = jax.jit(jax.jacfwd(fn, argnums=(0, 1, 2, 3)))(*args)
        assert np.all(np.isfinite(grads)) and np.all(np.isfinite(jac)), (output, grads, jac)
        # At a subnormal variance the derivative is that at 0 or 0, depending on
        # whether the backend's denormal mode already made it compare equal to 0.
        if "subnormal" not in case_id:
            np.testing.assert_allclose(jac, grads, rtol=1e-5)


@pytest.mark.parametrize(
    "a, var_a, b, var_b",
    [(1.0, 2.0, 4.0, 6.0), (1.0, 1e-30, 2.0, 3e-30), (1.0, 1e30, 2.0, 3e30), (-3.0, 5.0, 7.0, 5.0)],
)
def test_fuse_gradients_match_analytic(a, var_a, b, var_b):
    grads = jax.grad(lambda *x: inverse_variance_fuse(*x)[0], argnums=(0, 1, 2, 3))(
        a, var_a, b, var_b
    )
    var_grads = jax.grad(lambda *x: inverse_variance_fuse(*x)[1], argnums=(1, 3))(
        a, var_a, b, var_b
    )
    total = np.float64(var_a) + var_b
    expected = (
        var_b / total,
        (b - a) * var_b / total**2,
        var_a / total,
        (a - b) * var_a / total**2,
    )
    np.testing.assert_allclose(grads, expected, rtol=1e-5)
    np.testing.assert_allclose(var_grads, ((var_b / total) ** 2, (var_a / total) ** 2), rtol=1e-5)


def test_fuse_gradients_at_single_zero_variance_are_one_sided():
    # Right-derivatives at var_a = 0: fused = a + var_a (b - a) / var_b + O(var_a²).
    grads = jax.grad(lambda *x: inverse_variance_fuse(*x)[0], argnums=(0, 1, 2, 3))(
        1.0, 0.0, 3.0, 4.0
    )
    np.testing.assert_allclose(grads, (1.0, 0.5, 0.0, 0.0), atol=1e-7)
    # Ignored sources get exactly zero gradient.
    grads = jax.grad(lambda *x: inverse_variance_fuse(*x)[0], argnums=(0, 1, 2, 3))(
        1.0, INF, 3.0, 4.0
    )
    np.testing.assert_array_equal(grads, (0.0, 0.0, 1.0, 0.0))


def test_fuse_dtypes_and_broadcast():
    fused, fused_var = inverse_variance_fuse(1, 2, 3, 4)  # ints promote to float32
    assert fused.dtype == fused_var.dtype == jnp.float32
    bf16 = jnp.ones((2,), jnp.bfloat16)
    assert inverse_variance_fuse(bf16, bf16, bf16, bf16)[0].dtype == jnp.float32
    fused, fused_var = inverse_variance_fuse(np.zeros((3, 1)), 1.0, np.ones((4,)), np.ones((1, 4)))
    assert fused.shape == fused_var.shape == (3, 4)
    with jax.enable_x64(True):
        a = np.float64(1.0)
        var = np.float64(1e-300)  # representable only in float64
        fused, fused_var = inverse_variance_fuse(a, var, 3.0, 3 * var)
        assert fused.dtype == fused_var.dtype == jnp.float64
        np.testing.assert_allclose(fused, 1.5, rtol=1e-12)
        np.testing.assert_allclose(fused_var, 0.75e-300, rtol=1e-12)
        assert inverse_variance_fuse(np.float32(1), 1.0, 2.0, 1.0)[0].dtype == jnp.float32


def test_fuse_does_not_retrace_on_new_values():
    traces = []

    @jax.jit
    def fuse(a, var_a, b, var_b):
        traces.append(None)  # runs only while tracing
        return inverse_variance_fuse(a, var_a, b, var_b)

    rng = np.random.default_rng(0)
    for _ in range(3):
        args = [rng.random(5).astype(np.float32) + 0.1 for _ in range(4)]
        jax.block_until_ready(fuse(*args))
    fuse(*(np.full(5, x, np.float32) for x in (NAN, INF, 1.0, 0.0)))
    assert len(traces) == 1


def test_fuse_errors():
    with pytest.raises(ValueError, match="not broadcastable"):
        inverse_variance_fuse(np.zeros(3), 1.0, np.zeros(4), 1.0)
    with pytest.raises(ValueError, match="must be real"):
        inverse_variance_fuse(1.0 + 1j, 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="not broadcastable"):
        fusion_weight(np.ones(2), np.ones(5))


def test_ema_with_unit_decay_is_the_sample_variance():
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    ema = ema_variance_init()
    for batch in x:
        ema = ema_variance_update(ema, batch, decay=1.0)
    np.testing.assert_allclose(ema.mean, x.astype(np.float64).mean(), rtol=1e-5)
    np.testing.assert_allclose(ema_variance(ema), x.astype(np.float64).var(ddof=1), rtol=1e-5)


def test_ema_empty_batch_and_traced_decay():
    state = ema_variance_update(ema_variance_init(), np.array([1.0, 2.0, 4.0]), decay=0.8)
    empty = ema_variance_update(state, np.zeros(2), decay=0.8, mask=np.zeros(2, bool))
    jax.tree.map(np.testing.assert_array_equal, empty, state)
    traces = []

    @jax.jit
    def step(state, x, decay):
        traces.append(None)
        return ema_variance_update(state, x, decay=decay)

    a = step(state, np.array([3.0, 5.0]), 0.8)
    b = step(state, np.array([3.0, 5.0]), 0.5)
    assert len(traces) == 1
    ref_a = ref_ema_variance([[1.0, 2.0, 4.0], [3.0, 5.0]], [[True] * 3, [True] * 2], 0.8)[1]
    ref_b = ref_ema_variance([[1.0, 2.0, 4.0], [3.0, 5.0]], [[True] * 3, [True] * 2], 0.5)[1]
    np.testing.assert_allclose(ema_variance(a), ref_a[0], rtol=1e-6)
    np.testing.assert_allclose(ema_variance(b), ref_b[0], rtol=1e-6)


def test_ema_vmap_over_states_and_decays():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 6)).astype(np.float32)  # [B, batches, N]
    decays = np.array([0.5, 0.9, 1.0], np.float32)
    states = jax.vmap(lambda _: ema_variance_init())(jnp.arange(3))
    step = jax.jit(jax.vmap(lambda s, x, d: ema_variance_update(s, x, decay=d)))
    for t in range(2):
        states = step(states, x[:, t], decays)
    var = jax.vmap(ema_variance)(states)
    for i, decay in enumerate(decays):
        ref = ref_ema_variance(x[i], np.ones((2, 6), bool), np.float64(decay))[1]
        np.testing.assert_allclose(var[i], ref[0], rtol=1e-5)


def test_ema_errors():
    with pytest.raises(ValueError, match=r"decay must lie in \[0, 1\]"):
        ema_variance_update(ema_variance_init(), np.zeros(2), decay=1.5)
    with pytest.raises(ValueError, match=r"decay must lie in \[0, 1\]"):
        ema_variance_update(ema_variance_init(), np.zeros(2), decay=-0.1)
    # Shape errors too are ValueError (chex assertions raise AssertionError by default).
    with pytest.raises(
        ValueError, match=r"ema_variance_update: `x` must have shape \[N, \*\[2\]\]"
    ):
        ema_variance_update(ema_variance_init((2,)), np.zeros((4, 3)), decay=0.9)
    with pytest.raises(ValueError, match=r"ema_variance_update: `x` must have shape \[N, \*\[\]\]"):
        ema_variance_update(
            ema_variance_init(), np.float32(1.0), decay=0.9
        )  # a sample, not a batch
    with pytest.raises(ValueError, match="`mask` must have shape"):
        ema_variance_update(ema_variance_init(), np.zeros(4), decay=0.9, mask=np.ones((4, 1)))
    with pytest.raises(ValueError, match="dtype must be floating"):
        ema_variance_init(dtype=bool)


# ----------------------------------------------------------------------------
# Values, jitted and not.


class VariantsTest(chex.TestCase):
    """Every pure function's values, with and without `jax.jit` (chex variants)."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*range(6))
    def test_fuse_matches_reference_on_broadcast_shapes(self, seed):
        rng = np.random.default_rng(seed)
        out_shape, (sa, sva, sb, svb) = random_broadcast_shapes(rng)
        a = (10 * rng.standard_normal(sa)).astype(np.float32)
        b = (10 * rng.standard_normal(sb)).astype(np.float32)
        var_a = (10 ** rng.uniform(-6, 6, sva)).astype(np.float32)
        var_b = (10 ** rng.uniform(-6, 6, svb)).astype(np.float32)
        fused, fused_var = self.variant(inverse_variance_fuse)(a, var_a, b, var_b)
        ref, ref_var = ref_fuse(a, var_a, b, var_b)
        assert fused.shape == fused_var.shape == out_shape
        assert fused.dtype == fused_var.dtype == jnp.float32
        # Weights carry a few float32 ulps; values are O(10).
        np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fused_var, ref_var, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*((name, *case) for name, case in ALL_CASES.items()))
    def test_fuse_edge_cases(self, a, var_a, b, var_b, expected, expected_var):
        fuse = self.variant(inverse_variance_fuse)
        fused, fused_var = fuse(a, var_a, b, var_b)
        np.testing.assert_allclose(fused, expected, rtol=1e-6)
        np.testing.assert_allclose(fused_var, expected_var, rtol=1e-6)
        # The same answer elementwise inside a batch.
        batch = [np.array([x, 1.0], np.float32) for x in (a, var_a, b, var_b)]
        fused_batch, var_batch = fuse(*batch)
        np.testing.assert_allclose(fused_batch[0], expected, rtol=1e-6)
        np.testing.assert_allclose(var_batch[0], expected_var, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_fusion_weight_edges_and_consistency(self):
        fn = self.variant(fusion_weight)
        var_a = np.array([1.0, 2.0, INF, 0.0, INF, 0.0, 5.0, 1e-40, -1.0], np.float32)
        var_b = np.array([3.0, INF, 2.0, 2.0, INF, 0.0, 0.0, 1.0, 1.0], np.float32)
        expected = [0.75, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 1.0, 1.0]
        np.testing.assert_allclose(fn(var_a, var_b), expected, rtol=1e-6)
        a, b = np.float32(1.0), np.float32(5.0)
        w = fn(var_a, var_b)
        fused, _ = inverse_variance_fuse(a, var_a, b, var_b)
        np.testing.assert_allclose(fused, w * a + (1 - w) * b, rtol=1e-6)
        assert fn(np.ones((2, 1)), np.ones(3)).shape == (2, 3)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.9, 0.5, 0.99)
    def test_ema_matches_float64_loop(self, decay):
        rng = np.random.default_rng(4)
        batches = rng.normal(1.0, 3.0, size=(7, 5, 2)).astype(np.float32)
        masks = rng.random((7, 5)) < 0.7
        masks[0, :2] = True  # at least two samples
        update = self.variant(functools.partial(ema_variance_update, decay=decay))
        state = ema_variance_init((2,))
        for x, mask in zip(batches, masks, strict=True):
            state = update(state, x, mask=mask)
        assert isinstance(state, EmaVarianceState)
        ref_mean, ref_var = ref_ema_variance(batches, masks, decay)
        np.testing.assert_allclose(state.mean, ref_mean, rtol=1e-5)
        np.testing.assert_allclose(self.variant(ema_variance)(state), ref_var, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ema_unknown_until_two_effective_samples(self):
        variance = self.variant(ema_variance)
        update = self.variant(functools.partial(ema_variance_update, decay=0.9))
        state = ema_variance_init()
        assert float(variance(state)) == INF
        assert float(self.variant(functools.partial(ema_variance, default=2.0))(state)) == 2.0
        state = update(state, np.array([3.0, NAN], np.float32), mask=np.array([True, False]))
        assert float(variance(state)) == INF  # one sample: a variance of 0 would claim "exact"
        state = update(state, np.array([5.0], np.float32))
        # Weights (0.9, 1): pop var = w1 w2 d² / W², n_eff = W² / (w1² + w2²).
        w1, w2 = 0.9, 1.0
        pop_var = w1 * w2 * 4.0 / (w1 + w2) ** 2
        n_eff = (w1 + w2) ** 2 / (w1**2 + w2**2)
        np.testing.assert_allclose(variance(state), pop_var * n_eff / (n_eff - 1), rtol=1e-6)
        # decay = 0 forgets everything but the newest batch.
        state = ema_variance_update(state, np.array([10.0], np.float32), decay=0.0)
        assert float(variance(state)) == INF
        state = ema_variance_update(state, np.array([1.0, 2.0, 6.0], np.float32), decay=0.0)
        np.testing.assert_allclose(variance(state), np.var([1.0, 2.0, 6.0], ddof=1), rtol=1e-6)


# ----------------------------------------------------------------------------
# Estimators feed the fusion: an unknown variance means "ignore this source".


def test_unknown_estimator_variance_ignores_source():
    sigma2_real = ema_variance(ema_variance_init())  # no samples yet: inf
    fused, fused_var = inverse_variance_fuse(0.3, 0.01, NAN, sigma2_real)
    np.testing.assert_allclose((fused, fused_var), (0.3, 0.01), rtol=1e-6)


def test_docstring_examples():
    results = doctest.testmod(fusion, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert results.attempted > 0
    assert results.failed == 0
