"""The memory plan of a text-agent run, its knobs, and the mesh check."""

from __future__ import annotations

import dataclasses
import re

import pytest

from experiments.configs import qwen3_4b_mledojo
from wmrl_jax.models import architectures
from wmrl_jax.models import memory as model_memory
from wmrl_jax.train import memory, mesh
from wmrl_jax.train.config import ConfigError, override

H200 = memory.Device("h200", 141e9, 141e9 * 0.75 - memory.RESERVE)
FSDP8 = {"data": 1, "fsdp": 8, "tensor": 1}


def _workload(**fields) -> memory.Workload:
    config = override(qwen3_4b_mledojo.get_config(), **fields)
    return memory.workload_from_config(config)


def test_workload_reads_the_config():
    w = _workload()
    assert (w.rollout_rows, w.prompt_tokens, w.new_tokens) == (128, 4096, 4096)
    assert w.wm_prompt == 4096 + 3 * 4096 and w.wm_rows == 512
    micro = qwen3_4b_mledojo.SIZES["4b"]["micro"]
    assert (w.param_dtype, w.microbatches, w.reference, w.frozen_wm, w.remat) == (
        "bfloat16",
        micro,
        False,
        False,
        True,
    )
    assert not _workload(**{"train.remat": False}).remat


def test_an_episode_is_planned_at_its_longest_prompt():
    # K = 3 messages of M = 4096 with tool answers of E = 512: the last message's prompt
    # holds the two earlier messages and answers, and prompt + new is the train row.
    w = _workload(**{"agent.text.turns": 3, "agent.text.tool_max_tokens": 512})
    assert (w.prompt_tokens, w.new_tokens) == (4096 + 2 * (4096 + 512), 4096)
    assert w.prompt_tokens + w.new_tokens == 4096 + 3 * 4096 + 2 * 512
    assert w.wm_prompt == w.prompt_tokens + 3 * 4096


def test_resident_state_per_device():
    arch = architectures.get("qwen3-4b")
    shard = model_memory.param_elements_per_device(arch, FSDP8)
    p = memory.plan(arch, _workload(), FSDP8, H200)
    assert p.resident["params"] == 2 * shard
    assert p.resident["optimizer (AdamW mu, nu)"] == (4 + 2) * shard  # f32 mu, bf16 nu
    assert "loaded params on device 0" not in p.resident  # the agent loads onto the mesh
    unsharded = memory.workload_from_config(qwen3_4b_mledojo.get_config(), unsharded_load=True)
    p_unsharded = memory.plan(arch, unsharded, FSDP8, H200)
    assert p_unsharded.resident["loaded params on device 0"] == 2 * 4_022_468_096
    assert "reference params (KL)" not in p.resident
    assert p.grads == shard * (4 + 2)  # float32 sum + one bf16 micro-batch gradient
    kl = memory.plan(arch, _workload(**{"train.loss.kl_coef": 0.04}), FSDP8, H200)
    assert kl.resident["reference params (KL)"] == 2 * shard
    frozen = memory.workload_from_config(
        override(qwen3_4b_mledojo.get_config(), **{"agent.wm_params": "initial"}),
        unsharded_load=True,
    )
    frozen = memory.plan(arch, frozen, FSDP8, H200)
    assert frozen.resident["frozen WM params"] == 2 * 4_022_468_096  # the unsharded load
    sharded = memory.workload_from_config(
        override(qwen3_4b_mledojo.get_config(), **{"agent.wm_params": "initial"})
    )
    resident = memory.plan(arch, sharded, FSDP8, H200).resident
    assert resident["frozen WM params"] == 2 * shard and "loaded params on device 0" not in resident
    single = memory.plan(arch, _workload(), {"fsdp": 1}, H200)
    assert "loaded params on device 0" not in single.resident  # the state is that copy


def test_generation_rows_fill_the_free_memory():
    p = memory.plan(architectures.get("qwen3.5-9b"), _workload(), FSDP8, H200)
    # Capped at the rows there are: 128 rollouts, 512 world-model rows, over 8 devices.
    assert p.batch_sizes() == {"rollout": 8 * min(p.gen_rows, 16), "wm": 8 * min(p.wm_rows, 64)}
    # Generating holds two layers gathered at its peak, not the embedding and LM head.
    assert 0 < p.gen_gathered < p.resident[memory.GATHERED]
    free = H200.usable - sum(p.resident.values()) + p.resident[memory.GATHERED] - p.gen_gathered
    assert p.gen_rows >= 1 and p.gen_rows * p.gen_row <= free < (p.gen_rows + 1) * p.gen_row
    assert p.wm_rows * p.wm_row <= free < (p.wm_rows + 1) * p.wm_row
    cache = model_memory.cache_bytes_per_row(architectures.get("qwen3.5-9b"), 8192, 2)
    assert p.gen_row > cache  # the cache plus the prefill's working set


def _bound(problem: str, pattern: str) -> int:
    return int(re.search(pattern, problem).group(1))


def _device(usable: float) -> memory.Device:
    return memory.Device("test", usable, usable)


def _problem(p: memory.MemoryPlan, part: str) -> str:
    (problem,) = [q for q in p.problems if q.startswith(part)]
    return problem


def test_train_knobs_are_the_boundary():
    """Each fix the plan names fits, and the next smaller change does not."""
    arch = architectures.get("qwen3-8b")
    plain = dataclasses.replace(_workload(), remat=False, microbatches=1)  # 16 rows per device
    p = memory.plan(arch, plain, FSDP8, H200)
    fixed = sum(p.resident.values()) + p.grads

    def fits(usable, **changes):
        w = dataclasses.replace(plain, **changes)
        return memory.plan(arch, w, FSDP8, _device(usable)).train_fits

    # Room for one plain sequence: one row per micro-batch.
    usable = fixed + 1.5 * p.train_row
    problem = _problem(memory.plan(arch, plain, FSDP8, _device(usable)), "training")
    assert "config.train.num_microbatches=16)" in problem
    assert fits(usable, microbatches=16) and not fits(usable, microbatches=8)
    # Room for a few rematerialised sequences, not one plain one: remat, then micro-batches.
    # With remat the layers are stacked once more for the layer scan.
    fixed += memory.plan(arch, dataclasses.replace(plain, remat=True), FSDP8, H200).scan_view
    usable = fixed + 2.5 * p.train_row_remat
    problem = _problem(memory.plan(arch, plain, FSDP8, _device(usable)), "training")
    assert "config.train.remat=True with config.train.num_microbatches=8" in problem
    assert fits(usable, remat=True, microbatches=8) and not fits(usable, remat=True, microbatches=4)
    # Not even one rematerialised sequence: shorter ones, one per micro-batch.
    usable = fixed + 0.3 * p.train_row_remat
    problem = _problem(memory.plan(arch, plain, FSDP8, _device(usable)), "training")
    assert "config.train.remat=True, config.train.num_microbatches=16 with" in problem
    total = _bound(problem, r"max_new_tokens <= (\d+)")

    def shorter(n):
        return fits(
            usable, remat=True, microbatches=16, prompt_tokens=n - n // 2, new_tokens=n // 2
        )

    assert shorter(total) and not shorter(total + 1)


def test_world_model_knobs_are_the_boundary():
    arch, w = architectures.get("qwen3-4b"), _workload()
    p = memory.plan(arch, w, FSDP8, H200)
    one_anchor = memory.plan(arch, dataclasses.replace(w, anchors_per_task=1), FSDP8, H200)
    fixed = sum(p.resident.values()) - p.resident[memory.GATHERED] + p.gen_gathered
    device = _device(fixed + (p.wm_row + one_anchor.wm_row) / 2)
    problem = _problem(memory.plan(arch, w, FSDP8, device), "world model")
    assert "config.agent.text.anchors_per_task<=1" in problem
    m = _bound(problem, r"max_new_tokens<=(\d+)")
    for new, rows in ((m, 1), (m + 1, 0)):
        assert (
            memory.plan(arch, dataclasses.replace(w, new_tokens=new), FSDP8, device).wm_rows == rows
        )


def test_a_plan_that_fits_and_rows_that_do_not_split():
    small = dict(**{"agent.text.max_prompt_tokens": 512, "agent.text.max_new_tokens": 256})
    p = memory.plan(architectures.get("qwen3-4b"), _workload(**small), FSDP8, H200)
    assert p.fits, p.problems
    assert p.format().splitlines()[-1] == "  fits"
    assert "batch_size=128 of 128" in p.format()
    assert p.batch_sizes() == {"rollout": 128, "wm": min(p.wm_rows, 64) * 8}
    odd = memory.plan(architectures.get("qwen3-4b"), _workload(**small), {"fsdp": 3}, H200)
    micro = qwen3_4b_mledojo.SIZES["4b"]["micro"]
    assert any(f"config.train.num_microbatches={micro} x 3" in q for q in odd.problems)


def test_resident_state_alone_too_large():
    p = memory.plan(architectures.get("qwen3.5-9b"), _workload(), {"fsdp": 1}, H200)
    assert any("resident state and gradients alone need" in q for q in p.problems)


def test_named_devices(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert memory.named_device("H200").usable == pytest.approx(141e9 * 0.75 - memory.RESERVE)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert memory.named_device("a100-80").usable == pytest.approx(80 * 2**30 * 0.9 - memory.RESERVE)
    assert memory.named_device("cpu", mesh_devices=4).total > 0
    with pytest.raises(ValueError, match="h200"):
        memory.named_device("tpu-v9")


@dataclasses.dataclass
class FakeDevice:
    platform: str = "gpu"
    device_kind: str = "NVIDIA H200"
    limit: int | None = 100 * 2**30

    def memory_stats(self):
        return None if self.limit is None else {"bytes_limit": self.limit}


def _mesh(data=1, fsdp=8, tensor=1):
    return {"data": data, "fsdp": fsdp, "tensor": tensor}


def test_check_mesh_against_the_devices_present():
    eight = [FakeDevice() for _ in range(8)]
    assert mesh.check_mesh(_mesh(), eight) == _mesh()
    assert mesh.check_mesh(_mesh(fsdp=-1, tensor=2), eight) == _mesh(fsdp=4, tensor=2)
    with pytest.raises(
        ConfigError, match=r"needs 8 devices; 1 present \(1 x gpu NVIDIA H200\).*fsdp=1"
    ):
        mesh.check_mesh(_mesh(), eight[:1])
    with pytest.raises(ConfigError, match=r"needs 4 devices; 8 present"):
        mesh.check_mesh(_mesh(fsdp=4), eight)  # an accelerator left idle is a mistake
    with pytest.raises(ConfigError, match="config.mesh sizes"):
        mesh.check_mesh(_mesh(fsdp=0), eight)
    cpus = [FakeDevice("cpu", "cpu", None) for _ in range(8)]
    assert mesh.check_mesh(_mesh(fsdp=1), cpus) == _mesh(fsdp=1)  # tests use the first ones


def test_device_memory_of_the_devices_present():
    gpus = [FakeDevice(limit=90 * 2**30), FakeDevice(limit=80 * 2**30)]
    device = mesh.device_memory(gpus)
    assert (device.name, device.total) == ("NVIDIA H200", 80 * 2**30)
    assert device.usable == 80 * 2**30 - memory.RESERVE
    assert mesh.device_memory([FakeDevice("cpu", "cpu", None)]).name == "cpu"


def test_plan_run_on_a_named_device_or_the_devices_present():
    config = qwen3_4b_mledojo.get_config()
    named = mesh.plan_run(config, device="h200", model="qwen3-4b")
    assert named.mesh == _mesh() and named.device.name == "h200"
    present = mesh.plan_run(config, model="qwen3-4b", devices=[FakeDevice() for _ in range(8)])
    assert present.device.total == 100 * 2**30 and present.mesh == _mesh()
    with pytest.raises(ConfigError, match="needs 8 devices; 1 present"):
        mesh.plan_run(config, model="qwen3-4b", devices=[FakeDevice()])


def test_plan_run_reads_the_architecture_from_a_checkpoint_directory():
    config = qwen3_4b_mledojo.get_config("runlocal")  # the committed tiny checkpoint
    p = mesh.plan_run(config, device="cpu")
    assert p.fits and p.param_count == 94_592
    with pytest.raises(ConfigError, match="--dry_run_model=qwen3-4b"):
        mesh.plan_run(qwen3_4b_mledojo.get_config(), device="h200")
    with pytest.raises(ConfigError, match="neither a known architecture"):
        mesh.plan_run(config, device="h200", model="qwen3-5b")
    with pytest.raises(ConfigError, match="unknown device"):
        mesh.plan_run(config, device="tpu")
    with pytest.raises(ConfigError, match="text-agent runs"):
        mesh.plan_run(override(config, **{"agent.kind": "recipe"}), device="h200")


def test_the_named_mesh_is_the_smallest_fsdp_that_fits():
    arch = architectures.get("qwen3.5-9b")
    short = {
        "agent.text.max_prompt_tokens": 1536,
        "agent.text.max_new_tokens": 1024,
        "train.remat": False,
        "train.num_microbatches": 8,
    }
    w = _workload(**short)
    (problem,) = memory.plan(arch, w, {"fsdp": 4}, H200).problems
    assert problem.endswith("or config.mesh.fsdp=16)")
    assert memory.plan(arch, w, {"fsdp": 16}, H200).fits
    assert not memory.plan(arch, w, FSDP8, H200).train_fits
