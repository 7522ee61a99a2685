"""Qwen3.5 hybrid decoder in Flax NNX: Gated DeltaNet and gated attention layers.

Architecture (as in the `transformers` reference, `modeling_qwen3_5`): pre-norm
blocks whose token mixer follows `config.layer_types`,

* "linear_attention" (Gated DeltaNet): `in_proj_qkv` -> causal depthwise conv
  (SiLU) -> q, k, v; q and k L2-normalised, q scaled by 1/sqrt(Dk);
  beta = sigmoid(`in_proj_b`), g = -exp(A_log) softplus(`in_proj_a` + dt_bias);
  the gated delta rule (`gated_delta`) with a float32 state; the output goes
  through an RMSNorm gated by SiLU(`in_proj_z`) and `out_proj`. Padded tokens
  are zeroed before the projections, so left padding is exact;
* "full_attention": `q_proj` yields queries and a per-head sigmoid output gate;
  q/k RMSNorm, rotary embedding on the first `rotary_dim` dims, GQA;

each followed by a SwiGLU MLP. RMSNorms scale by (1 + w). The call signature is
the dense `Qwen3`'s, so `qwen3.apply`, the sampler and the train step take
either; a token is padding iff the mask hides its own slot from it.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl_jax.models import layer_scan
from wmrl_jax.models.attention import QUERY_BLOCK, attend
from wmrl_jax.models.gated_delta import gated_delta_chunked, gated_delta_step, prepare
from wmrl_jax.models.qwen3 import (
    MLP,
    REMAT_POLICY,
    Linear,
    layer_call,
    rope_cos_sin,
    rotate_half,
)
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config

CHUNK_SIZE = 64


class AttentionCache(NamedTuple):
    """A full-attention layer's keys and values, each [B, K, S, D]."""

    k: jax.Array
    v: jax.Array


class DeltaCache(NamedTuple):
    """A Gated DeltaNet layer's decode state.

    Attributes:
        conv: the last (kernel - 1) conv inputs, of shape [B, conv_dim, kernel - 1].
        state: the recurrent state, float32 of shape [B, Hv, Dk, Dv].
    """

    conv: jax.Array
    state: jax.Array


class HybridCache(NamedTuple):
    """Per-layer caches (`AttentionCache` or `DeltaCache`, by layer type), one pytree."""

    layers: tuple


def init_cache(config: Qwen3_5Config, batch: int, slots: int, dtype) -> HybridCache:
    """An all-zero cache: `slots` key/value positions, empty conv windows and states."""
    c = config
    layers = []
    for kind in c.layer_types:
        if kind == "full_attention":
            shape = (batch, c.num_key_value_heads, slots, c.head_dim)
            layers.append(AttentionCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
        else:
            conv = jnp.zeros((batch, c.conv_dim, c.linear_conv_kernel_dim - 1), dtype)
            heads, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
            layers.append(DeltaCache(conv, jnp.zeros((batch, heads, dk, dv), jnp.float32)))
    return HybridCache(tuple(layers))


class RMSNorm(nnx.Module):
    """x / rms(x) * (1 + w) in float32, cast to the input dtype (w starts at zero)."""

    def __init__(self, dim: int, *, eps: float, dtype):
        self.weight = nnx.Param(jnp.zeros((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """w * (x / rms(x)) * silu(z): the normalised output of a GDN head, gated."""

    def __init__(self, dim: int, *, eps: float, dtype):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array, z: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        y = self.weight[...] * x32.astype(x.dtype)
        return (y * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)


class Conv(nnx.Module):
    """Depthwise causal conv weights in the checkpoint's layout [channels, 1, kernel]."""

    def __init__(self, channels: int, kernel: int, *, dtype, rngs: nnx.Rngs):
        init = nnx.initializers.normal(kernel**-0.5)
        self.weight = nnx.Param(init(rngs.params(), (channels, 1, kernel), dtype))


class GatedDeltaNet(nnx.Module):
    """The linear-attention token mixer (see the module docstring)."""

    def __init__(self, config: Qwen3_5Config, *, dtype, rngs: nnx.Rngs):
        c = config
        self.config = c
        h, heads = c.hidden_size, c.linear_num_value_heads
        self.in_proj_qkv = Linear(h, c.conv_dim, bias=False, dtype=dtype, rngs=rngs)
        self.in_proj_z = Linear(h, c.linear_value_dim, bias=False, dtype=dtype, rngs=rngs)
        self.in_proj_b = Linear(h, heads, bias=False, dtype=dtype, rngs=rngs)
        self.in_proj_a = Linear(h, heads, bias=False, dtype=dtype, rngs=rngs)
        self.conv1d = Conv(c.conv_dim, c.linear_conv_kernel_dim, dtype=dtype, rngs=rngs)
        self.dt_bias = nnx.Param(jnp.ones((heads,), dtype))
        decay = jax.random.uniform(rngs.params(), (heads,), jnp.float32, 1.0, 16.0)
        self.A_log = nnx.Param(jnp.log(decay).astype(dtype))
        self.norm = GatedRMSNorm(c.linear_value_head_dim, eps=c.rms_norm_eps, dtype=dtype)
        self.out_proj = Linear(c.linear_value_dim, h, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x, token_mask, cache: DeltaCache | None = None):
        """Mixes T tokens, continuing from `cache` if given.

        Args:
            x: hidden states of shape [B, T, hidden].
            token_mask: bool of shape [B, T]; False for padding.
            cache: optional `DeltaCache` of the tokens before these.

        Returns:
            (output [B, T, hidden], the updated `DeltaCache`).
        """
        c = self.config
        b, t, _ = x.shape
        x = x * token_mask[..., None].astype(x.dtype)
        qkv = self.in_proj_qkv(x)  # [B, T, conv_dim]
        width = c.linear_conv_kernel_dim
        if cache is None:
            past = jnp.zeros((b, width - 1, c.conv_dim), qkv.dtype)
        else:
            past = cache.conv.transpose(0, 2, 1).astype(qkv.dtype)
        window = jnp.concatenate([past, qkv], axis=1)  # [B, kernel - 1 + T, conv_dim]
        weight = self.conv1d.weight[...][:, 0, :].T  # [kernel, conv_dim]
        mixed = sum(window[:, j : j + t] * weight[j] for j in range(width))
        mixed = jax.nn.silu(mixed)
        kd, hk, hv = c.linear_key_dim, c.linear_num_key_heads, c.linear_num_value_heads
        q = mixed[..., :kd].reshape(b, t, hk, c.linear_key_head_dim)
        k = mixed[..., kd : 2 * kd].reshape(b, t, hk, c.linear_key_head_dim)
        v = mixed[..., 2 * kd :].reshape(b, t, hv, c.linear_value_head_dim)
        beta = jax.nn.sigmoid(self.in_proj_b(x)).astype(jnp.float32)
        a = self.in_proj_a(x).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
        state = None if cache is None else cache.state
        if cache is not None and t == 1:
            q, k, v, g, beta = prepare(
                q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], normalize=True
            )
            out, state = gated_delta_step(q, k, v, g, beta, state)
            out = out[:, None]
        else:
            # With a cache (the sampler's prefill) nothing is differentiated: each chunk is
            # prepared in the scan, so no float32 tensor of the inputs' size is made.
            out, state = gated_delta_chunked(
                q, k, v, g, beta, chunk_size=CHUNK_SIZE, initial_state=state, normalize=True,
                per_chunk=cache is not None,
            )  # fmt: skip
        z = self.in_proj_z(x).reshape(b, t, hv, c.linear_value_head_dim)
        out = self.norm(out.astype(x.dtype), z).reshape(b, t, -1)
        conv_state = window[:, t:].transpose(0, 2, 1)  # the last kernel - 1 inputs
        out = self.out_proj(out)
        if cache is not None:
            # The window is taken before the layer's output is used: else XLA slices it
            # late and keeps each layer's [B, T, conv_dim] projection alive through the
            # prefill (Qwen3.5-4B's sampler for 8 H200s: 1 GiB per Gated DeltaNet layer).
            out, conv_state = jax.lax.optimization_barrier((out, conv_state))
        return out, DeltaCache(conv_state, state)


class GatedAttention(nnx.Module):
    """GQA with q/k RMSNorm, partial rotary embedding and a sigmoid output gate."""

    def __init__(self, config: Qwen3_5Config, *, dtype, rngs: nnx.Rngs):
        c = config
        self.config = c
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = Linear(c.hidden_size, 2 * q, bias=False, dtype=dtype, rngs=rngs)
        self.k_proj = Linear(c.hidden_size, kv, bias=False, dtype=dtype, rngs=rngs)
        self.v_proj = Linear(c.hidden_size, kv, bias=False, dtype=dtype, rngs=rngs)
        self.o_proj = Linear(q, c.hidden_size, bias=False, dtype=dtype, rngs=rngs)
        self.q_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps, dtype=dtype)
        self.k_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps, dtype=dtype)

    def __call__(
        self,
        x,
        cos,
        sin,
        mask,
        cache: AttentionCache | None = None,
        cache_index=None,
        *,
        query_block=QUERY_BLOCK,
    ):
        """As `qwen3.Attention`, with cos/sin of shape [B, T, 1, rotary_dim]."""
        c = self.config
        b, t, _ = x.shape
        # Per head, the projection holds [query (D), gate (D)].
        qg = self.q_proj(x).reshape(b, t, c.num_attention_heads, 2 * c.head_dim)
        q, gate = qg[..., : c.head_dim], qg[..., c.head_dim :].reshape(b, t, -1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        r = c.rotary_dim
        q = jnp.concatenate([rotate_half(q[..., :r], cos, sin), q[..., r:]], axis=-1)
        k = jnp.concatenate([rotate_half(k[..., :r], cos, sin), k[..., r:]], axis=-1)
        out, (k, v) = attend(q, k, v, mask, cache, cache_index, query_block=query_block)
        return self.o_proj(out * jax.nn.sigmoid(gate)), AttentionCache(k, v)


class Block(nnx.Module):
    """Pre-norm residual block with a GDN or gated-attention mixer, then an MLP."""

    def __init__(self, config: Qwen3_5Config, layer_type: str, *, dtype, rngs: nnx.Rngs):
        eps = config.rms_norm_eps
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, dtype=dtype, rngs=rngs)
        else:
            self.self_attn = GatedAttention(config, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(
        self,
        x,
        cos,
        sin,
        mask,
        token_mask,
        cache=None,
        cache_index=None,
        *,
        query_block=QUERY_BLOCK,
    ):
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h, cache = self.linear_attn(h, token_mask, cache)
        else:
            h, cache = self.self_attn(
                h, cos, sin, mask, cache, cache_index, query_block=query_block
            )
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), cache


def self_visible(mask: jax.Array, cache_index=None) -> jax.Array:
    """Whether each token may attend its own slot, i.e. is not padding: [B, T, S] -> [B, T]."""
    t = mask.shape[1]
    slots = jnp.arange(t) + (0 if cache_index is None else cache_index)
    index = jnp.broadcast_to(slots[None, :, None], (mask.shape[0], t, 1))
    return jnp.take_along_axis(mask, index, axis=-1)[..., 0]


class Qwen3_5(nnx.Module):
    """Qwen3.5 hybrid causal LM (language model of the "qwen3_5" / "qwen3_5_text" types).

    Example:
        >>> model = Qwen3_5(config, rngs=nnx.Rngs(0))
        >>> logits, _ = model(input_ids, positions, mask)   # [B, T, V] float32
    """

    def __init__(self, config: Qwen3_5Config, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(0.02)
        self.embed_tokens = nnx.Param(
            init(rngs.params(), (config.vocab_size, config.hidden_size), dtype)
        )
        self.layers = nnx.List(
            [Block(config, kind, dtype=dtype, rngs=rngs) for kind in config.layer_types]
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

    def init_cache(self, batch: int, slots: int, dtype) -> HybridCache:
        """An all-zero decode cache of `slots` attention positions for `batch` rows."""
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
        """Float32 logits for `input_ids` (arguments and returns as `qwen3.Qwen3.__call__`).

        With a `HybridCache`, the tokens continue the sequence the cache holds:
        attention layers write their slots from `cache_index`, GDN layers carry
        their conv window and state forward.
        """
        x = jnp.take(self.embed_tokens[...], input_ids, axis=0)
        cos, sin = rope_cos_sin(self.config, positions, x.dtype, self.config.rotary_dim)
        token_mask = self_visible(mask, cache_index)
        caches, layers = [], self.layers
        if remat and cache is None:  # training: one group rebuilt per backward iteration
            x = layer_scan.scan_layers(
                layers, x, cos, sin, mask, token_mask, query_block=query_block,
                policy=REMAT_POLICY,
            )  # fmt: skip
            layers = ()
        for i, layer in enumerate(layers):
            layer_cache = None if cache is None else cache.layers[i]
            call = layer_call(layer, remat=remat, query_block=query_block)
            x, layer_cache = call(x, cos, sin, mask, token_mask, layer_cache, cache_index)
            caches.append(layer_cache)
        if last_only:
            x = x[:, -1:]
        x = self.norm(x)
        new_cache = None if cache is None else HybridCache(tuple(caches))
        if features_only:  # the LM head's input, for a caller that applies it in blocks
            return x, new_cache
        logits = jnp.dot(x, self.head_weight(), preferred_element_type=jnp.float32)
        return logits, new_cache
