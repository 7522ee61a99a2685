"""Bytes a decoder needs per device: exact param shapes, caches, and activation estimates.

Everything here is arithmetic on a typed config (`Qwen3Config` or `Qwen3_5Config`)
and the sizes of a (data, fsdp, tensor) mesh; nothing allocates or traces. Two
kinds of number come out:

* **Exact**: `param_shapes` lists every parameter with the path and shape the Flax
  module gives it (tested leaf by leaf against `api.abstract_split`), and
  `param_elements_per_device` shards each one by the partition rules of
  `models.sharding`, so a dim an axis does not divide stays whole, as it does
  on a real mesh. Decode caches (`cache_bytes_per_row`) are exact too: keys and
  values of the attention layers, conv windows and float32 recurrent states of
  the Gated DeltaNet layers, as `init_cache` allocates them.
* **Estimates**: the transient memory of a forward (`prefill_bytes_per_row`) and
  the activations a backward pass keeps (`train_bytes_per_row`). Both follow
  the code as written. Attention (`models.attention.attend`) is dense up to
  `QUERY_BLOCK` queries -- its [H, T, S] scores (float32 scores plus the einsum
  output and the probabilities in the compute dtype) are then residuals of the
  backward pass -- and beyond that runs one block of queries at a time, keeping
  only the queries and the mask and recomputing one block's scores in the
  backward pass. Without remat every layer keeps its residuals and the LM head's
  float32 logits exist for every position; with remat (the train step's
  ``remat=True``) each layer keeps its input only, one layer is rebuilt at a time
  and the head runs in `TOKEN_BLOCK` blocks, and the peak is the larger of the
  head's blocks and one rebuilt layer's backward (they run one after the other).
  The chunked gated delta rule keeps float32 per-token tensors, C x C chunk
  matrices and one state per chunk. The per-element coefficients are checked
  against XLA's own buffer assignment (`compiled.memory_analysis()`) of the
  train step (dense, blocked, blocked with remat; with the gradients XLA's
  temporaries also hold), the prefill (dense and blocked) and the delta rule on
  the CPU backend (tests/models/test_memory.py), and against the sharded step's
  compiles (tests/test_aot.py on CPU devices, `benchmarks.aot` for an H200
  target). The saving of
  remat across layers holds because the remat forward runs its layers under
  `lax.scan` (`models.layer_scan`: the backward rebuilds one layer per
  iteration); with a Python loop of checkpointed layers XLA ran the
  recomputations early and its temporaries grew per layer as without remat
  (tests/test_aot.py compares the plan with XLA's per-layer growth and total).

Example:
    >>> shapes = param_shapes(config)
    >>> param_count(config), param_elements_per_device(config, {"fsdp": 8})
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from jax.sharding import AbstractMesh

from wmrl_jax.models import sharding
from wmrl_jax.models.attention import QUERY_BLOCK
from wmrl_jax.models.config import Qwen3Config
from wmrl_jax.models.lm_head import TOKEN_BLOCK
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config

Path = tuple
DecoderConfig = Qwen3Config | Qwen3_5Config

CHUNK_SIZE = 64  # `qwen3_5.CHUNK_SIZE`: tokens per chunk of the gated delta rule.


def _mlp(h: int, f: int) -> dict[Path, tuple[int, ...]]:
    return {
        ("mlp", "gate_proj", "kernel"): (h, f),
        ("mlp", "up_proj", "kernel"): (h, f),
        ("mlp", "down_proj", "kernel"): (f, h),
    }


def _qwen3_layer(c: Qwen3Config) -> dict[Path, tuple[int, ...]]:
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = {
        ("input_layernorm", "weight"): (h,),
        ("post_attention_layernorm", "weight"): (h,),
        ("self_attn", "q_proj", "kernel"): (h, q),
        ("self_attn", "k_proj", "kernel"): (h, kv),
        ("self_attn", "v_proj", "kernel"): (h, kv),
        ("self_attn", "o_proj", "kernel"): (q, h),
        ("self_attn", "q_norm", "weight"): (c.head_dim,),
        ("self_attn", "k_norm", "weight"): (c.head_dim,),
        **_mlp(h, c.intermediate_size),
    }
    if c.attention_bias:
        for name, dim in (("q_proj", q), ("k_proj", kv), ("v_proj", kv), ("o_proj", h)):
            out[("self_attn", name, "bias")] = (dim,)
    return out


def _qwen3_5_layer(c: Qwen3_5Config, kind: str) -> dict[Path, tuple[int, ...]]:
    h = c.hidden_size
    out = {
        ("input_layernorm", "weight"): (h,),
        ("post_attention_layernorm", "weight"): (h,),
        **_mlp(h, c.intermediate_size),
    }
    if kind == "full_attention":
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        out |= {
            ("self_attn", "q_proj", "kernel"): (h, 2 * q),  # queries and their output gate
            ("self_attn", "k_proj", "kernel"): (h, kv),
            ("self_attn", "v_proj", "kernel"): (h, kv),
            ("self_attn", "o_proj", "kernel"): (q, h),
            ("self_attn", "q_norm", "weight"): (c.head_dim,),
            ("self_attn", "k_norm", "weight"): (c.head_dim,),
        }
    else:
        heads = c.linear_num_value_heads
        out |= {
            ("linear_attn", "in_proj_qkv", "kernel"): (h, c.conv_dim),
            ("linear_attn", "in_proj_z", "kernel"): (h, c.linear_value_dim),
            ("linear_attn", "in_proj_b", "kernel"): (h, heads),
            ("linear_attn", "in_proj_a", "kernel"): (h, heads),
            ("linear_attn", "conv1d", "weight"): (c.conv_dim, 1, c.linear_conv_kernel_dim),
            ("linear_attn", "dt_bias"): (heads,),
            ("linear_attn", "A_log"): (heads,),
            ("linear_attn", "norm", "weight"): (c.linear_value_head_dim,),
            ("linear_attn", "out_proj", "kernel"): (c.linear_value_dim, h),
        }
    return out


def layer_kinds(config: DecoderConfig) -> tuple[str, ...]:
    """Per layer, "full_attention" or "linear_attention" (a dense Qwen3 is all attention)."""
    if isinstance(config, Qwen3_5Config):
        return config.layer_types
    return ("full_attention",) * config.num_hidden_layers


def layer_shapes(config: DecoderConfig, index: int) -> dict[Path, tuple[int, ...]]:
    """Param shapes of decoder layer `index`, keyed by path inside the layer."""
    if isinstance(config, Qwen3_5Config):
        return _qwen3_5_layer(config, config.layer_types[index])
    return _qwen3_layer(config)


def param_shapes(config: DecoderConfig) -> dict[Path, tuple[int, ...]]:
    """Every parameter's shape, keyed by its path in `nnx.to_pure_dict(params)`.

    Mirrors the modules of `models.qwen3` and `models.qwen3_5` (the vision tower
    and MTP head of a Qwen3.5 checkpoint are not loaded, so not counted).

    Returns:
        {("embed_tokens",): (V, hidden), ("layers", i, "mlp", "up_proj", "kernel"): ..., ...}
    """
    out: dict[Path, tuple[int, ...]] = {("embed_tokens",): (config.vocab_size, config.hidden_size)}
    for i in range(config.num_hidden_layers):
        out |= {("layers", i, *path): shape for path, shape in layer_shapes(config, i).items()}
    out[("norm", "weight")] = (config.hidden_size,)
    if not config.tie_word_embeddings:
        out[("lm_head",)] = (config.hidden_size, config.vocab_size)
    return out


@functools.cache
def param_count(config: DecoderConfig) -> int:
    """Number of parameters of the language model."""
    return sum(math.prod(s) for s in param_shapes(config).values())


def abstract_mesh(mesh: Mapping[str, int]) -> AbstractMesh:
    """A device-free (data, fsdp, tensor) mesh of the given axis sizes (missing axes: 1)."""
    sizes = tuple(int(mesh.get(a, 1)) for a in sharding.MESH_AXES)
    return AbstractMesh(sizes, sharding.MESH_AXES)


def shard_elements(shape, spec, mesh: AbstractMesh) -> int:
    """Elements of one array on one device under a PartitionSpec (the axes divide exactly)."""
    count = 1
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        count *= dim // math.prod(mesh.shape[a] for a in names)
    return count


def param_elements_per_device(config: DecoderConfig, mesh: Mapping[str, int]) -> int:
    """Param elements one device holds when the params are sharded by `models.sharding`."""
    return _elements_per_device(config, tuple(int(mesh.get(a, 1)) for a in sharding.MESH_AXES))


@functools.cache
def _elements_per_device(config: DecoderConfig, sizes: tuple[int, ...]) -> int:
    abstract = abstract_mesh(dict(zip(sharding.MESH_AXES, sizes, strict=True)))
    return sum(
        shard_elements(shape, sharding.param_spec(path, shape, abstract), abstract)
        for path, shape in param_shapes(config).items()
    )


def layer_elements_per_device(config: DecoderConfig, mesh: Mapping[str, int]) -> int:
    """Param elements of the decoder layers (no embedding, final norm or head) on one device."""
    abstract = abstract_mesh(mesh)
    return sum(
        shard_elements(shape, sharding.param_spec(path, shape, abstract), abstract)
        for path, shape in param_shapes(config).items()
        if path[0] == "layers"
    )


@functools.cache
def largest_layer_elements(config: DecoderConfig) -> int:
    """Params of the largest decoder layer (what an FSDP all-gather brings in at once)."""
    return max(
        sum(math.prod(s) for s in layer_shapes(config, i).values())
        for i in range(config.num_hidden_layers)
    )


def _split(count: int, tensor: int) -> int:
    """Heads (or channels) per device: `tensor` divides them, or they stay whole."""
    return count // tensor if count % tensor == 0 else count


def cache_bytes_per_row(config: DecoderConfig, slots: int, dtype_bytes: int, tensor: int = 1):
    """Decode-cache bytes of one sequence on one device (exact: as `init_cache` allocates).

    Attention layers hold keys and values [K, slots, D] in the params dtype (K over
    `tensor` when it divides); Gated DeltaNet layers a conv window
    [conv_dim, kernel - 1] in the params dtype and a float32 state [Hv, Dk, Dv].
    """
    total = 0
    for kind in layer_kinds(config):
        if kind == "full_attention":
            kv = _split(config.num_key_value_heads, tensor)
            total += 2 * kv * slots * config.head_dim * dtype_bytes
        else:
            c = config
            conv = _split(c.conv_dim, tensor) * (c.linear_conv_kernel_dim - 1) * dtype_bytes
            heads = _split(c.linear_num_value_heads, tensor)
            total += conv + heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    return total


# Bytes per attention score (one head, one query, one slot) that a block of
# queries holds while its softmax runs: the q.k einsum output, its float32 masked
# copy, the float32 softmax output, the probabilities in the compute dtype and the
# mask. XLA's buffer assignment gives 13 for bfloat16 and float32 compute alike
# (the casts of float32 are no-ops, and fusion absorbs the others).
SCORE_BYTES = 13


def _score_cotangent_bytes(b: int) -> int:
    """The backward working set per score: d(probs) (b) and d(scores) (4)."""
    return b + 4


# Bytes per score of one query block inside `attention.attend`'s map, where XLA
# fuses more than in the dense layer. A forward pass alone (prefill) holds two
# arrays in the compute dtype (b): the GPU compiler fuses the float32 softmax into
# them (Qwen3-4B's prefill compiled for 8 H200s: two bfloat16 [rows, heads, 512,
# slots] buffers), where the CPU backend keeps a float32 copy more (4 bytes; the
# CPU tests allow for it). With a backward pass, the recomputed block and its
# cotangents: 2 b + 8, the marginal bytes per score of XLA's buffer assignment
# when the block doubles (10.2-12.1 in bfloat16, 16.0 in float32); the GPU
# target's train steps agree (`benchmarks/aot.py`).
def _block_score_bytes(b: int, grad: bool) -> int:
    return 2 * b + (8 if grad else 0)


def _query_rows(queries: int, query_block: int) -> int:
    """Query rows whose scores exist at once: all of them, or one block (`attention.attend`)."""
    return queries if queries <= query_block else query_block


def score_bytes(
    config: DecoderConfig,
    tokens: int,
    tensor: int = 1,
    *,
    compute_bytes: int = 2,
    query_block: int = QUERY_BLOCK,
) -> int:
    """Bytes of attention scores alive at once in a training pass, one sequence.

    Up to `query_block` tokens, attention is dense and every attention layer keeps
    its [H, T, T] scores for the backward pass; beyond it, `attention.attend`
    keeps none and one block's [H, block, T] (recomputed, with cotangents) exist
    at a time.
    """
    heads = _split(config.num_attention_heads, tensor)
    if tokens <= query_block:
        layers = layer_kinds(config).count("full_attention")
        return layers * heads * tokens * tokens * SCORE_BYTES
    return heads * query_block * tokens * _block_score_bytes(compute_bytes, grad=True)


def _attention_scores(
    config: DecoderConfig, queries: int, slots: int, tensor: int, query_block: int, b: int = 2
) -> int:
    """Live bytes of one attention layer's scores [H, rows, slots] in a forward pass.

    `SCORE_BYTES` per score when dense, `_block_score_bytes` per score of one block.
    """
    heads = _split(config.num_attention_heads, tensor)
    if queries <= query_block:
        return heads * queries * slots * SCORE_BYTES
    return heads * query_block * slots * _block_score_bytes(b, grad=False)


# Float32 [C, C] matrices per chunk and value head that the chunked gated delta rule
# holds at once: decay, the triangular system, its inverse and the intra-chunk scores
# in a forward pass; with a backward pass also every product of `unit_lower_inverse`'s
# doubling steps and their cotangents (fitted to XLA's buffer assignment: 32 at C = 64).
def _chunk_matrices(chunk: int, grad: bool) -> int:
    return 8 + 4 * max(chunk - 1, 1).bit_length() if grad else 4


def delta_rule_bytes(
    config: Qwen3_5Config, tokens: int, tensor: int = 1, *, grad: bool, per_chunk: bool = False
) -> int:
    """Float32 bytes of one chunked gated-delta pass over `tokens` tokens (one sequence).

    Per token and value head: q, k, k_beta, w, q_in (Dk each), v, u, out (Dv each)
    and one row of each chunk matrix (`_chunk_matrices`); plus one [Dk, Dv] state
    per chunk. `grad`: with the residuals and cotangents of a backward pass.
    `per_chunk` (the prefill's form, `gated_delta_chunked(per_chunk=True)`): the
    output (Dv per token and head) and one chunk's tensors and state.
    """
    c = config
    heads = _split(c.linear_num_value_heads, tensor)
    chunks = -(-tokens // CHUNK_SIZE)
    per_token = (
        5 * c.linear_key_head_dim
        + 3 * c.linear_value_head_dim
        + _chunk_matrices(CHUNK_SIZE, grad) * CHUNK_SIZE
    )
    state = c.linear_key_head_dim * c.linear_value_head_dim
    if per_chunk:
        return 4 * heads * (tokens * c.linear_value_head_dim + CHUNK_SIZE * per_token + state)
    return 4 * heads * (tokens * per_token + chunks * state)


def prefill_bytes_per_row(
    config: DecoderConfig,
    prompt: int,
    slots: int,
    compute_bytes: int,
    tensor: int = 1,
    *,
    query_block: int = QUERY_BLOCK,
) -> int:
    """Estimated transient bytes of one sequence's prefill (no gradient), on one device.

    The peak is one layer's phase at a time, on top of the [prompt, slots] mask and
    two hidden-state copies [prompt, hidden] (the residual stream and the phase's
    input); the larger of
    * attention: one block's scores (`_attention_scores`) and the queries' arrays
      [prompt, H, D] in the compute dtype: the projection (with Qwen3.5's gate),
      its copy cut in blocks and the output written in place (`attention.attend`);
    * Gated DeltaNet: the projection and the conv output [prompt, conv_dim] and
      the per-chunk delta rule's output (`delta_rule_bytes(per_chunk=True)`);
    * the MLP: gate and up [prompt, F] (their product replaces one).
    The LM head runs on the last position only.
    """
    c, b = config, compute_bytes
    hidden = 2 * prompt * c.hidden_size * b
    mlp = 2 * prompt * _split(c.intermediate_size, tensor) * b

    def mixer(kind: str) -> int:
        if kind == "full_attention":
            gate = 2 if isinstance(c, Qwen3_5Config) else 1  # Qwen3.5 queries carry a gate
            queries = prompt * _split(c.num_attention_heads, tensor) * c.head_dim * b
            scores = _attention_scores(c, prompt, slots, tensor, query_block, b)
            return scores + (gate + 2) * queries
        conv = 2 * prompt * _split(c.conv_dim, tensor) * b
        return conv + delta_rule_bytes(c, prompt, tensor, grad=False, per_chunk=True)

    mixers = [mixer(kind) for kind in set(layer_kinds(c))]
    return hidden + prompt * slots + max(mlp, *mixers) + 4 * 4 * c.vocab_size


def _attention_sizes(config: DecoderConfig, tokens: int, b: int, tensor: int, query_block: int):
    """(heads on a device, bytes of the projections' activations, query rows per block,
    scores per block) of one full-attention layer, one sequence."""
    c = config
    heads, kv = _split(c.num_attention_heads, tensor), _split(c.num_key_value_heads, tensor)
    gate = 2 if isinstance(c, Qwen3_5Config) else 1  # Qwen3.5 queries carry a gate
    proj = tokens * c.head_dim * (heads * (gate + 2) + 4 * kv) * b
    rows = _query_rows(tokens, query_block)
    return heads, proj, rows, heads * rows * tokens


def _layer_bytes(
    config: DecoderConfig, kind: str, tokens: int, b: int, tensor: int, query_block: int
):
    """(residuals kept for the backward pass, backward working set) of one layer, one sequence."""
    c = config
    f = _split(c.intermediate_size, tensor)
    # Norm inputs and outputs, residual stream, MLP in/out (kept); the backward adds
    # the norms' float32 internals.
    kept_dense = tokens * (c.hidden_size * 4 * b + 3 * f * b)
    dense = kept_dense + tokens * c.hidden_size * 2 * 4
    if kind == "full_attention":
        heads, proj, rows, scores = _attention_sizes(c, tokens, b, tensor, query_block)
        if rows == tokens:  # dense: the scores are residuals; the backward adds cotangents
            return (
                kept_dense + proj + scores * SCORE_BYTES,
                dense + scores * _score_cotangent_bytes(b),
            )
        # Blocked: the queries in blocks and the mask are kept; the backward pass
        # recomputes one block's scores and takes their cotangents.
        blocks = heads * tokens * c.head_dim * b + tokens * tokens
        return kept_dense + proj + blocks, dense + scores * _block_score_bytes(b, grad=True)
    channels = _split(c.conv_dim, tensor) + _split(c.linear_value_dim, tensor)
    proj = tokens * channels * (2 * b + 4)  # projections, conv output, gate z
    delta = delta_rule_bytes(c, tokens, tensor, grad=True)
    return kept_dense + proj + delta, dense + delta


# Bytes per score that a rebuilt dense attention layer keeps for its own backward
# pass (remat): what that backward reads, the float32 softmax output, the
# probabilities in the compute dtype (the same buffer when that is float32) and the
# mask. The q.k einsum output and its masked copy (in `SCORE_BYTES`) are transients
# of the recomputation, dead before the first cotangent exists.
def _rebuilt_score_bytes(b: int) -> int:
    return 4 + (b if b < 4 else 0) + 1


def _rebuilt_layer_bytes(
    config: DecoderConfig, kind: str, tokens: int, b: int, tensor: int, query_block: int
) -> int:
    """Peak bytes of one layer's backward pass under remat, one sequence.

    The layer's forward is rebuilt from its kept input, then its backward runs the
    MLP first, the token mixer second; the peak is the larger of the two phases:

    * MLP backward: every residual of the rebuilt layer (the mixer's are read
      later) and the MLP's cotangents (the [tokens, 3 F] and hidden-size arrays);
    * mixer backward: the MLP's residuals and cotangents are dead; the
      hidden-size arrays (norm in/out in float32, residual stream, the layer's
      input and output cotangents), the projections, the mixer's kept residuals
      and its cotangents (dense attention: `_rebuilt_score_bytes` plus d(probs) and
      d(scores) per score; blocked: the kept queries and mask plus one block's
      recomputed scores with cotangents; Gated DeltaNet: the delta rule's
      residuals and cotangents, `delta_rule_bytes(grad=True)`).
    """
    c = config
    f = _split(c.intermediate_size, tensor)
    hidden = tokens * c.hidden_size * (4 * b + 2 * 4)
    mlp = 3 * tokens * f * b  # gate, up and their product (or their cotangents)
    if kind == "full_attention":
        heads, proj, rows, scores = _attention_sizes(c, tokens, b, tensor, query_block)
        if rows == tokens:  # dense
            kept = scores * _rebuilt_score_bytes(b)
            work = scores * _score_cotangent_bytes(b)
        else:  # blocked: the queries in blocks and the mask; one block's scores at a time
            kept = heads * tokens * c.head_dim * b + tokens * tokens
            work = scores * _block_score_bytes(b, grad=True)
        mixer_kept, mixer = proj + kept, proj + kept + work
    else:
        channels = _split(c.conv_dim, tensor) + _split(c.linear_value_dim, tensor)
        proj = tokens * channels * (2 * b + 4)  # projections, conv output, gate z
        delta = delta_rule_bytes(c, tokens, tensor, grad=True)
        mixer_kept, mixer = proj + delta, proj + delta
    return max(hidden + mlp + mixer_kept + hidden + mlp, hidden + mixer)


# Float32 [block, V] arrays of the blocked LM head alive at once in its backward
# pass: the recomputed logits, their log-softmax and its exponential, a cotangent.
HEAD_BLOCK_ARRAYS = 4


def train_bytes_per_row(
    config: DecoderConfig,
    tokens: int,
    compute_bytes: int,
    tensor: int = 1,
    remat: bool = False,
    *,
    query_block: int = QUERY_BLOCK,
    token_block: int = TOKEN_BLOCK,
) -> int:
    """Estimated activation bytes of one sequence in a training forward + backward.

    Without remat every layer keeps its residuals until its backward runs, and the
    float32 logits [tokens, V] exist whole, with the log-softmax and entropy terms
    computed from them (four such arrays). With remat (`train.step`'s
    ``remat=True``: per-layer rematerialisation and a blocked LM head) only each
    layer's input [tokens, hidden] is kept; on top of those, the larger of the
    head's backward (`HEAD_BLOCK_ARRAYS` float32 [token_block, V] arrays, its input
    and that input's cotangent) and one rebuilt layer's backward
    (`_rebuilt_layer_bytes`): the head's backward ends before the layers' begins.
    Without remat: every layer's residuals and the larger of the logits and what
    one layer's backward working set (the cotangents of its largest arrays, or one
    query block's recomputed scores) exceeds that layer's residuals by. Both add
    the mask [tokens, tokens].
    """
    c = config
    layers = [
        _layer_bytes(c, kind, tokens, compute_bytes, tensor, query_block) for kind in layer_kinds(c)
    ]
    if remat:
        kept = len(layers) * tokens * c.hidden_size * compute_bytes  # each layer's input
        # The head's backward ends before the layers' begins: the two never coexist.
        head = HEAD_BLOCK_ARRAYS * min(tokens, token_block) * c.vocab_size * 4
        head += 2 * tokens * c.hidden_size * compute_bytes  # the head's input and its cotangent
        rebuilt = max(
            _rebuilt_layer_bytes(c, kind, tokens, compute_bytes, tensor, query_block)
            for kind in set(layer_kinds(c))
        )
        return kept + max(head, rebuilt) + tokens * tokens
    kept = sum(r for r, _ in layers)
    logits = 3 * tokens * c.vocab_size * 4
    # The head's backward ends before the layers' begins: the logits and a layer's
    # backward working set never coexist.
    return kept + max(max(work for _, work in layers), logits) + tokens * tokens
