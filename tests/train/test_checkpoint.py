"""Checkpointer: round trips, retention, atomicity, resume, and the Hugging Face export."""

import errno
import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wmrl_jax.models import api
from wmrl_jax.train.checkpoint import Checkpointer, CheckpointError, export_hf
from wmrl_jax.train.ledger import Ledger
from wmrl_jax.train.writer import MetricWriter, read_jsonl, read_tensorboard_scalars

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "models", "fixtures", "qwen3_gqa1_tied")


class CorrectionLike(NamedTuple):
    buffer: jax.Array
    count: jax.Array


def tiny_raw_config():
    return api.qwen3_config_dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )


def make_state(seed=0):
    model = api.random_model(tiny_raw_config(), jax.random.key(seed))
    return {
        "step": jnp.asarray(7, jnp.int32),
        "params": model.params,  # an nnx.State with integer layer keys
        "opt": {"mu": jnp.arange(6.0).reshape(2, 3), "count": jnp.asarray(3, jnp.int32)},
        "ref_params": None,
        "extra": {
            "correction": CorrectionLike(jnp.linspace(0.0, 1.0, 5), jnp.asarray(2, jnp.int32)),
            "rng": jax.random.key(seed + 1),
            "key_data": jax.random.key_data(jax.random.key(seed + 2)),
            "bf16": jnp.asarray([1.5, -2.25], jnp.bfloat16),
        },
    }


def assert_trees_equal(a, b):
    a = jax.tree.map(lambda x: x, a, is_leaf=lambda x: x is None)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(y.dtype, jax.dtypes.prng_key)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_state_and_meta(tmp_path):
    state = make_state()
    total = Ledger(gen_tokens=1234.0, gen_seconds=0.1 + 0.2, exec_seconds=1 / 3)
    meta = {
        "iterator": {"epoch": 1, "index": 17, "order": [3, 1, 2]},
        "ledger": total.to_dict(),
        "config": {"lr": 1e-5, "name": "tiny"},
    }
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.save(7, state, meta, metrics={"heldout_percentile": 0.5})
        ckpt.wait()
        restored, meta2 = ckpt.restore(abstract_state=jax.eval_shape(lambda: state))
    assert restored["ref_params"] is None
    assert isinstance(restored["extra"]["correction"], CorrectionLike)
    assert isinstance(restored["params"], nnx.State)
    assert_trees_equal(restored, state)
    assert meta2 == meta
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.meta() == ckpt.meta(7) == meta  # Without the state.
        with pytest.raises(FileNotFoundError, match="step 8"):
            ckpt.meta(8)
    with Checkpointer(tmp_path / "empty") as ckpt, pytest.raises(FileNotFoundError):
        ckpt.meta()
    assert Ledger.from_dict(meta2["ledger"]) == total  # floats exact through JSON
    # The restored key continues the same random stream.
    np.testing.assert_array_equal(
        jax.random.uniform(restored["extra"]["rng"], (3,)),
        jax.random.uniform(state["extra"]["rng"], (3,)),
    )


def test_restore_into_abstract_dtype_and_sharding(tmp_path):
    state = {"w": jnp.arange(8.0, dtype=jnp.float32).reshape(4, 2), "ref": None}
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    abstract = {"w": jax.ShapeDtypeStruct((4, 2), jnp.bfloat16, sharding=sharding), "ref": None}
    with Checkpointer(tmp_path, best_metric=None) as ckpt:
        ckpt.save(1, state, {})
        restored, meta = ckpt.restore(1, abstract_state=abstract)
    assert meta == {}
    assert restored["w"].dtype == jnp.bfloat16
    assert restored["w"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(restored["w"], np.float32), np.asarray(state["w"]))


SHARDED_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from wmrl_jax.train.checkpoint import Checkpointer
    assert jax.device_count() == 8
    save_mesh = Mesh(np.array(jax.devices()).reshape(8), ("fsdp",))
    w = jax.device_put(jnp.arange(64.0).reshape(16, 4), NamedSharding(save_mesh, P("fsdp")))
    ckpt = Checkpointer(sys.argv[1], best_metric=None)
    ckpt.save(3, {"w": w, "ref": None}, {"pos": 5})
    ckpt.wait()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor"))
    target = NamedSharding(mesh, P("data", "tensor"))
    abstract = {"w": jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=target), "ref": None}
    state, meta = ckpt.restore(abstract_state=abstract)
    ckpt.close()
    assert state["w"].sharding == target, state["w"].sharding
    assert len(state["w"].addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(64.0).reshape(16, 4))
    assert meta == {"pos": 5} and state["ref"] is None
    print("SHARDED_OK")
    """
)


def test_resharding_restore_on_8_cpu_devices(tmp_path):
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED_SCRIPT, str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "SHARDED_OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "mode, values, expected_kept, expected_best",
    [
        ("max", [0.1, 0.9, 0.3, 0.5, 0.2, 0.4], [2, 5, 6], 2),
        ("min", [0.1, 0.9, 0.3, 0.5, 0.2, 0.4], [1, 5, 6], 1),
        # The best so far is also among the latest: only keep=2 steps remain.
        ("max", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [5, 6], 6),
        # NaN and a missing metric are never the best.
        ("max", [0.3, float("nan"), None, 0.1, 0.2, 0.25], [1, 5, 6], 1),
    ],
)
def test_keep_latest_and_best(tmp_path, mode, values, expected_kept, expected_best):
    state = {"x": jnp.zeros(2)}
    with Checkpointer(tmp_path, keep=2, keep_best=1, best_mode=mode) as ckpt:
        for step, value in enumerate(values, start=1):
            metrics = None if value is None else {"heldout_percentile": value, "reward": 1.0}
            ckpt.save(step, state, {"step": step}, metrics=metrics)
        ckpt.wait()
        assert ckpt.all_steps() == expected_kept
        assert ckpt.best_step() == expected_best
        assert ckpt.latest_step() == 6
    on_disk = sorted(int(n) for n in os.listdir(tmp_path) if n.isdigit())
    assert on_disk == expected_kept
    # A new manager on the same directory sees the same steps and best (metrics persisted).
    with Checkpointer(tmp_path, keep=2, keep_best=1, best_mode=mode) as again:
        assert again.all_steps() == expected_kept
        assert again.best_step() == expected_best
        _, meta = again.restore(expected_best, abstract_state={"x": jnp.zeros(2)})
        assert meta == {"step": expected_best}


def test_save_interval_and_force(tmp_path):
    with Checkpointer(tmp_path, save_interval_steps=5, best_metric=None) as ckpt:
        written = [ckpt.save(s, {"x": jnp.ones(1)}, {}) for s in range(1, 12)]
        assert ckpt.save(12, {"x": jnp.ones(1)}, {}, force=True)
        ckpt.wait()
        assert [s for s, w in zip(range(1, 12), written, strict=True) if w] == [1, 5, 10]
        assert ckpt.all_steps() == [5, 10, 12]  # keep=3 latest


def test_incomplete_save_is_ignored(tmp_path):
    state = {"x": jnp.arange(3.0)}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state, {"pos": 1}, metrics={"heldout_percentile": 0.1})
        ckpt.save(2, state, {"pos": 2}, metrics={"heldout_percentile": 0.2})
    # What a save killed before orbax's final rename leaves behind.
    partial = tmp_path / "3.orbax-checkpoint-tmp-1700000000000000"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "garbage").write_bytes(b"\x00" * 10)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 2
        assert ckpt.all_steps() == [1, 2]
        _, meta = ckpt.restore(abstract_state=state)
        assert meta == {"pos": 2}
        # The run continues and can write step 3 for real.
        assert ckpt.save(3, state, {"pos": 3}, metrics={"heldout_percentile": 0.3})
        ckpt.wait()
        assert ckpt.latest_step() == 3


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        Checkpointer(tmp_path, keep=0)
    with pytest.raises(ValueError, match="best_mode"):
        Checkpointer(tmp_path, best_mode="largest")
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(FileNotFoundError):
            ckpt.restore(abstract_state={})
        ckpt.save(1, {"x": jnp.ones(1)}, {})
        ckpt.wait()
        with pytest.raises(ValueError):
            ckpt.save(1, {"x": jnp.ones(1)}, {}, force=True)
        with pytest.raises(FileNotFoundError, match="step 9"):
            ckpt.restore(9, abstract_state={"x": jnp.ones(1)})
        with pytest.raises(ValueError, match="mapping"):
            ckpt.save(2, {"x": jnp.ones(1)}, [1, 2])


def toy_run(workdir, *, num_steps, stop_after=None, seed=0):
    """A miniature training loop: random-walk params, a task iterator, a ledger.

    With `stop_after`, the run dies after logging that step but before saving it
    (the worst moment), as a kill would.
    """
    tasks = ["a", "b", "c", "d", "e"]
    ckpt = Checkpointer(os.path.join(workdir, "ckpt"), keep=2)
    init = {"w": jnp.zeros(3), "rng": jax.random.key(seed), "ref": None}
    start = ckpt.latest_step()
    if start is None:
        state, position, total, start = init, 0, Ledger(), 0
    else:
        state, meta = ckpt.restore(abstract_state=jax.eval_shape(lambda: init))
        position, total = meta["position"], Ledger.from_dict(meta["ledger"])
    writer = MetricWriter(workdir, resume_step=start if start else None)
    for step in range(start + 1, num_steps + 1):
        task, position = tasks[position % len(tasks)], position + 1
        rng, key = jax.random.split(state["rng"])
        w = state["w"] + jax.random.normal(key, (3,)) * len(task)
        state = {"w": w, "rng": rng, "ref": None}
        total = total.add(Ledger(gen_tokens=10.0, executions=1.0, exec_seconds=0.1 * step))
        reward = float(jnp.sum(w))
        writer.write(step, {"reward": reward, "compute_seconds": total.compute_seconds})
        if step == stop_after:
            writer.close()
            return
        meta = {"position": position, "ledger": total.to_dict()}
        ckpt.save(step, state, meta, metrics={"heldout_percentile": reward})
    ckpt.close()
    writer.close()


def test_resume_after_kill_reproduces_metrics(tmp_path):
    toy_run(tmp_path / "straight", num_steps=5)
    toy_run(tmp_path / "killed", num_steps=5, stop_after=3)
    assert [e["step"] for e in read_jsonl(tmp_path / "killed")] == [1, 2, 3]
    toy_run(tmp_path / "killed", num_steps=5)
    straight = read_jsonl(tmp_path / "straight")
    assert [e["step"] for e in straight] == [1, 2, 3, 4, 5]
    assert read_jsonl(tmp_path / "killed") == straight
    assert read_tensorboard_scalars(tmp_path / "killed") == read_tensorboard_scalars(
        tmp_path / "straight"
    )


def test_export_hf_round_trip(tmp_path):
    raw = tiny_raw_config()
    model = api.random_model(raw, jax.random.key(3))
    ids = np.array([[1, 5, 9, 63, 0, 2]], np.int32)
    expected = np.asarray(model.logits(ids))
    out = export_hf(model.graphdef, model.params, raw, tmp_path / "policy", tokenizer=FIXTURE)
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    reloaded = api.from_pretrained(out, load_tokenizer=False)
    np.testing.assert_array_equal(np.asarray(reloaded.logits(ids)), expected)
    # A pure dict and a tokenizer object work too; an existing directory needs overwrite.
    with pytest.raises(FileExistsError):
        export_hf(None, nnx.to_pure_dict(model.params), raw, out)
    tokenizer = api.load_tokenizer_from(FIXTURE)
    export_hf(None, nnx.to_pure_dict(model.params), raw, out, tokenizer=tokenizer, overwrite=True)
    again = api.from_pretrained(out)
    assert again.tokenizer is not None
    np.testing.assert_array_equal(np.asarray(again.logits(ids)), expected)


def test_export_hf_rejects_mismatched_graph(tmp_path):
    raw = tiny_raw_config()
    model = api.random_model(raw, jax.random.key(0))
    other = api.random_model({**raw, "num_hidden_layers": 2}, jax.random.key(0))
    with pytest.raises(ValueError, match="graphdef"):
        export_hf(other.graphdef, model.params, raw, tmp_path / "x")
    assert not os.path.exists(tmp_path / "x")


def test_async_save_survives_donation_of_the_state(tmp_path):
    # The next train step donates the state; orbax copies device arrays to host
    # before `save` returns, so the checkpoint holds the values at save time.
    state = {"x": jnp.arange(4.0)}
    step_fn = jax.jit(lambda s: {"x": s["x"] + 100.0}, donate_argnums=0)
    with Checkpointer(tmp_path, best_metric=None) as ckpt:
        ckpt.save(1, state, {})
        new_state = step_fn(state)
        restored, _ = ckpt.restore(abstract_state=jax.eval_shape(lambda: new_state))
    np.testing.assert_array_equal(np.asarray(restored["x"]), [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(new_state["x"]), [100.0, 101.0, 102.0, 103.0])


def test_a_full_disk_is_one_line_naming_the_directory(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path / "ckpt", keep=2, async_save=False)
    state = {"w": jnp.ones(3)}
    ckpt.save(1, state, {"step": 1})

    def full(*args, **kwargs):
        try:  # orbax re-raises what its writer hit, chained
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("a save failed") from e

    monkeypatch.setattr(ckpt._manager, "save", full)
    with pytest.raises(CheckpointError) as e:
        ckpt.save(2, state, {"step": 2})
    message = str(e.value)
    assert "no space left" in message and str(tmp_path / "ckpt") in message
    assert "\n" not in message
    monkeypatch.setattr(ckpt._manager, "save", lambda *a, **k: 1 / 0)  # other errors: as is
    with pytest.raises(ZeroDivisionError):
        ckpt.save(2, state, {"step": 2})
    monkeypatch.undo()
    assert ckpt.all_steps() == [1]  # what was saved is kept
    ckpt.close()


# Saves a random (incompressible) 4 MiB state into $1, a 256 KiB tmpfs, and prints what
# the checkpointer raised; orbax's array writer meets the full disk in its own threads.
_FULL_DISK_SAVE = """
import sys
import jax
from wmrl_jax.train.checkpoint import Checkpointer, CheckpointError
ckpt = Checkpointer(sys.argv[1] + "/ckpt", keep=2, async_save=sys.argv[2] == "async")
try:
    ckpt.save(1, {"w": jax.random.normal(jax.random.key(0), (1 << 20,))}, {"step": 1})
    ckpt.wait()
    print("saved")
except CheckpointError as e:
    print(f"CheckpointError: {e}")
ckpt.close()
"""


def _can_mount_a_tmpfs() -> bool:
    """A user and mount namespace where a tmpfs can be mounted (as the local sandbox needs)."""
    probe = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
             "mount -t tmpfs -o size=64k tmpfs /mnt"]  # fmt: skip
    try:
        return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount_a_tmpfs(), reason="needs unprivileged user namespaces")
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_real_full_disk_is_one_line_without_orbax_tracebacks(tmp_path, mode):
    # Before: tensorstore's RESOURCE_EXHAUSTED (a ValueError, no OSError in its chain) went
    # through as is, after orbax had logged it with tracebacks from its writer threads.
    disk = tmp_path / "disk"
    disk.mkdir()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mount = f'mount -t tmpfs -o size=256k tmpfs {disk} && exec "$0" -c "$1" {disk} {mode}'
    out = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount,
         sys.executable, _FULL_DISK_SAVE],
        capture_output=True, text=True, timeout=600, check=False,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=repo),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == (
        f"CheckpointError: no space left on the device of {disk}/ckpt while "
        f"{'finishing a checkpoint' if mode == 'async' else 'writing checkpoint step 1'}: free "
        "space there (the checkpoints saved so far are kept) and rerun to resume\n"
    ), out.stdout + out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "RESOURCE_EXHAUSTED" not in out.stderr, out.stderr
