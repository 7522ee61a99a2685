"""The train step with LoRA adapters: gradients and optimizer state for the adapters
alone, the base untouched, the base as the KL reference, adapters-only checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.multidevice import assert_ran, run_on_host_devices
from tests.train.sharded_step_check import make_batch
from tests.train.tiny_step import opt_config, step_config
from wmrl_jax.models import lora
from wmrl_jax.train import loss as loss_lib
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib
from wmrl_jax.train.checkpoint import Checkpointer

RANK, ALPHA = 4, 8.0


def adapted(model, targets=lora.DEFAULT_TARGETS):
    params = jax.tree_util.tree_map(jnp.copy, model.params)
    return lora.attach(
        model.graphdef, params, rank=RANK, alpha=ALPHA, targets=targets, key=jax.random.key(3)
    )


def build(graphdef, params, mesh, config, opt=None):
    optimizer = state_lib.make_optimizer(opt or opt_config(weight_decay=0.01))
    step = step_lib.make_train_step(graphdef, optimizer, config, mesh)
    state = state_lib.init_train_state(params, optimizer, kl_coef=config.loss.kl_coef)
    return step, step.shard_state(state)


def _size(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def test_gradients_reach_only_the_adapters(model, mesh):
    graphdef, params = adapted(model)
    config = step_config(num_microbatches=2)
    step, state = build(graphdef, params, mesh, config)
    batch = make_batch(4, 16)
    _, grads, _ = step.loss_and_grads(state, batch)
    adapters, base = lora.partition(state.params)
    assert jax.tree.structure(grads) == jax.tree.structure(adapters)
    # Independent reference: the gradient of the same loss with respect to every
    # param of the adapted model (no partition), restricted to the adapters.
    full_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    _, full, _ = loss_lib.loss_and_grads(graphdef, state.params, full_batch, config=config)
    want, base_grads = lora.partition(full)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
    # The base would get gradients if it were trained: the partition is what stops them.
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(base_grads)) > 1e-4
    pure = nnx.to_pure_dict(grads)
    up = pure["layers"][0]["mlp"]["up_proj"]["lora"]
    assert np.abs(np.asarray(up["lora_b"])).max() > 0  # B moves first (A's grad is B-scaled)


def test_a_step_updates_adapters_only_with_optimizer_state_for_them(model, mesh):
    graphdef, params = adapted(model)
    config = step_config(num_epochs=2)
    step, state = build(graphdef, params, mesh, config)
    before = jax.tree_util.tree_map(np.asarray, state.params)
    adapters, base = lora.partition(state.params)
    assert state.ref_params is None
    # AdamW's mu and nu mirror the adapters; nothing else is larger than a scalar.
    moments = [x for x in jax.tree_util.tree_leaves(state.opt_state) if np.ndim(x) > 0]
    assert sum(x.size for x in moments) == 2 * _size(adapters)
    assert _size(adapters) < _size(base) / 4  # rank 4 on a 32-wide model
    state, metrics = step(state, make_batch(4, 16), jax.random.key(0))
    new_adapters, new_base = lora.partition(state.params)
    old_adapters, old_base = lora.partition(before)
    for new, old in zip(jax.tree.leaves(new_base), jax.tree.leaves(old_base), strict=True):
        np.testing.assert_array_equal(np.asarray(new), old)
    moved = [
        float(np.abs(np.asarray(n) - o).max())
        for n, o in zip(jax.tree.leaves(new_adapters), jax.tree.leaves(old_adapters), strict=True)
    ]
    assert min(moved) > 0  # every A and B moved (A from the second epoch on)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
    assert step.trace_count == 1


def test_kl_reference_is_the_frozen_base(model, mesh):
    graphdef, params = adapted(model)
    config = step_config(num_epochs=2, loss={"kl_coef": 0.1})
    step, state = build(graphdef, params, mesh, config)
    assert state.ref_params is None  # no second copy of the weights
    state, metrics = step(state, make_batch(4, 16), jax.random.key(0))
    assert float(metrics["kl"]) == 0.0  # epoch 1: B = 0, the policy is the base
    assert float(metrics["epoch2/kl"]) > 0.0
    # The reference stays the base after the adapters have moved.
    ref = state_lib.reference(state)
    _, base = lora.partition(state.params)
    ref_adapters, ref_base = lora.partition(ref)
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(ref_adapters))
    assert all(
        a is b for a, b in zip(jax.tree.leaves(ref_base), jax.tree.leaves(base), strict=True)
    )


def test_checkpoint_holds_the_adapters_and_resumes(model, mesh, tmp_path):
    graphdef, params = adapted(model)
    config = step_config()
    step, state = build(graphdef, params, mesh, config)
    state, _ = step(state, make_batch(4, 16), jax.random.key(0))
    view = state_lib.checkpoint_view(state)
    adapters, _ = lora.partition(state.params)
    assert jax.tree.structure(view.params) == jax.tree.structure(adapters)
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        ckpt.save(1, view, {"step": 1})
    # A fresh run: the base loaded again, new adapters, then the restore.
    fresh_graphdef, fresh_params = adapted(model)
    _, fresh = build(fresh_graphdef, fresh_params, mesh, config)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        state_lib.checkpoint_view(fresh),
    )
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        restored, meta = ckpt.restore(abstract_state=abstract)
    resumed = state_lib.from_checkpoint(fresh, restored)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The step trains on from the restored state as from the saved one.
    batch = make_batch(4, 16, seed=1)
    expected, _ = step(state, batch, jax.random.key(1))
    got, _ = step(step.shard_state(resumed), batch, jax.random.key(1))
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(expected.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert saved_params(tmp_path / "ckpt" / "1" / "state") == adapter_paths(state.params)


def _keys(path) -> tuple:
    return tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def saved_params(state_dir) -> set:
    """The params paths a checkpoint's state item holds (from orbax's metadata)."""
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().metadata(state_dir).item_metadata.tree
    return {
        _keys(path)[1:-1]
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
        if _keys(path)[0] == "params"
    }


def adapter_paths(params) -> set:
    adapters, _ = lora.partition(params)
    return {
        _keys(path)
        for path, _ in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(adapters))[0]
    }


def test_sharded_lora_step_matches_single_device():
    proc = run_on_host_devices("tests.train.sharded_lora_check", timeout=600)
    assert_ran(proc, "SHARDED LORA STEP OK")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"train.lora.rank": -2}, "lora rank"),
        ({"train.lora.rank": 4, "train.lora.alpha": -1.0}, "lora alpha"),
        ({"train.lora.rank": 4, "train.lora.targets": ("q_proj", "embed")}, "lora targets"),
    ],
)
def test_bad_lora_configs_are_config_errors(fields, match):
    from wmrl_jax.train.config import ConfigError, base_config, override, validate_config

    config = base_config("text")
    config.agent.text.checkpoint = "unused"
    with pytest.raises(ConfigError, match=match):
        validate_config(override(config, **fields))


def test_lora_needs_an_agent_with_projections():
    from wmrl_jax.train.config import ConfigError, base_config, override, validate_config

    with pytest.raises(ConfigError, match="lora.rank must be 0 for the 'recipe' agent"):
        validate_config(override(base_config("recipe"), **{"train.lora.rank": 4}))
