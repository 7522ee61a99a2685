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
forms agree to float32 rounding.

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
    b, t, h, dk = q.shape
    if k.shape != q.shape or v.shape[:3] != (b, t, h) or g.shape != (b, t, h):
        raise ValueError(
            f"expected q, k [B, T, H, Dk], v [B, T, H, Dv], g, beta [B, T, H]; got "
            f"q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, beta {beta.shape}"
        )
    if beta.shape != g.shape:
        raise ValueError(f"beta {beta.shape} != g {g.shape}")
    return b, h, dk, v.shape[-1]


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
    xs = [jnp.moveaxis(x.astype(jnp.float32), 1, 0) for x in (q, k, v, g, beta)]

    def body(s, x):
        out, s = gated_delta_step(*x, s.astype(jnp.float32))
        return s, out

    state, out = jax.lax.scan(body, state.astype(jnp.float32), xs)
    return jnp.moveaxis(out, 0, 1), state


def gated_delta_chunked(q, k, v, g, beta, *, chunk_size: int = 64, initial_state=None):
    """The gated delta rule in chunks: parallel within a chunk, a scan across chunks.

    Everything runs in float32 with matmuls at the highest precision. T need not
    be a multiple of `chunk_size`: the tail is padded with k = v = 0, g = 0, which
    leaves the state unchanged.

    Args:
        q, k: of shape [B, T, H, Dk] (as described in the module docstring).
        v: of shape [B, T, H, Dv].
        g, beta: of shape [B, T, H].
        chunk_size: C, tokens per chunk.
        initial_state: optional float32 of shape [B, H, Dk, Dv] (default zeros).

    Returns:
        (output float32 [B, T, H, Dv], final state float32 [B, H, Dk, Dv]).
    """
    b, h, dk, dv = _check(q, k, v, g, beta)
    t = q.shape[1]
    c = int(chunk_size)
    if c < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    pad = -t % c
    n = (t + pad) // c

    def chunks(x):  # [B, T, H, ...] -> [N, B, H, C, ...] in float32
        x = x.astype(jnp.float32)
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, c, h, *x.shape[3:])
        return jnp.moveaxis(x, (1, 3), (0, 2))

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # [N, B, H, C]: log-decay from the chunk start
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
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]

    def body(state, x):
        u, w, attn, q_in, k_out, chunk_decay = x
        v_new = u - _einsum("bhck,bhkv->bhcv", w, state)
        out = _einsum("bhck,bhkv->bhcv", q_in, state) + _einsum("bhij,bhjv->bhiv", attn, v_new)
        state = state * chunk_decay + _einsum("bhck,bhcv->bhkv", k_out, v_new)
        return state, out

    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state
    state, out = jax.lax.scan(
        body, state.astype(jnp.float32), (u, w, attn, q_in, k_out, chunk_decay)
    )
    out = jnp.moveaxis(out, (0, 2), (1, 3)).reshape(b, n * c, h, dv)
    return out[:, :t], state
