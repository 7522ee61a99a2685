"""Run as a process of its own (see test_distributed.py): the sharded train step and an
orbax save/restore, either as one of several `jax.distributed` processes or alone.

    python -m tests.train.distributed_check OUT_DIR

The process layout comes from the environment (`distributed.resolve`); JAX_PLATFORMS
and XLA_FLAGS (forced CPU devices) are set by the caller. Every process runs the same
(data=2, fsdp=1, tensor=2) mesh over all 4 devices of all processes (2 processes of 2
devices: the batch split across processes, each param across a process's devices; or
one process of 4), loads only its rows of the batch, runs two steps, saves a checkpoint
(every process takes part) and restores it into the same shardings. Process 0 writes
`result.npz` (the final params, optimizer state and metrics, gathered); every process
writes `process<i>.json`, with the rewards process 0 broadcast.
"""

import json
import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from tests.train import sharded_step_check as ref
from wmrl_jax.models import sharding
from wmrl_jax.train import checkpoint as checkpoint_lib
from wmrl_jax.train import distributed
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib

GLOBAL_ROWS = 16


def flat(tree, prefix: str) -> dict:
    gathered = multihost_utils.process_allgather(tree, tiled=True)
    return {
        f"{prefix}{jax.tree_util.keystr(path)}": np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(gathered)
    }


def main(out_dir: str) -> None:
    spec = distributed.initialize(distributed.resolve())
    assert jax.process_count() == spec.num_processes and jax.device_count() == 4
    model = ref.tiny_model()
    batch = ref.make_batch(GLOBAL_ROWS, 24)
    config = step_lib.default_step_config()
    config.num_microbatches = 2
    config.num_epochs = 2
    config.loss.kl_coef = 0.05
    opt_config = state_lib.default_optimizer_config()
    opt_config.lr, opt_config.eps, opt_config.weight_decay = 1e-3, 1e-6, 0.01
    optimizer = state_lib.make_optimizer(opt_config)

    mesh = sharding.make_mesh(data=2, fsdp=1, tensor=2)  # every process's devices
    step = step_lib.make_train_step(model.graphdef, optimizer, config, mesh)
    state = state_lib.init_train_state(
        model.params, optimizer, kl_coef=config.loss.kl_coef, extra={"ledger": np.arange(3.0)}
    )
    state = step.shard_state(state)

    rows = distributed.process_rows(step.batch_shardings["tokens"], GLOBAL_ROWS)
    local = {k: v[rows] for k, v in batch.items()}  # this process loads only its rows
    global_batch = distributed.global_batch(local, step.batch_shardings, global_rows=GLOBAL_ROWS)
    state, metrics = step(state, global_batch, jax.random.key(1))
    state, metrics2 = step(state, global_batch, jax.random.key(2))

    directory = os.path.join(out_dir, "checkpoints")
    with checkpoint_lib.Checkpointer(directory, keep=1, best_metric=None) as ckpt:
        ckpt.save(2, state, {"processes": jax.process_count()}, force=True)
        ckpt.wait()
    distributed.barrier("saved")
    with checkpoint_lib.Checkpointer(directory, keep=1, best_metric=None) as ckpt:
        restored, meta = ckpt.restore(abstract_state=state)
    assert meta == {"processes": jax.process_count()}, meta
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        assert a.sharding == b.sharding, (a.sharding, b.sharding)

    # Only process 0 "executes"; every process ends with its rewards.
    mine = (
        np.arange(4, dtype=np.float32) + 1 if distributed.is_primary() else np.zeros(4, np.float32)
    )
    rewards = distributed.broadcast_from_primary({"rewards": mine})["rewards"]

    arrays = {
        **flat(state.params, "params"),
        **flat(state.opt_state, "opt"),
        **flat(restored.params, "restored_params"),
        **flat(restored.opt_state, "restored_opt"),
        **{f"metrics/{k}": np.asarray(v) for k, v in metrics.items()},
        **{f"metrics2/{k}": np.asarray(v) for k, v in metrics2.items()},
    }
    wrote = distributed.write_on_primary(
        os.path.join(out_dir, "primary.json"), json.dumps({"writer": jax.process_index()})
    )
    if distributed.is_primary():
        np.savez(os.path.join(out_dir, "result.npz"), **arrays)
    with open(os.path.join(out_dir, f"process{jax.process_index()}.json"), "w") as f:
        json.dump(
            {
                "source": spec.source,
                "rows": [rows.start, rows.stop],
                "local_devices": jax.local_device_count(),
                "wrote": wrote,
                "step": int(state.step),
                "rewards": np.asarray(rewards).tolist(),
            },
            f,
        )
    distributed.barrier("done")


if __name__ == "__main__":
    main(sys.argv[1])
