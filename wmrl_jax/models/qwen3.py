"""Qwen3 dense decoder in Flax NNX, with a functional boundary for jit and grad.

Architecture (as in the `transformers` reference): token embedding (unscaled),
pre-norm blocks of grouped-query attention (explicit `head_dim`, per-head RMSNorm
on q and k before the rotary embedding) and a SwiGLU MLP, a final RMSNorm and a
tied or untied LM head. Linear kernels are stored as [in, out].

The NNX module is split once with `nnx.split` into a `GraphDef` and a params
`State`; `apply` is a pure function of that state, so a train step can take the
params pytree as its argument:

    graphdef, params = nnx.split(Qwen3(config, rngs=nnx.Rngs(0)))
    logits, _ = apply(graphdef, params, input_ids, attention_mask=mask)
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl_jax.models import layer_scan
from wmrl_jax.models.attention import QUERY_BLOCK, attend
from wmrl_jax.models.config import Qwen3Config
from wmrl_jax.models.rope import rope_frequencies


class KVCache(NamedTuple):
    """Fixed-size key/value cache, one array per layer.

    Separate per-layer arrays (not one stacked [L, ...] array) let XLA update
    each layer's buffer in place inside the decode loop.

    Attributes:
        k: per-layer keys, each of shape [B, K, S, D] (batch, kv heads, slots, head dim).
        v: per-layer values, each of shape [B, K, S, D].
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def init_cache(config: Qwen3Config, batch: int, slots: int, dtype) -> KVCache:
    """An all-zero cache of `slots` positions for `batch` rows."""
    shape = (batch, config.num_key_value_heads, slots, config.head_dim)
    layers = range(config.num_hidden_layers)
    return KVCache(
        tuple(jnp.zeros(shape, dtype) for _ in layers),
        tuple(jnp.zeros(shape, dtype) for _ in layers),
    )


class Linear(nnx.Module):
    """y = x W (+ b) (+ s x A B) with W of shape [in, out].

    `lora` is None unless `models.lora.attach` gives the projection a low-rank
    adapter (an `nnx.LoRA` with A [in, r], B [r, out] and its scale s = alpha / r).
    """

    def __init__(self, d_in: int, d_out: int, *, bias: bool, dtype, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        self.kernel = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))
        self.bias = nnx.Param(jnp.zeros((d_out,), dtype)) if bias else None
        self.lora = nnx.data(None)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.dot(x, self.kernel[...])
        y = y if self.bias is None else y + self.bias[...]
        if self.lora is None:
            return y
        # x A first: the adapter costs O(r (in + out)) per token, never an [in, out] matrix.
        return y + self.lora(x) * jnp.asarray(self.lora.scale, y.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm in float32, cast back to the input dtype before the weight multiply."""

    def __init__(self, dim: int, *, eps: float, dtype):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * x32.astype(x.dtype)


def rotate_half(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding of x [..., D] (halves paired) with cos/sin tables broadcast to it."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def rope_cos_sin(
    config: Qwen3Config, positions: jax.Array, dtype, dim: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables for integer positions of shape [B, T]; each [B, T, 1, dim].

    `dim` is the number of rotated dims per head (default `config.head_dim`).
    """
    dim = config.head_dim if dim is None else dim
    inv_freq, scale = rope_frequencies(config.rope, dim)
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return (jnp.cos(emb) * scale).astype(dtype), (jnp.sin(emb) * scale).astype(dtype)


class Attention(nnx.Module):
    """Grouped-query attention with q/k RMSNorm and rotary embedding."""

    def __init__(self, config: Qwen3Config, *, dtype, rngs: nnx.Rngs):
        c, bias = config, config.attention_bias
        self.config = config
        self.q_proj = Linear(
            c.hidden_size, c.num_attention_heads * c.head_dim, bias=bias, dtype=dtype, rngs=rngs
        )
        self.k_proj = Linear(
            c.hidden_size, c.num_key_value_heads * c.head_dim, bias=bias, dtype=dtype, rngs=rngs
        )
        self.v_proj = Linear(
            c.hidden_size, c.num_key_value_heads * c.head_dim, bias=bias, dtype=dtype, rngs=rngs
        )
        self.o_proj = Linear(
            c.num_attention_heads * c.head_dim, c.hidden_size, bias=bias, dtype=dtype, rngs=rngs
        )
        self.q_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps, dtype=dtype)
        self.k_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps, dtype=dtype)

    def __call__(self, x, cos, sin, mask, kv=None, cache_index=None, *, query_block=QUERY_BLOCK):
        """Attends from T query tokens to S key slots.

        Args:
            x: hidden states of shape [B, T, hidden].
            cos, sin: rotary tables of shape [B, T, 1, head_dim].
            mask: bool of shape [B, T, S]; True where a query may attend a slot.
            kv: optional cached (k, v), each [B, K, S, D]; the new keys are written
                at slots [cache_index, cache_index + T).
            cache_index: int scalar, first slot to write.
            query_block: queries per block of `attention.attend` (memory only).

        Returns:
            (output [B, T, hidden], (k, v) of shape [B, K, S, D], S = T without a cache).
        """
        c = self.config
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, t, c.num_attention_heads, c.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        q, k = rotate_half(q, cos, sin), rotate_half(k, cos, sin)
        out, kv = attend(q, k, v, mask, kv, cache_index, query_block=query_block)
        return self.o_proj(out), kv


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen3Config, *, dtype, rngs: nnx.Rngs):
        h, f = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(h, f, bias=False, dtype=dtype, rngs=rngs)
        self.up_proj = Linear(h, f, bias=False, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(f, h, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: Qwen3Config, *, dtype, rngs: nnx.Rngs):
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.self_attn = Attention(config, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, cos, sin, mask, kv=None, cache_index=None, *, query_block=QUERY_BLOCK):
        h = self.input_layernorm(x)
        attn, kv = self.self_attn(h, cos, sin, mask, kv, cache_index, query_block=query_block)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Qwen3(nnx.Module):
    """Qwen3 dense causal LM.

    Example:
        >>> model = Qwen3(config, rngs=nnx.Rngs(0))
        >>> logits, _ = model(input_ids, positions, mask)   # [B, T, V] float32
    """

    def __init__(self, config: Qwen3Config, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(0.02)
        self.embed_tokens = nnx.Param(
            init(rngs.params(), (config.vocab_size, config.hidden_size), dtype)
        )
        self.layers = nnx.List(
            [Block(config, dtype=dtype, rngs=rngs) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nnx.Param(init(rngs.params(), (config.hidden_size, config.vocab_size), dtype))
        )

    def head_weight(self) -> jax.Array:
        """The LM head as a matrix [hidden, V] (the embedding, transposed, when tied)."""
        return self.embed_tokens[...].T if self.lm_head is None else self.lm_head[...]

    def init_cache(self, batch: int, slots: int, dtype) -> KVCache:
        """An all-zero decode cache of `slots` positions for `batch` rows."""
        return init_cache(self.config, batch, slots, dtype)

    def __call__(
        self,
        input_ids,
        positions,
        mask,
        cache=None,
        cache_index=None,
        last_only=False,
        *,
        remat: bool = False,
        query_block: int = QUERY_BLOCK,
        features_only: bool = False,
    ):
        """Float32 logits for `input_ids`.

        Args:
            input_ids: int of shape [B, T].
            positions: int rotary positions of shape [B, T] (per row, so left
                padding does not shift them).
            mask: bool of shape [B, T, S]; S = T without a cache, else the cache size.
            cache: optional `KVCache`; updated with this call's keys and values.
            cache_index: int scalar, the cache slot of `input_ids[:, 0]`.
            last_only: compute logits for the last position only (T' = 1), as a
                sampler's prefill needs; saves the LM head on the prompt.
            remat: rematerialise each layer in the backward pass (`layer_call`);
                without a cache the layers then run under `lax.scan`
                (`layer_scan.scan_layers`), so the backward rebuilds one at a time.
            query_block: queries per attention block (`attention.attend`).
            features_only: return the LM head's input (after the final norm),
                of shape [B, T', hidden] in the params dtype, instead of logits.

        Returns:
            (logits float32 of shape [B, T', V], the updated cache or None).
        """
        x = jnp.take(self.embed_tokens[...], input_ids, axis=0)
        cos, sin = rope_cos_sin(self.config, positions, x.dtype)
        ks, vs = [], []
        layers = self.layers
        if remat and cache is None:  # training: one layer rebuilt per backward iteration
            x = layer_scan.scan_layers(
                layers, x, cos, sin, mask, query_block=query_block, policy=REMAT_POLICY
            )
            layers = ()
        for i, layer in enumerate(layers):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            call = layer_call(layer, remat=remat, query_block=query_block)
            x, (k, v) = call(x, cos, sin, mask, kv, cache_index)
            ks.append(k)
            vs.append(v)
        if last_only:
            x = x[:, -1:]
        x = self.norm(x)
        new_cache = None if cache is None else KVCache(tuple(ks), tuple(vs))
        if features_only:  # the LM head's input, for a caller that applies it in blocks
            return x, new_cache
        logits = jnp.dot(x, self.head_weight(), preferred_element_type=jnp.float32)
        return logits, new_cache


# Per-layer remat keeps nothing but each layer's inputs: the backward pass reruns one
# layer's forward at a time (about a third more compute for the smallest footprint).
REMAT_POLICY = jax.checkpoint_policies.nothing_saveable


def layer_call(layer: nnx.Module, *, remat: bool, query_block: int):
    """`layer`'s forward as a function of its positional arguments.

    With `remat`, the function is `jax.checkpoint`ed over the layer's params and
    inputs under `REMAT_POLICY`: a training pass keeps only the layer's inputs
    for the backward pass, which recomputes the layer's activations when it
    reaches it. Values and gradients are those of the plain call.

    Under a mesh in context (`jax.sharding.use_abstract_mesh`, as the train step
    and the sampler set it) the layer gathers its weights over `fsdp` where it
    uses them and keeps the batch split (`layer_scan.apply_layer`), with or
    without remat, with or without a cache; no-op without one.
    """
    graphdef, state = nnx.split(layer)
    call = functools.partial(layer_scan.apply_layer, graphdef, query_block)
    if remat:
        call = jax.checkpoint(call, policy=REMAT_POLICY)
    return functools.partial(call, state)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Per-row positions: 0 at each row's first real token. [B, T] int32 -> [B, T] int32."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def causal_mask(attention_mask: jax.Array) -> jax.Array:
    """Causal and padding mask [B, T, T] from a [B, T] mask of real tokens."""
    t = attention_mask.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    return causal[None] & attention_mask.astype(bool)[:, None, :]


def _inputs(input_ids, attention_mask, positions):
    """Checked ids, the [B, T, T] causal + padding mask and per-row positions."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape [B, T], got {input_ids.shape}")
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {attention_mask.shape} != input_ids {input_ids.shape}")
    if positions is None:
        positions = positions_from_mask(attention_mask)
    return causal_mask(attention_mask), positions


def apply(
    graphdef,
    params,
    input_ids,
    attention_mask=None,
    positions=None,
    *,
    remat: bool = False,
    query_block: int = QUERY_BLOCK,
):
    """Pure forward pass of a split model: float32 logits [B, T, V].

    Args:
        graphdef: the `nnx.GraphDef` of a `Qwen3`.
        params: its `nnx.State` (any pytree with that structure, e.g. a grad).
        input_ids: int of shape [B, T].
        attention_mask: optional of shape [B, T], 1 for real tokens, 0 for
            (left) padding. Defaults to all ones.
        positions: optional int of shape [B, T]; defaults to
            `positions_from_mask(attention_mask)`.
        remat: per-layer rematerialisation (a training pass's memory, not its values).
        query_block: queries per attention block (memory, not values).

    Returns:
        Logits, float32 of shape [B, T, V].
    """
    mask, positions = _inputs(input_ids, attention_mask, positions)
    model = nnx.merge(graphdef, params)
    logits, _ = model(input_ids, positions, mask, remat=remat, query_block=query_block)
    return logits


def apply_features(
    graphdef,
    params,
    input_ids,
    attention_mask=None,
    positions=None,
    *,
    remat: bool = False,
    query_block: int = QUERY_BLOCK,
):
    """`apply` up to the LM head: its input and its weight, for a blocked head.

    Args:
        As `apply`.

    Returns:
        (features of shape [B, T, hidden] in the params dtype, the head [hidden, V]);
        `features @ head` in float32 is `apply`'s logits.
    """
    mask, positions = _inputs(input_ids, attention_mask, positions)
    model = nnx.merge(graphdef, params)
    features, _ = model(
        input_ids, positions, mask, remat=remat, query_block=query_block, features_only=True
    )
    return features, model.head_weight()


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log p(targets) in float32: logits [B, T, V], targets int [B, T] -> [B, T]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
