"""Param shapes and caches against the Flax modules; activation estimates against XLA."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from tests.models.conftest import ALL_NAMES, fixture_path
from wmrl_jax.models import api, architectures, gated_delta, memory, qwen3, qwen3_5, sharding
from wmrl_jax.models.attention import QUERY_BLOCK
from wmrl_jax.models.config import config_from_dict
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config
from wmrl_jax.train import loss, step


def _fixture_config(name):
    with open(os.path.join(fixture_path(name), "config.json")) as f:
        return config_from_dict(json.load(f))


def _flax_shapes(config) -> dict:
    """{path: shape} of the module's params, as `nnx.to_pure_dict` lays them out."""
    _, state = api.abstract_split(config)
    leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(state))
    return {tuple(k.key for k in path): leaf.shape for path, leaf in leaves}


def _shortened(config):
    """A known architecture at its real widths, with 4 layers (one hybrid period)."""
    if isinstance(config, Qwen3_5Config):
        return dataclasses.replace(config, num_hidden_layers=4, layer_types=config.layer_types[:4])
    return dataclasses.replace(config, num_hidden_layers=2)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_param_shapes_are_the_flax_modules_for_every_fixture(name):
    config = _fixture_config(name)
    assert memory.param_shapes(config) == _flax_shapes(config)
    _, state = api.abstract_split(config)
    flax_count = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(state))
    assert memory.param_count(config) == flax_count


@pytest.mark.parametrize("name", architectures.names())
def test_param_shapes_at_the_published_widths(name):
    config = _shortened(architectures.get(name))
    assert memory.param_shapes(config) == _flax_shapes(config)


def test_published_parameter_counts():
    # Qwen3's released safetensors hold 4,022,468,096 (4B, tied) and 8,190,735,360 (8B).
    assert memory.param_count(architectures.get("qwen3-4b")) == 4_022_468_096
    assert memory.param_count(architectures.get("qwen3-8b")) == 8_190_735_360


@pytest.mark.parametrize("mesh", [{"fsdp": 8}, {"fsdp": 4, "tensor": 2}, {"data": 2, "tensor": 4}])
@pytest.mark.parametrize("name", ["qwen3_5_text_untied", "qwen3_gqa4_yarn"])
def test_per_device_elements_are_jax_shard_shapes(name, mesh):
    config = _fixture_config(name)
    abstract = memory.abstract_mesh(mesh)
    expected = sum(
        math.prod(NamedSharding(abstract, sharding.param_spec(p, s, abstract)).shard_shape(s))
        for p, s in memory.param_shapes(config).items()
    )
    assert memory.param_elements_per_device(config, mesh) == expected


def test_fsdp_divides_every_matrix_of_qwen3_4b():
    config = architectures.get("qwen3-4b")
    vectors = sum(math.prod(s) for s in memory.param_shapes(config).values() if len(s) == 1)
    total = memory.param_count(config)
    assert memory.param_elements_per_device(config, {"fsdp": 8}) == (total - vectors) // 8 + vectors


@pytest.mark.parametrize("name", ["qwen3_5_vl_tied", "qwen3_5_text_untied", "qwen3_gqa1_tied"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cache_bytes_are_init_cache(name, dtype):
    config = _fixture_config(name)
    init = qwen3_5.init_cache if isinstance(config, Qwen3_5Config) else qwen3.init_cache
    leaves = jax.tree_util.tree_leaves(jax.eval_shape(lambda: init(config, 3, 40, dtype)))
    actual = sum(x.size * x.dtype.itemsize for x in leaves)
    assert memory.cache_bytes_per_row(config, 40, jnp.dtype(dtype).itemsize) * 3 == actual


def test_score_bytes_dense_then_one_block():
    dense, hybrid = architectures.get("qwen3-4b"), architectures.get("qwen3.5-9b")
    # Up to one query block every attention layer keeps its [H, T, T] scores ...
    assert memory.score_bytes(dense, 512) == 36 * 32 * 512**2 * memory.SCORE_BYTES
    assert memory.score_bytes(hybrid, 512) == 8 * 16 * 512**2 * memory.SCORE_BYTES
    # ... beyond it, one block's [H, block, T] exist at a time, in one layer.
    assert memory.score_bytes(dense, 8192) == 32 * 512 * 8192 * (2 * 2 + 8)  # bf16, backward
    assert memory.score_bytes(dense, 8192, query_block=8192) == 36 * 32 * 8192**2 * 13
    assert memory.score_bytes(hybrid, 1024) < memory.train_bytes_per_row(hybrid, 1024, 2)
    # Remat keeps one layer input per layer, not the layers' residuals.
    plain = memory.train_bytes_per_row(dense, 8192, 2)
    assert memory.train_bytes_per_row(dense, 8192, 2, remat=True) < plain / 5


def test_tensor_axis_splits_heads_it_divides():
    config = architectures.get("qwen3.5-9b")  # 4 kv heads, 32 value heads
    one = memory.cache_bytes_per_row(config, 1024, 2, tensor=1)
    assert memory.cache_bytes_per_row(config, 1024, 2, tensor=4) * 4 == one
    # 3 divides neither the kv heads nor the value heads: nothing is split.
    assert memory.cache_bytes_per_row(config, 1024, 2, tensor=3) == one


def _tiny_dense(vocab=512):
    raw = api.qwen3_config_dict(
        vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, head_dim=16,
    )  # fmt: skip
    return config_from_dict(raw)


# (tokens, remat): dense attention (one block), blocked attention (two blocks of
# `attention.QUERY_BLOCK`), and blocked attention with per-layer remat and the
# blocked LM head (a larger vocabulary, so that the head's blocks count).
@pytest.mark.parametrize("tokens,remat,vocab", [(512, False, 512), (1024, False, 512),
                                                (1024, True, 4096)])  # fmt: skip
def test_train_estimates_track_xla_buffer_assignment(tokens, remat, vocab):
    """Train-step activations against XLA's own temp buffers (CPU backend).

    XLA's temporaries also hold the gradients (the float32 accumulator of the
    micro-batch loop and one micro-batch's gradient in the params' dtype) and, with
    remat, the layers stacked for the layer scan: counted here as `train.memory`
    counts them. The estimates lean high (XLA fuses some of what they count); they
    must not be low by more than a few percent, nor high by more than the issue's 25%.
    """
    config, rows = _tiny_dense(vocab), 2
    graphdef, state = api.abstract_split(config, jnp.bfloat16)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    step_config = step.default_step_config()
    step_config.compute_dtype, step_config.remat = "bfloat16", remat
    batch = {
        k: jax.ShapeDtypeStruct((rows, tokens) if rank == 2 else (rows,), dtype)
        for k, (rank, dtype) in loss.BATCH_SPEC.items()
    }
    grads = jax.jit(lambda p, b: loss.loss_and_grads(graphdef, p, b, config=step_config)[1])
    xla = grads.lower(params, batch).compile().memory_analysis().temp_size_in_bytes
    gradients = memory.param_count(config) * (4 + 2)
    stacked = memory.layer_elements_per_device(config, {}) * 2 if remat else 0
    planned = rows * memory.train_bytes_per_row(config, tokens, 2, remat=remat)
    if not remat:
        # The CPU backend keeps each layer's norms' float32 inputs and outputs; a GPU
        # compile fuses them (benchmarks.aot: Qwen3-4B without remat for 8 H200s,
        # plan 1.01-1.02x).
        planned += rows * tokens * config.num_hidden_layers * config.hidden_size * 2 * 4
    ratio = (planned + gradients + stacked) / xla
    assert 0.95 <= ratio <= 1.25, ratio


@pytest.mark.parametrize("prompt,slots", [(256, 512), (1024, 1536)])
def test_prefill_estimates_track_xla_buffer_assignment(prompt, slots):
    """A prefill into a cache: dense attention, then query blocks (1024 > QUERY_BLOCK).

    The plan counts a block's scores as a GPU compiles them (two arrays in the
    compute dtype, the float32 softmax fused); the CPU backend keeps a float32
    copy of them more, added here so that the rest is checked against this backend.
    """
    config, rows = _tiny_dense(), 2
    graphdef, state = api.abstract_split(config, jnp.bfloat16)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)

    def prefill(p, ids):
        model = nnx.merge(graphdef, p)
        cache = model.init_cache(rows, slots, jnp.bfloat16)
        mask = jnp.ones((rows, prompt, slots), bool)
        return model(ids, jnp.zeros_like(ids), mask, cache, 0, last_only=True)

    ids = jax.ShapeDtypeStruct((rows, prompt), jnp.int32)
    xla = jax.jit(prefill).lower(params, ids).compile().memory_analysis().temp_size_in_bytes
    cpu_float32_scores = 0
    if prompt > QUERY_BLOCK:
        cpu_float32_scores = config.num_attention_heads * QUERY_BLOCK * slots * 4
    planned = rows * (memory.prefill_bytes_per_row(config, prompt, slots, 2) + cpu_float32_scores)
    assert 0.85 <= planned / xla <= 2.0, planned / xla


def test_delta_rule_estimates_track_xla_buffer_assignment():
    """The chunked gated delta rule's working set, forward and forward + backward."""
    config = dataclasses.replace(
        architectures.get("qwen3.5-4b"), linear_num_key_heads=8, linear_num_value_heads=8,
        linear_key_head_dim=32, linear_value_head_dim=32,
    )  # fmt: skip
    tokens, heads = 512, 8
    args = [jax.ShapeDtypeStruct((1, tokens, heads, 32), jnp.float32)] * 3
    args += [jax.ShapeDtypeStruct((1, tokens, heads), jnp.float32)] * 2

    def loss(*xs):
        return jnp.sum(gated_delta.gated_delta_chunked(*xs, chunk_size=memory.CHUNK_SIZE)[0])

    for fn, grad in ((loss, False), (jax.grad(loss, argnums=(0, 1, 2, 3, 4)), True)):
        xla = jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes
        ratio = memory.delta_rule_bytes(config, tokens, grad=grad) / xla
        assert 0.9 <= ratio <= 1.6, (grad, ratio)
