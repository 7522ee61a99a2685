"""Run in its own process with 8 forced CPU devices (see test_sharding.py)."""

import sys

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from tests.models.conftest import fixture_path, reference
from wmrl_jax import models
from wmrl_jax.models import sharding


def main(name: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    plain = models.from_pretrained(fixture_path(name))
    # Qwen3.5's recurrent state carries the changed float32 summation order of the
    # sharded matmuls through the sequence: typically up to ~5e-5 on these O(1) logits,
    # and once 1.08e-4 (one of 159,744 logits) on a clean install.
    atol = 2e-4 if isinstance(plain.config, models.Qwen3_5Config) else 1e-5
    sharded = models.from_pretrained(fixture_path(name), mesh=mesh)

    params = nnx.to_pure_dict(sharded.params)
    split = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = [getattr(k, "key", getattr(k, "idx", k)) for k in path]
        want = sharding.param_spec(keys, leaf.shape, mesh)
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, want), leaf.ndim), (keys, want)
        shard_shape = leaf.addressable_shards[0].data.shape
        split += shard_shape != leaf.shape
    assert split >= 10, split  # most matrices are actually split

    ids = reference(name)["input_ids"]
    ids = np.concatenate([ids, ids[:, ::-1]], axis=0)  # batch 4: divisible by data x fsdp
    batch = NamedSharding(mesh, sharding.batch_spec(ids.shape, mesh))
    sharded_logits = sharded.logits(jax.device_put(ids, batch))
    np.testing.assert_allclose(
        np.asarray(sharded_logits), np.asarray(plain.logits(ids)), rtol=0, atol=atol
    )
    cache = sharding.cache_spec((4, 2, 80, 12), mesh)
    assert cache == jax.sharding.PartitionSpec(("data", "fsdp"), "tensor", None, None), cache

    prompt = jax.device_put(ids[:, :16], batch)
    kw = dict(max_new_tokens=8, greedy=True, eos_ids=())
    a = models.sample(
        sharded, prompt, np.ones((4, 16), np.int32), jax.random.key(0), mesh=mesh, **kw
    )
    b = models.sample(plain, ids[:, :16], np.ones((4, 16), np.int32), jax.random.key(0), **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=atol)
    print("SHARDED OK", split)


if __name__ == "__main__":
    main(sys.argv[1])
