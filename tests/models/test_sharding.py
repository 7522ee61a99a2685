"""Sharding rules on 8 forced CPU devices, in a separate process."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from tests.multidevice import assert_ran, run_on_host_devices
from wmrl_jax.models import sharding


@pytest.mark.parametrize("fixture", ["qwen3_gqa4_yarn", "qwen3_gqa1_tied", "qwen3_5_text_untied"])
def test_sharded_load_and_forward_match_unsharded(fixture):
    proc = run_on_host_devices("tests.models.sharded_check", fixture, timeout=300)
    assert_ran(proc, "SHARDED OK")


def test_param_specs_by_hand():
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    spec = lambda path, shape: sharding.param_spec(path, shape, mesh)
    assert spec(("layers", 0, "self_attn", "q_proj", "kernel"), (8, 8)) == P("fsdp", "tensor")
    assert spec(("layers", 0, "self_attn", "o_proj", "kernel"), (8, 8)) == P("tensor", "fsdp")
    assert spec(("layers", 0, "mlp", "down_proj", "kernel"), (8, 8)) == P("tensor", "fsdp")
    assert spec(("layers", 0, "self_attn", "q_norm", "weight"), (8,)) == P(None)
    assert spec(("embed_tokens",), (8, 8)) == P("tensor", "fsdp")
    assert spec(("lm_head",), (8, 8)) == P("fsdp", "tensor")
    gdn = ("layers", 0, "linear_attn")
    assert spec((*gdn, "in_proj_qkv", "kernel"), (8, 8)) == P("fsdp", "tensor")
    assert spec((*gdn, "in_proj_b", "kernel"), (8, 2)) == P("fsdp", "tensor")
    assert spec((*gdn, "out_proj", "kernel"), (8, 8)) == P("tensor", "fsdp")
    assert spec((*gdn, "conv1d", "weight"), (8, 1, 4)) == P("tensor", None, None)
    assert spec((*gdn, "A_log"), (2,)) == P("tensor")
    assert spec((*gdn, "norm", "weight"), (8,)) == P(None)
    # Every decode-cache array: batch, then heads or channels on tensor.
    assert sharding.cache_spec((4, 2, 80, 12), mesh) == P(("data", "fsdp"), "tensor", None, None)
    assert sharding.cache_spec((4, 96, 3), mesh) == P(("data", "fsdp"), "tensor", None)


def test_make_mesh_checks_device_count():
    with pytest.raises(ValueError, match="does not match"):
        sharding.make_mesh(2, 2, 2, devices=jax.devices()[:1])
