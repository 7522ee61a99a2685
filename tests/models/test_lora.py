"""LoRA adapters: a fresh adapter changes nothing, the adapted projection is W + s A B,
a merged export is the adapted model, and the shapes, counts and shardings are exact."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from tests.models.conftest import QWEN3_5_NAMES, fixture_path, load
from wmrl_jax import models
from wmrl_jax.models import lora, qwen3, sharding
from wmrl_jax.models import memory as model_memory
from wmrl_jax.models.qwen3 import Linear
from wmrl_jax.train.checkpoint import export_hf

IDS = np.array([[5, 17, 3, 99, 42, 7, 1, 64], [0, 0, 12, 8, 33, 2, 71, 9]], np.int32)
MASK = np.array([[1] * 8, [0, 0] + [1] * 6], np.int32)


def _adapted(name, rank=4, targets=lora.TARGETS, seed=0):
    m = load(name)
    graphdef, params = lora.attach(
        m.graphdef, m.params, rank=rank, alpha=8.0, targets=targets, key=jax.random.key(seed)
    )
    return m, graphdef, params


def _randomised(params, scale=0.05, seed=1):
    """The adapters with a random, non-zero B (a trained adapter)."""
    adapters, base = lora.partition(params)
    leaves, tree = jax.tree_util.tree_flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [
        scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    return lora.combine(jax.tree_util.tree_unflatten(tree, leaves), base)


@pytest.mark.parametrize("name", ["qwen3_gqa1_tied", "qwen3_gqa4_yarn", *QWEN3_5_NAMES])
def test_fresh_adapters_leave_logits_bit_identical(name):
    m, graphdef, params = _adapted(name)
    base = np.asarray(qwen3.apply(m.graphdef, m.params, IDS, MASK))
    adapted = np.asarray(qwen3.apply(graphdef, params, IDS, MASK))
    np.testing.assert_array_equal(adapted, base)
    # Jitted, each against the jitted base: op by op the zero term is exact, but a
    # compiled graph with the adapter's add fuses the ops around it differently, which
    # moves some logits by float32 rounding (up to ~1e-6 at ~2 on the CPU backend).
    jitted = jax.jit(qwen3.apply, static_argnums=0)
    np.testing.assert_allclose(
        np.asarray(jitted(graphdef, params, IDS, MASK)),
        np.asarray(jitted(m.graphdef, m.params, IDS, MASK)),
        rtol=1e-5,
        atol=1e-5,
    )
    # B = 0, A not: the adapter is there, and a non-zero B would move the logits.
    adapters, _ = lora.partition(params)
    pure = nnx.to_pure_dict(adapters)
    a = pure["layers"][0]["mlp"]["up_proj"]["lora"]
    assert not np.any(np.asarray(a["lora_b"])) and np.any(np.asarray(a["lora_a"]))
    moved = np.asarray(qwen3.apply(graphdef, _randomised(params), IDS, MASK))
    assert np.abs(moved - base).max() > 1e-3


def test_adapted_projection_is_w_plus_scaled_a_b_in_float64():
    linear = Linear(6, 5, bias=True, dtype=jnp.float32, rngs=nnx.Rngs(0))
    linear.bias[...] = jnp.arange(5.0)
    module = nnx.List([linear])
    graphdef, params = nnx.split(module)
    # A list of one projection: its path ends with the index, so target it by module name.
    model = nnx.merge(graphdef, params)
    model[0].lora = nnx.data(nnx.LoRA(6, 3, 5, rngs=nnx.Rngs(1)))
    model[0].lora.scale = 2.5
    model[0].lora.lora_b[...] = jax.random.normal(jax.random.key(2), (3, 5))
    x = np.asarray(jax.random.normal(jax.random.key(3), (4, 6)), np.float64)
    w, b = (np.asarray(v, np.float64) for v in (model[0].kernel[...], model[0].bias[...]))
    a, bb = (
        np.asarray(v, np.float64) for v in (model[0].lora.lora_a[...], model[0].lora.lora_b[...])
    )
    expected = x @ w + b + 2.5 * (x @ a) @ bb
    np.testing.assert_allclose(
        np.asarray(model[0](jnp.asarray(x, jnp.float32))), expected, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("name", ["qwen3_gqa2_untied", "qwen3_5_vl_tied"])
def test_merged_export_equals_the_adapted_model(name, tmp_path):
    m, graphdef, params = _adapted(name)
    params = _randomised(params)
    adapted = np.asarray(qwen3.apply(graphdef, params, IDS, MASK))
    out = export_hf(graphdef, params, m.raw_config, tmp_path / "hf", tokenizer=fixture_path(name))
    exported = models.from_pretrained(out)
    assert exported.graphdef == m.graphdef  # a plain model of the base's architecture
    logits = np.asarray(exported.logits(IDS, MASK))
    # W + s A B is rounded to float32 once per kernel; the logits move by ~1e-5 of ~5.
    np.testing.assert_allclose(logits, adapted, rtol=1e-5, atol=5e-5)
    # Each exported kernel is W + s A B in float64, to float32 rounding.
    adapters = nnx.to_pure_dict(lora.partition(params)[0])
    base = nnx.to_pure_dict(m.params)
    merged = nnx.to_pure_dict(exported.params)
    layer = 1 if name in QWEN3_5_NAMES else 0
    for block in adapters["layers"][layer].values():
        for proj, leaves in block.items():
            ab = leaves["lora"]
            a, b = (np.asarray(ab[k], np.float64) for k in ("lora_a", "lora_b"))
            w = np.asarray(
                base["layers"][layer][_parent(block, adapters, layer)][proj]["kernel"], np.float64
            )
            want = w + (8.0 / 4) * a @ b
            got = merged["layers"][layer][_parent(block, adapters, layer)][proj]["kernel"]
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6, atol=1e-7)


def _parent(block, adapters, layer):
    return next(k for k, v in adapters["layers"][layer].items() if v is block)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_merged_export_loads_in_transformers(tmp_path):  # pragma: no cover - torch absent here
    import torch
    import transformers

    name = "qwen3_gqa2_untied"
    m, graphdef, params = _adapted(name)
    params = _randomised(params)
    adapted = np.asarray(qwen3.apply(graphdef, params, IDS, MASK))
    out = export_hf(graphdef, params, m.raw_config, tmp_path / "hf", tokenizer=fixture_path(name))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    with torch.no_grad():
        ids = torch.tensor(IDS[:1], dtype=torch.long)
        logits = hf(input_ids=ids).logits.numpy()
    np.testing.assert_allclose(logits, adapted[:1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen3_gqa2_untied", "qwen3_5_text_untied"])
def test_adapter_shapes_and_counts_are_the_modules(name):
    m, graphdef, params = _adapted(name, rank=3, targets=lora.DEFAULT_TARGETS)
    adapters = nnx.to_pure_dict(lora.partition(params)[0])
    flat = {
        tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(adapters)[0]
    }
    assert flat == lora.adapter_shapes(m.config, rank=3, targets=lora.DEFAULT_TARGETS)
    total, per_device = lora.adapter_elements(
        m.config, rank=3, targets=lora.DEFAULT_TARGETS, mesh={"data": 1}
    )
    assert total == per_device == sum(int(np.prod(s)) for s in flat.values())
    # The base is the same arrays, not a copy.
    base = nnx.to_pure_dict(lora.partition(params)[1])
    assert base["embed_tokens"] is nnx.to_pure_dict(m.params)["embed_tokens"]
    assert model_memory.param_count(m.config) == sum(x.size for x in jax.tree.leaves(base))


def test_adapter_partition_specs_follow_their_projection():
    mesh = AbstractMesh((1, 2, 2), sharding.MESH_AXES)
    spec = lambda *path, shape: sharding.param_spec(path, shape, mesh)  # noqa: E731
    # Column-parallel kernel (fsdp, tensor): A over fsdp on its input, B over tensor.
    assert spec(
        "layers", 0, "self_attn", "q_proj", "lora", "lora_a", shape=(8, 4)
    ) == PartitionSpec("fsdp", None)
    assert spec(
        "layers", 0, "self_attn", "q_proj", "lora", "lora_b", shape=(4, 8)
    ) == PartitionSpec(None, "tensor")
    # Row-parallel kernel (tensor, fsdp): A over tensor, B over fsdp.
    assert spec("layers", 0, "mlp", "down_proj", "lora", "lora_a", shape=(8, 4)) == PartitionSpec(
        "tensor", None
    )
    assert spec(
        "layers", 0, "linear_attn", "out_proj", "lora", "lora_b", shape=(4, 8)
    ) == PartitionSpec(None, "fsdp")
    # A dim the axis does not divide stays whole, as for the kernels.
    assert spec("layers", 0, "mlp", "up_proj", "lora", "lora_b", shape=(4, 7)) == PartitionSpec(
        None, None
    )


def test_bad_configs_are_refused():
    m = load("qwen3_gqa2_untied")
    for kwargs, match in (
        (dict(rank=-1, alpha=1.0, targets=("q_proj",)), "rank"),
        (dict(rank=2, alpha=0.0, targets=("q_proj",)), "alpha"),
        (dict(rank=2, alpha=1.0, targets=("q_proj", "lm_head")), "targets"),
        (dict(rank=2, alpha=1.0, targets=()), "targets"),
        (dict(rank=0, alpha=1.0, targets=("q_proj",)), "rank >= 1"),
        (dict(rank=2, alpha=1.0, targets=("in_proj_qkv",)), "no projection"),
    ):
        with pytest.raises(ValueError, match=match):
            lora.attach(m.graphdef, m.params, key=jax.random.key(0), **kwargs)
    graphdef, params = lora.attach(
        m.graphdef, m.params, rank=2, alpha=1.0, targets=("q_proj",), key=jax.random.key(0)
    )
    with pytest.raises(ValueError, match="already has adapters"):
        lora.attach(graphdef, params, rank=2, alpha=1.0, targets=("q_proj",), key=jax.random.key(0))
    with pytest.raises(ValueError, match="model_graphdef"):
        export_hf(None, params, m.raw_config, "/nonexistent-dir-for-lora-test")
