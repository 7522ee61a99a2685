"""Grouped-query softmax attention that never holds the whole [H, T, S] score matrix.

A dense attention over T queries and S key slots materialises its scores, their
float32 softmax and the probabilities: [H, T, S] per sequence and layer, kept for
the backward pass. At T = S = 8,192 with 32 heads that is ~30 GB per layer and
sequence, so a train step over long sequences cannot fit however it is sharded.

`attend` cuts the queries into blocks of `query_block` rows and maps over them
with `lax.map`: each block's scores [H, block, S] exist only inside its step, and
the step is rematerialised (`jax.checkpoint`), so the backward pass recomputes
one block's scores at a time from q, k and v instead of keeping all of them.
Peak attention memory is then O(H * block * S) per sequence on any backend
(XLA's CPU and GPU compilers alike), at the cost of computing the scores twice
in a training step, as flash attention does. Every query row still takes its
softmax over all S slots at once, so the result is the dense one, row for row.

Shorter inputs (T <= query_block, e.g. every decode step) take the dense path.

Example:
    >>> out, (k, v) = attend(q, k, v, mask)                  # T = S, no cache
    >>> out, (k, v) = attend(q, k, v, mask, (ck, cv), 0)     # prefill into a cache
"""

import jax
import jax.numpy as jnp

# Query rows per block. The working set of one block is heads x block x slots
# scores (~13 bytes each, see `models.memory`): 1.7 GB at 32 heads, 8,192 slots.
QUERY_BLOCK = 512


def _block_attention(q, k, v, mask):
    """Softmax attention of one query block.

    Args:
        q: queries of shape [B, K, G, t, D] (G query heads per kv head).
        k, v: keys and values of shape [B, K, S, D].
        mask: bool of shape [B, t, S].

    Returns:
        Output of shape [B, t, K, G, D].
    """
    d = q.shape[-1]
    # Scores in the params dtype, softmax in float32, as the reference does.
    scores = jnp.einsum("bkgtd,bksd->bkgts", q, k) * jnp.asarray(d**-0.5, q.dtype)
    scores = scores.astype(jnp.float32)
    # finfo.min, not -inf: fully masked rows (left padding) stay finite.
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, v)


def _blocked_attention(q, k, v, mask, block: int, *, differentiable: bool = True):
    """`_block_attention` over query blocks of `block` rows, one block's scores at a time.

    Args:
        q: [B, K, G, T, D]; k, v: [B, K, S, D]; mask: bool [B, T, S].
        block: rows per block; T is padded up to a multiple of it (padded rows
            see no slot and are dropped).
        differentiable: False where nothing is differentiated (a prefill into a
            cache): each block's output is then written in place into a buffer
            made from this call's data (q, transposed), not stacked as a map's
            output, whose zero-initialised buffer is a constant that XLA builds
            for every layer at the program's start and keeps until the layer
            runs (Qwen3.5-4B's sampler on 8 H200s: 0.5 GiB per attention layer).

    Returns:
        Output of shape [B, T, K, G, D].
    """
    b, kh, g, t, d = q.shape
    n = -(-t // block)
    pad = n * block - t
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
    if not differentiable:

        def write(i, out):
            qb = jax.lax.dynamic_slice_in_dim(q, i * block, block, axis=3)
            mb = jax.lax.dynamic_slice_in_dim(mask, i * block, block, axis=1)
            return jax.lax.dynamic_update_slice_in_dim(
                out, _block_attention(qb, k, v, mb), i * block, axis=1
            )

        return jax.lax.fori_loop(0, n, write, q.transpose(0, 3, 1, 2, 4))[:, :t]
    q_blocks = jnp.moveaxis(q.reshape(b, kh, g, n, block, d), 3, 0)  # [n, B, K, G, block, D]
    mask_blocks = jnp.moveaxis(mask.reshape(b, n, block, -1), 1, 0)  # [n, B, block, S]

    # Rematerialised: the backward pass keeps only each block's inputs (k and v
    # are loop constants, not stacked) and rebuilds its scores when it needs them.
    @jax.checkpoint
    def one(xs):
        qb, mb = xs
        return _block_attention(qb, k, v, mb)

    out = jax.lax.map(one, (q_blocks, mask_blocks))  # [n, B, block, K, G, D]
    out = jnp.moveaxis(out, 0, 1).reshape(b, n * block, kh, g, d)
    return out[:, :t]


def attend(q, k, v, mask, kv=None, cache_index=None, *, query_block: int = QUERY_BLOCK):
    """Grouped-query softmax attention, optionally through a fixed-size cache.

    Args:
        q: queries of shape [B, T, H, D] (after norm and rotary embedding).
        k, v: new keys and values of shape [B, T, K, D]; H is a multiple of K.
        mask: bool of shape [B, T, S]; True where a query may attend a slot.
        kv: optional cached (k, v), each [B, K, S, D]; the new keys are written
            at slots [cache_index, cache_index + T).
        cache_index: int scalar, first slot to write.
        query_block: queries per block when T is larger (see the module
            docstring); the result does not depend on it.

    Returns:
        (output [B, T, H * D], (k, v) of shape [B, K, S, D], S = T without a cache).
    """
    if query_block < 1:
        raise ValueError(f"query_block must be >= 1, got {query_block}")
    b, t, h, d = q.shape
    groups = h // k.shape[2]
    # Heads before positions ([B, K, S, D]): attention is then a batched matmul
    # over (B, K) with no transpose of the cache, 4-5x faster when decoding.
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if kv is not None:
        start = (0, 0, cache_index, 0)
        k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), start)
        v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), start)
    q = q.reshape(b, t, k.shape[1], groups, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
    if t <= query_block:
        out = _block_attention(q, k, v, mask)
    else:
        out = _blocked_attention(q, k, v, mask, query_block, differentiable=kv is None)
    return out.reshape(b, t, -1), (k, v)
