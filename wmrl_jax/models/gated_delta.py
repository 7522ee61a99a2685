"""The gated delta rule (Gated DeltaNet, Yang et al., 2024, arXiv:2412.06464) in JAX.

Per head, with a state S of shape [Dk, Dv] (float32), and per token t a query
q_t, key k_t (L2-normalised by the caller, q also scaled by 1/sqrt(Dk)), value
v_t, log-decay g_t <= 0 and write strength beta_t in (0, 1):

    S_t = exp(g_t) S_{t-1} + k_t beta_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
    o_t = S_t^T q_t

`gated_delta_step` is one token (decoding), `gated_delta_recurrent` a scan of it
(the reference form), `gated_delta_chunked` the training / prefill form: within
a chunk of C tokens the delta updates are condensed into the inverse of one
unit-lower-triangular matrix (the UT transform of DeltaNet, Yang et al., 2024,
arXiv:2406.06484), then a `lax.scan` carries the state across chunks. Both
forms agree to float32 rounding. Training builds every chunk's terms at once
and differentiates the loop across chunks by a backward pass written out
(`_chunk_scan`); the sampler's prefill (`per_chunk=True`) builds each chunk's
inside the loop, from its inputs in their own dtype, and holds no float32
tensor of the inputs' size but the output.

Example:
    >>> out, state = gated_delta_chunked(q, k, v, g, beta)   # [B, T, H, Dv], [B, H, Dk, Dv]
"""

import functools

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST
_einsum = functools.partial(jnp.einsum, precision=_HIGHEST)


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in float32 (the reference's eps form)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def unit_lower_inverse(lower: jax.Array) -> jax.Array:
    """(I + L)^-1 for strictly lower-triangular L of shape [..., C, C], by matmuls only.

    L is nilpotent (L^C = 0), so (I + L)^-1 = sum_k (-L)^k = prod_i (I + (-L)^(2^i)) over
    i < ceil(log2 C): 2 log2 C batched matmuls instead of C sequential substitution
    steps (XLA's CPU triangular solve is ~300x slower than a matmul at C = 64).
    """
    c = lower.shape[-1]
    eye = jnp.eye(c, dtype=lower.dtype)
    power = -lower
    inverse = eye + power
    for _ in range(max(int(c - 1).bit_length() - 1, 0)):
        power = _einsum("...ij,...jk->...ik", power, power)
        inverse = _einsum("...ij,...jk->...ik", inverse, eye + power)
    return inverse


def _check(q, k, v, g, beta):
    b, t, hk, dk = q.shape
    h = v.shape[2] if v.ndim == 4 else -1
    if k.shape != q.shape or v.shape[:2] != (b, t) or g.shape != (b, t, h) or h % hk:
        raise ValueError(
            f"expected q, k [B, T, Hk, Dk], v [B, T, H, Dv], g, beta [B, T, H] with Hk "
            f"dividing H; got q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
            f"beta {beta.shape}"
        )
    if beta.shape != g.shape:
        raise ValueError(f"beta {beta.shape} != g {g.shape}")
    return b, h, dk, v.shape[-1]


def prepare(q, k, v, g, beta, *, normalize: bool = False):
    """The rule's inputs in float32, q and k repeated to the value heads.

    Args:
        q, k: of shape [..., Hk, Dk]; each key head serves H / Hk consecutive value heads.
        v: of shape [..., H, Dv].
        g, beta: of shape [..., H].
        normalize: L2-normalise q and k here, and scale q by 1/sqrt(Dk) (as the
            module docstring's caller would).

    Returns:
        float32 (q, k, v, g, beta), q and k of shape [..., H, Dk].
    """
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    if normalize:
        q = l2_normalize(q) * jnp.float32(q.shape[-1] ** -0.5)
        k = l2_normalize(k)
    repeat = v.shape[-2] // q.shape[-2]
    if repeat > 1:
        q, k = jnp.repeat(q, repeat, axis=-2), jnp.repeat(k, repeat, axis=-2)
    return q, k, v.astype(jnp.float32), g.astype(jnp.float32), beta.astype(jnp.float32)


def gated_delta_step(q, k, v, g, beta, state):
    """One token of the gated delta rule.

    Args:
        q, k: float32 of shape [B, H, Dk].
        v: float32 of shape [B, H, Dv].
        g: log-decay, float32 of shape [B, H] (<= 0).
        beta: write strength, float32 of shape [B, H].
        state: float32 of shape [B, H, Dk, Dv].

    Returns:
        (output float32 [B, H, Dv], new state [B, H, Dk, Dv]).
    """
    state = state * jnp.exp(g)[..., None, None]
    predicted = _einsum("bhk,bhkv->bhv", k, state)
    delta = (v - predicted) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    return _einsum("bhk,bhkv->bhv", q, state), state


def gated_delta_recurrent(q, k, v, g, beta, initial_state=None):
    """The gated delta rule token by token (a `lax.scan` of `gated_delta_step`).

    Args:
        q, k: of shape [B, T, H, Dk] (as described in the module docstring).
        v: of shape [B, T, H, Dv].
        g, beta: of shape [B, T, H].
        initial_state: optional float32 of shape [B, H, Dk, Dv] (default zeros).

    Returns:
        (output float32 [B, T, H, Dv], final state float32 [B, H, Dk, Dv]).
    """
    b, h, dk, dv = _check(q, k, v, g, beta)
    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state
    xs = [jnp.moveaxis(x, 1, 0) for x in prepare(q, k, v, g, beta)]

    def body(s, x):
        out, s = gated_delta_step(*x, s.astype(jnp.float32))
        return s, out

    state, out = jax.lax.scan(body, state.astype(jnp.float32), xs)
    return jnp.moveaxis(out, 0, 1), state


def _chunk_terms(q, k, v, g, beta):
    """What the scan across chunks reads of each chunk, from its inputs [..., C, D].

    Returns (u, w, attn, q_in, k_out, chunk_decay): the chunk's writes net of its own
    delta updates, its reads of the incoming state, its causal attention, the decayed
    queries and keys, and its total decay (shaped [..., 1, 1]).
    """
    c = q.shape[-2]
    cum = jnp.cumsum(g, axis=-1)  # [..., C]: log-decay from the chunk start
    causal = jnp.tril(jnp.ones((c, c), bool))
    # exp(cum_i - cum_j) for j <= i; -inf above the diagonal so exp never overflows.
    decay = jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    k_beta = k * beta[..., None]
    # Unit lower-triangular system (I + L) with L_ij = beta_i k_i.k_j decay_ij, j < i.
    lower = _einsum("...id,...jd->...ij", k_beta, k) * decay
    inverse = unit_lower_inverse(jnp.where(jnp.tril(causal, -1), lower, 0.0))
    u = _einsum("...ij,...jd->...id", inverse, v * beta[..., None])  # writes, net of the chunk
    w = _einsum("...ij,...jd->...id", inverse, k_beta * jnp.exp(cum)[..., None])  # state reads
    attn = _einsum("...id,...jd->...ij", q, k) * decay
    q_in = q * jnp.exp(cum)[..., None]
    k_out = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    return u, w, attn, q_in, k_out, jnp.exp(cum[..., -1])[..., None, None]


def _chunk_step(state, terms):
    """One chunk across the state: (state [B, H, Dk, Dv], its output [B, H, C, Dv])."""
    u, w, attn, q_in, k_out, chunk_decay = terms
    v_new = u - _einsum("bhck,bhkv->bhcv", w, state)
    out = _einsum("bhck,bhkv->bhcv", q_in, state) + _einsum("bhij,bhjv->bhiv", attn, v_new)
    state = state * chunk_decay + _einsum("bhck,bhcv->bhkv", k_out, v_new)
    return state, out


def _scratch(shape, like: jax.Array) -> jax.Array:
    """A float32 buffer of `shape` that the caller overwrites everywhere, made from
    `like`'s data (0 x one of its elements): a zero-filled one is a constant, which XLA
    may build at the program's start and hold until its loop runs (see `_chunk_scan`)."""
    return jnp.broadcast_to(like[(0,) * like.ndim].astype(jnp.float32) * 0.0, shape)


# Slot i of a stacked [N, ...] array, read and written in place: a dynamic slice and
# a dynamic update (`x.at[i].set` lowers to a scatter).
_take = functools.partial(jax.lax.dynamic_index_in_dim, axis=0, keepdims=False)


def _put(x, value, i):
    return jax.lax.dynamic_update_index_in_dim(x, value, i, 0)


def _chunk_loop(state, xs, *, keep_states: bool):
    """The scan across chunks as a loop writing into buffers made from the data:
    (final state, outputs [N, ...]) and, if `keep_states`, each chunk's incoming state."""
    n = xs[0].shape[0]
    out = _scratch((n, *xs[0].shape[1:-1], state.shape[-1]), xs[0])
    states = _scratch((n, *state.shape), xs[0]) if keep_states else None

    def body(i, carry):
        s, out, states = carry
        if keep_states:
            states = _put(states, s, i)
        s, o = _chunk_step(s, tuple(_take(x, i) for x in xs))
        return s, _put(out, o, i), states

    return jax.lax.fori_loop(0, n, body, (state, out, states))


@jax.custom_vjp
def _chunk_scan(state, xs):
    """`lax.scan(_chunk_step, state, xs)`, with the backward pass written out.

    Autodiff of a scan starts each stacked cotangent of `xs` (and the forward's saved
    states) as a zero-filled buffer: constants, which XLA copied at the start of a
    layer group's backward pass and held for all of its Gated DeltaNet layers
    (Qwen3.5-4B's train step on 8 H200s: 16 float32 [chunks, rows, heads, 64, 128]
    buffers, 0.5 GiB each, alive at its peak). Here the forward and the backward
    write into buffers made from the data, which exist only once their layer runs.
    (Writing the cotangents over the terms they are read from would save those
    buffers too, but XLA then copied every buffer whole in every iteration.)
    """
    s, out, _ = _chunk_loop(state, xs, keep_states=False)
    return s, out


def _chunk_scan_fwd(state, xs):
    s, out, states = _chunk_loop(state, xs, keep_states=True)
    return (s, out), (xs, states)


def _chunk_scan_bwd(residuals, cotangents):
    xs, states = residuals
    d_state, d_out = cotangents
    n = xs[0].shape[0]

    def body(j, carry):
        i = n - 1 - j
        ds, d_xs = carry
        u, w, attn, q_in, k_out, decay = (_take(x, i) for x in xs)
        s, do = _take(states, i), _take(d_out, i)
        v_new = u - _einsum("bhck,bhkv->bhcv", w, s)
        dv_new = _einsum("bhij,bhiv->bhjv", attn, do) + _einsum("bhck,bhkv->bhcv", k_out, ds)
        grads = (
            dv_new,  # d u
            -_einsum("bhcv,bhkv->bhck", dv_new, s),  # d w
            _einsum("bhiv,bhjv->bhij", do, v_new),  # d attn
            _einsum("bhcv,bhkv->bhck", do, s),  # d q_in
            _einsum("bhcv,bhkv->bhck", v_new, ds),  # d k_out
            jnp.sum(ds * s, axis=(-2, -1), keepdims=True),  # d decay
        )
        ds = (
            _einsum("bhck,bhcv->bhkv", q_in, do)
            + ds * decay
            - _einsum("bhck,bhcv->bhkv", w, dv_new)
        )
        return ds, tuple(_put(x, d, i) for x, d in zip(d_xs, grads, strict=True))

    d_xs = tuple(_scratch(x.shape, x) for x in xs)
    return jax.lax.fori_loop(0, n, body, (d_state, d_xs))


_chunk_scan.defvjp(_chunk_scan_fwd, _chunk_scan_bwd)


def _autodiff_chunk_scan(state, xs):
    """The scan across chunks differentiated by autodiff: `_chunk_scan`'s reference."""
    return jax.lax.scan(_chunk_step, state, xs)


_SCANS = {"written": _chunk_scan, "autodiff": _autodiff_chunk_scan}


def gated_delta_chunked(
    q,
    k,
    v,
    g,
    beta,
    *,
    chunk_size: int = 64,
    initial_state=None,
    normalize: bool = False,
    per_chunk: bool = False,
    backward: str = "written",
):
    """The gated delta rule in chunks: parallel within a chunk, a scan across chunks.

    Everything runs in float32 with matmuls at the highest precision. T need not
    be a multiple of `chunk_size`: the tail is padded with k = v = 0, g = 0, which
    leaves the state unchanged.

    Args:
        q, k: of shape [B, T, Hk, Dk] (as described in the module docstring, unless
            `normalize`); each key head serves H / Hk consecutive value heads.
        v: of shape [B, T, H, Dv].
        g, beta: of shape [B, T, H].
        chunk_size: C, tokens per chunk.
        initial_state: optional float32 of shape [B, H, Dk, Dv] (default zeros).
        normalize: L2-normalise q and k and scale q by 1/sqrt(Dk) here (`prepare`).
        per_chunk: take each chunk of the inputs, in their dtype, and build
            everything the scan needs of it inside the scan, one chunk at a time:
            the same arithmetic without a single float32 tensor of the inputs' size
            but the output (the sampler's prefill, which is not differentiated).
            Otherwise the inputs are prepared, and the intra-chunk terms built, for
            all chunks at once before the scan (more parallel work per op).
        backward: how the all-chunks form's loop across chunks is differentiated:
            "written" (`_chunk_scan`, its backward pass written out) or "autodiff"
            (of a `lax.scan`; the reference, which holds more memory on a GPU).

    Returns:
        (output float32 [B, T, H, Dv], final state float32 [B, H, Dk, Dv]).
    """
    b, h, dk, dv = _check(q, k, v, g, beta)
    t = q.shape[1]
    c = int(chunk_size)
    if c < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if backward not in _SCANS:
        raise ValueError(f"backward must be one of {sorted(_SCANS)}, got {backward!r}")
    pad = -t % c
    n = (t + pad) // c

    def padded(x):  # [B, T, ...] -> [B, N C, ...]
        return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))

    def split(x):  # [B, T, H, ...] -> [N, B, H, C, ...]
        return jnp.moveaxis(padded(x).reshape(b, n, c, *x.shape[2:]), (1, 3), (0, 2))

    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state
    state = state.astype(jnp.float32)
    if per_chunk:
        inputs = [padded(x) for x in (q, k, v, g, beta)]

        def body(i, carry):
            state, out = carry
            chunk = (jax.lax.dynamic_slice_in_dim(x, i * c, c, axis=1) for x in inputs)
            chunk = prepare(*chunk, normalize=normalize)
            state, o = _chunk_step(state, _chunk_terms(*(jnp.moveaxis(x, 1, 2) for x in chunk)))
            return state, jax.lax.dynamic_update_slice_in_dim(out, jnp.moveaxis(o, 1, 2), i * c, 1)

        # Each chunk's output is written over a float32 copy of v: a buffer made from
        # this call's data. A scan's zero-initialised output is a constant instead, and
        # XLA builds all layers' at once at the program's start, each then alive until
        # its layer has run (Qwen3.5-4B's sampler on 8 H200s: 1 GiB per GDN layer).
        state, out = jax.lax.fori_loop(0, n, body, (state, inputs[2].astype(jnp.float32)))
        return out[:, :t], state
    xs = _chunk_terms(*(split(x) for x in prepare(q, k, v, g, beta, normalize=normalize)))
    state, out = _SCANS[backward](state, xs)
    out = jnp.moveaxis(out, (0, 2), (1, 3)).reshape(b, n * c, h, dv)
    return out[:, :t], state
