"""Run in its own process with 8 forced CPU devices (see test_lora_step.py).

The LoRA train step on a (data=2, fsdp=2, tensor=2) mesh against the same step on
one device: gradients, updated adapters and Adam moments agree within float32
tolerance, the base is untouched, and the adapters and their moments are placed
by their rules (A on its projection's input axis, B on its output axis).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from tests.train.sharded_step_check import PARAMS_ATOL, close, make_batch, tiny_model
from wmrl_jax.models import lora, sharding
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib


def run(mesh, model, batch, config, opt_config):
    graphdef, params = lora.attach(
        model.graphdef,
        jax.tree_util.tree_map(jnp.copy, model.params),
        rank=4,
        alpha=8.0,
        targets=lora.TARGETS,
        key=jax.random.key(3),
        mesh=mesh,
    )
    optimizer = state_lib.make_optimizer(opt_config)
    step = step_lib.make_train_step(graphdef, optimizer, config, mesh)
    state = state_lib.init_train_state(params, optimizer, kl_coef=config.loss.kl_coef)
    state = step.shard_state(state)
    _, grads, _ = step.loss_and_grads(state, batch)
    state, metrics = step(state, batch, jax.random.key(1))
    state, metrics2 = step(state, batch, jax.random.key(2))
    return dict(step=step, state=state, grads=grads, metrics=metrics, metrics2=metrics2)


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    model = tiny_model()
    batch = make_batch(16, 24)
    config = step_lib.default_step_config()
    config.num_microbatches = 2
    config.num_epochs = 2
    config.loss.kl_coef = 0.05
    opt_config = state_lib.default_optimizer_config()
    opt_config.lr, opt_config.eps = 1e-3, 1e-6

    mesh8 = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    sharded = run(mesh8, model, batch, config, opt_config)
    single = run(mesh1, model, batch, config, opt_config)

    close(sharded["grads"], single["grads"], "grads")
    close(sharded["metrics2"], single["metrics2"], "metrics (2nd call)")
    close(sharded["state"].params, single["state"].params, "params", PARAMS_ATOL)
    close(sharded["state"].opt_state, single["state"].opt_state, "opt_state")
    assert float(sharded["metrics"]["kl"]) == 0.0  # epoch 1: B = 0, policy == base
    assert sharded["step"].trace_count == 1
    _, base = lora.partition(sharded["state"].params)
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    layer = sharded["state"].params["layers"][0]
    specs = {
        "q_proj/lora_a": layer["self_attn"]["q_proj"]["lora"]["lora_a"],
        "q_proj/lora_b": layer["self_attn"]["q_proj"]["lora"]["lora_b"],
        "down_proj/lora_a": layer["mlp"]["down_proj"]["lora"]["lora_a"],
        "down_proj/lora_b": layer["mlp"]["down_proj"]["lora"]["lora_b"],
    }
    want = {
        "q_proj/lora_a": PartitionSpec("fsdp", None),
        "q_proj/lora_b": PartitionSpec(None, "tensor"),
        "down_proj/lora_a": PartitionSpec("tensor", None),
        "down_proj/lora_b": PartitionSpec(None, "fsdp"),
    }
    for name, leaf in specs.items():
        assert leaf.value.sharding.spec == want[name], (name, leaf.value.sharding)
    split = sum(
        leaf.addressable_shards[0].data.shape != leaf.shape
        for leaf in jax.tree_util.tree_leaves(sharded["state"].opt_state)
    )
    assert split >= 20, split
    print("SHARDED LORA STEP OK", split)


if __name__ == "__main__":
    main()
