"""The chunked gated delta rule against a naive float64 recurrence kept here."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.models.gated_delta import (
    gated_delta_chunked,
    gated_delta_recurrent,
    gated_delta_step,
    l2_normalize,
)

# Jitted once per shape: eager dispatch of the scan's op-by-op form is slower than compiling.
chunked = jax.jit(
    gated_delta_chunked, static_argnames=("chunk_size", "normalize", "per_chunk", "backward")
)


def naive(q, k, v, g, beta, state=None):
    """The rule token by token in float64: S = e^g S; S += k beta (v - S^T k)^T; o = S^T q."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    b, t, h, dk = q.shape
    s = np.zeros((b, h, dk, v.shape[-1])) if state is None else np.asarray(state, np.float64)
    out = np.zeros(v.shape)
    for i in range(t):
        s = s * np.exp(g[:, i])[..., None, None]
        delta = (v[:, i] - np.einsum("bhk,bhkv->bhv", k[:, i], s)) * beta[:, i, :, None]
        s = s + k[:, i, ..., None] * delta[..., None, :]
        out[:, i] = np.einsum("bhk,bhkv->bhv", q[:, i], s)
    return out, s


def inputs(seed, b=2, t=150, h=3, dk=8, dv=12, decay=2.0):
    rng = np.random.default_rng(seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    q = l2_normalize(f32(rng.normal(size=(b, t, h, dk)))) * dk**-0.5
    k = l2_normalize(f32(rng.normal(size=(b, t, h, dk))))
    v = f32(rng.normal(size=(b, t, h, dv)))
    g = -f32(rng.uniform(0, decay, size=(b, t, h)))
    beta = f32(rng.uniform(size=(b, t, h)))
    state = f32(rng.normal(size=(b, h, dk, dv)))
    return q, k, v, g, beta, state


@pytest.mark.parametrize(("t", "chunk"), [(150, 64), (64, 64), (7, 64), (1, 64), (50, 16)])
def test_chunked_matches_naive(t, chunk):
    q, k, v, g, beta, state = inputs(t, t=t, decay=0.2)
    want, want_state = naive(q, k, v, g, beta, state)
    out, final = chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=state)
    assert out.dtype == final.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(final), want_state, rtol=0, atol=2e-5)


@pytest.mark.parametrize(("t", "chunk"), [(150, 64), (128, 64), (7, 64), (50, 16)])
def test_per_chunk_matches_all_chunks_at_once(t, chunk):
    """The prefill's form (each chunk prepared inside the scan) is the same arithmetic."""
    q, k, v, g, beta, state = inputs(10 + t, t=t, decay=0.5)
    want, want_state = naive(q, k, v, g, beta, state)
    out, final = chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=state, per_chunk=True)
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(final), want_state, rtol=0, atol=2e-5)
    at_once = chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=state)
    np.testing.assert_allclose(np.asarray(out), np.asarray(at_once[0]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("per_chunk", [False, True])
def test_normalize_and_key_heads_shared_by_value_heads(per_chunk):
    """`normalize` and Hk < H on bf16 inputs: as normalising, scaling and repeating first."""
    rng = np.random.default_rng(20)
    b, t, hk, h, dk, dv = 2, 90, 2, 6, 8, 12
    raw_q, raw_k = (jnp.asarray(rng.normal(size=(b, t, hk, dk)), jnp.bfloat16) for _ in "qk")
    _, _, v, g, beta, state = inputs(21, b=b, t=t, h=h, dk=dk, dv=dv)
    v = v.astype(jnp.bfloat16)
    q, k = (jnp.repeat(x.astype(jnp.float32), h // hk, axis=2) for x in (raw_q, raw_k))
    want, want_state = naive(l2_normalize(q) * dk**-0.5, l2_normalize(k), v, g, beta, state)
    out, final = chunked(
        raw_q, raw_k, v, g, beta, initial_state=state, normalize=True, per_chunk=per_chunk
    )
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(final), want_state, rtol=0, atol=2e-5)


def test_recurrent_and_step_match_naive():
    q, k, v, g, beta, state = inputs(1, t=40)
    want, want_state = naive(q, k, v, g, beta, state)
    out, final = gated_delta_recurrent(q, k, v, g, beta, state)
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(final), want_state, rtol=0, atol=1e-5)
    one, s1 = gated_delta_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state)
    w1, ws1 = naive(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], state)
    np.testing.assert_allclose(np.asarray(one), w1[:, 0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s1), ws1, rtol=0, atol=1e-6)


def test_zero_initial_state_is_the_default():
    q, k, v, g, beta, _ = inputs(2, t=70)
    a, sa = chunked(q, k, v, g, beta)
    b, sb = chunked(q, k, v, g, beta, initial_state=jnp.zeros_like(sa))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(sa), np.asarray(sb))


def test_split_sequence_continues_through_the_state():
    """Prefill in two calls (as a sampler with a cache does) equals one call."""
    q, k, v, g, beta, _ = inputs(3, t=100)
    whole, s = chunked(q, k, v, g, beta)
    first, s1 = chunked(*(x[:, :37] for x in (q, k, v, g, beta)))
    rest, s2 = chunked(*(x[:, 37:] for x in (q, k, v, g, beta)), initial_state=s1)
    np.testing.assert_allclose(np.concatenate([first, rest], 1), whole, rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(s2), np.asarray(s), rtol=0, atol=2e-5)


def test_strong_decay_stays_finite_with_finite_gradients():
    # cumulative log-decay reaches -64 * 30 inside one chunk: exp under/overflow territory.
    q, k, v, g, beta, state = inputs(4, t=128, decay=60.0)
    want, _ = naive(q, k, v, g, beta, state)
    out, _ = gated_delta_chunked(q, k, v, g, beta, initial_state=state)
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=2e-5)

    def loss(g):
        return jnp.sum(gated_delta_chunked(q, k, v, g, beta, initial_state=state)[0] ** 2)

    assert bool(jnp.all(jnp.isfinite(jax.grad(loss)(g))))


def test_gradients_match_the_recurrent_form():
    q, k, v, g, beta, state = inputs(5, t=80, decay=0.5)
    w = jnp.asarray(np.random.default_rng(0).normal(size=v.shape), jnp.float32)

    def loss(fn, *args):
        return jnp.sum(fn(*args, initial_state=state)[0] * w)

    chunked = jax.grad(lambda *a: loss(gated_delta_chunked, *a), argnums=(0, 1, 2, 3, 4))
    recurrent = jax.grad(lambda *a: loss(gated_delta_recurrent, *a), argnums=(0, 1, 2, 3, 4))
    for a, b in zip(chunked(q, k, v, g, beta), recurrent(q, k, v, g, beta), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-4)


def test_written_out_backward_matches_autodiff_of_the_scan():
    """`_chunk_scan`'s written-out backward (a reverse loop over chunks) against
    autodiff of the `lax.scan` it replaces: every input, the initial state, and a
    cotangent on the final state as well as on the outputs."""
    q, k, v, g, beta, state = inputs(8, t=150, decay=0.5)
    rng = np.random.default_rng(2)
    w_out = jnp.asarray(rng.normal(size=v.shape), jnp.float32)
    w_state = jnp.asarray(rng.normal(size=state.shape), jnp.float32)

    def loss(backward, *args):
        out, final = chunked(*args[:5], chunk_size=32, initial_state=args[5], backward=backward)
        return jnp.sum(out * w_out) + jnp.sum(final * w_state)

    args = (q, k, v, g, beta, state)
    reference = jax.grad(functools.partial(loss, "autodiff"), argnums=range(6))(*args)
    written = jax.grad(functools.partial(loss, "written"), argnums=range(6))(*args)
    for a, b in zip(written, reference, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
    assert max(float(jnp.max(jnp.abs(x))) for x in reference) > 0.5  # not all ~0


def test_jitted_and_not_agree_and_no_recompile():
    q, k, v, g, beta, state = inputs(6, t=70)
    fn = jax.jit(gated_delta_chunked, static_argnames="chunk_size")
    eager = gated_delta_chunked(q, k, v, g, beta, initial_state=state)[0]
    np.testing.assert_allclose(
        np.asarray(fn(q, k, v, g, beta, initial_state=state)[0]), eager, rtol=0, atol=1e-6
    )
    before = fn._cache_size()
    fn(q + 1, k, v, g, beta, initial_state=state)
    assert fn._cache_size() == before


def test_bad_shapes():
    q, k, v, g, beta, _ = inputs(7, t=8)
    with pytest.raises(ValueError, match=r"\[B, T, Hk, Dk\]"):
        gated_delta_chunked(q, k[:, :4], v, g, beta)
    with pytest.raises(ValueError, match="beta"):
        gated_delta_chunked(q, k, v, g, beta[..., :1])
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_chunked(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError, match="backward"):
        gated_delta_chunked(q, k, v, g, beta, backward="manual")
