"""Run in its own process with 8 forced CPU devices (see test_step.py).

The train step on a (data=2, fsdp=2, tensor=2) mesh against the same step on one
device: loss, gradients, metrics and updated params agree within float32
tolerance; a second call does not retrace; the input state is donated; params
and Adam moments are actually split across devices.
"""

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax import models
from wmrl_jax.models import sharding
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib

# Different reduction orders (sharded matmuls, psums) move float32 results by a
# few ulps of the largest partial sums; 1e-5 relative + 1e-6 absolute covers it.
RTOL, ATOL = 1e-5, 1e-6
# Updated params after 4 Adam updates of lr 1e-3: Adam divides by sqrt(v), so an
# element whose gradient is near zero turns that noise into up to ~lr per update;
# 1e-5 absolute is 1% of one update.
PARAMS_ATOL = 1e-5


def tiny_model():
    raw = models.qwen3_config_dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return models.random_model(raw, jax.random.key(0))


def make_batch(b: int, t: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, 5, size=b)
    length = rng.integers(3, t - 4, size=b)  # completion lengths differ per row
    pad = rng.integers(0, 3, size=b)  # left padding
    cols = np.arange(t)[None]
    attention = (cols >= pad[:, None]).astype(np.int32)
    start = pad + prompt
    loss = ((cols >= start[:, None]) & (cols < (start + length)[:, None])).astype(np.float32)
    return {
        "tokens": rng.integers(0, 64, size=(b, t)).astype(np.int32),
        "attention_mask": attention,
        "loss_mask": loss * attention,
        "old_logprobs": (np.log(rng.uniform(0.005, 0.05, size=(b, t))) * loss).astype(np.float32),
        "advantages": rng.normal(size=b).astype(np.float32),
    }


def run(mesh, model, batch, config, opt_config):
    optimizer = state_lib.make_optimizer(opt_config)
    step = step_lib.make_train_step(model.graphdef, optimizer, config, mesh)
    state = state_lib.init_train_state(
        jax.tree_util.tree_map(jnp.copy, model.params),
        optimizer,
        kl_coef=config.loss.kl_coef,
        extra={"ledger": jnp.arange(3.0), "rng": jax.random.key_data(jax.random.key(7))},
    )
    state = step.shard_state(state)
    loss, grads, _ = step.loss_and_grads(state, batch)
    first = state
    state, metrics = step(state, batch, jax.random.key(1))
    donated = all(x.is_deleted() for x in jax.tree_util.tree_leaves(first.params))
    state, metrics2 = step(state, batch, jax.random.key(2))
    return dict(
        step=step,
        state=state,
        loss=loss,
        grads=grads,
        metrics=metrics,
        metrics2=metrics2,
        donated=donated,
    )


def close(a, b, what, atol=ATOL):
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=RTOL, atol=atol, err_msg=f"{what} {path}"
        )


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    model = tiny_model()
    batch = make_batch(16, 24)
    config = step_lib.default_step_config()
    config.num_microbatches = 2
    config.num_epochs = 2
    config.loss.kl_coef = 0.05
    opt_config = state_lib.default_optimizer_config()
    # eps 1e-6: Adam's first update is ~sign(g); a larger eps keeps elements whose
    # gradient is ~0 from flipping sign on reduction-order noise.
    opt_config.lr, opt_config.eps, opt_config.weight_decay = 1e-3, 1e-6, 0.01

    mesh8 = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    sharded = run(mesh8, model, batch, config, opt_config)
    single = run(mesh1, model, batch, config, opt_config)

    np.testing.assert_allclose(float(sharded["loss"]), float(single["loss"]), rtol=RTOL)
    close(sharded["grads"], single["grads"], "grads")
    close(sharded["metrics"], single["metrics"], "metrics")
    close(sharded["metrics2"], single["metrics2"], "metrics (2nd call)")
    close(sharded["state"].params, single["state"].params, "params", PARAMS_ATOL)
    close(sharded["state"].opt_state, single["state"].opt_state, "opt_state")
    close(sharded["state"].extra, single["state"].extra, "extra")
    assert int(sharded["state"].step) == 2

    for name in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert np.isfinite(float(sharded["metrics"][name])), name
    assert float(sharded["metrics"]["kl"]) == 0.0  # epoch 1: policy == reference
    assert float(sharded["metrics2"]["kl"]) > 0.0
    assert sharded["step"].trace_count == 1 and single["step"].trace_count == 1
    assert sharded["donated"] and single["donated"]

    split = 0
    moments = sharded["state"].opt_state
    for leaf in jax.tree_util.tree_leaves((sharded["state"].params, moments)):
        split += leaf.addressable_shards[0].data.shape != leaf.shape
    assert split >= 20, split
    q = sharded["state"].params["layers"][0]["self_attn"]["q_proj"]["kernel"].value
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor"), q.sharding
    print("SHARDED STEP OK", split, float(sharded["loss"]))


if __name__ == "__main__":
    main()
