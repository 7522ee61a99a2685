"""The memory plan with LoRA: the frozen base without moments or gradients, the adapters
with both, counted by hand; and what it says of Qwen3.5-9B on one H200."""

from __future__ import annotations

from experiments.configs import qwen3_4b_mledojo, qwen3_5_9b_mledojo
from wmrl_jax.models import architectures, lora
from wmrl_jax.models import memory as model_memory
from wmrl_jax.train import memory, mesh
from wmrl_jax.train.config import override

H200 = memory.Device("h200", 141e9, 141e9 * 0.75 - memory.RESERVE)
FSDP8 = {"data": 1, "fsdp": 8, "tensor": 1}
RANK = 16


def _lora(config, **fields):
    return override(config, **{"train.lora.rank": RANK, **fields})


def test_adapter_elements_of_qwen3_4b_by_hand():
    # 36 layers of hidden 2560, q 32 x 128, k and v 8 x 128, MLP 9728: A [in, r], B [r, out].
    h, q, kv, f = 2560, 4096, 1024, 9728
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h)
    arch = architectures.get("qwen3-4b")
    total, one = lora.adapter_elements(arch, rank=RANK, targets=lora.TARGETS, mesh={"fsdp": 1})
    assert total == one == 36 * RANK * per_layer
    # fsdp = 8: A of the column-parallel q/k/v/gate/up splits its input (h) over fsdp and
    # B of the row-parallel o/down its output (h); the rest is whole on every device.
    _, sharded = lora.adapter_elements(arch, rank=RANK, targets=lora.TARGETS, mesh=FSDP8)
    split = 5 * h + 2 * h  # A of q, k, v, gate, up; B of o, down
    assert sharded == 36 * RANK * (per_layer - split + split // 8)


def test_the_plan_trains_the_adapters_and_freezes_the_base():
    arch = architectures.get("qwen3-4b")
    config = _lora(qwen3_4b_mledojo.get_config(), **{"train.loss.kl_coef": 0.04})
    w = memory.workload_from_config(config)
    assert (w.lora_rank, w.lora_targets) == (RANK, lora.DEFAULT_TARGETS)
    p = memory.plan(arch, w, FSDP8, H200)
    full = memory.plan(
        arch, memory.workload_from_config(qwen3_4b_mledojo.get_config()), FSDP8, H200
    )
    _, adapters = lora.adapter_elements(arch, rank=RANK, targets=lora.DEFAULT_TARGETS, mesh=FSDP8)
    shard = model_memory.param_elements_per_device(arch, FSDP8)
    assert p.resident["params (frozen base)"] == full.resident["params"] == 2 * shard
    assert p.resident[f"LoRA adapters (rank {RANK})"] == 2 * adapters
    assert p.resident["optimizer (AdamW mu, nu)"] == (4 + 2) * adapters  # f32 mu, bf16 nu
    assert p.grads == (4 + 2) * adapters  # float32 sum + one bf16 micro-batch gradient
    assert "reference params (KL)" not in p.resident  # the base is the reference
    # Each sequence keeps its adapters' x A ([tokens, r] per adapted projection).
    extra = lora.adapter_activation_bytes(
        arch, rank=RANK, targets=lora.DEFAULT_TARGETS, tokens=8192, dtype_bytes=2, remat=True
    )
    assert extra == 7 * 8192 * RANK * 2  # one layer's seven projections, with remat
    assert p.train_row == full.train_row + extra
    assert p.train_peak < full.train_peak
    assert "LoRA adapters (rank 16)" in p.format()


def test_qwen3_5_9b_fits_one_h200_with_lora_and_not_without(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")
    one = {"mesh.fsdp": 1, "train.num_microbatches": 32}
    base = override(qwen3_5_9b_mledojo.get_config(), **one)
    adapted = _lora(base, **{"train.lora.rank": 64})
    with_lora = mesh.plan_run(adapted, device="h200", model="qwen3.5-9b")
    assert with_lora.fits, with_lora.format()
    without = mesh.plan_run(base, device="h200", model="qwen3.5-9b")
    assert not without.fits
    # Without LoRA no number of micro-batches fits the 8,192-token rows (the plan
    # names shorter sequences), whatever share of the device JAX takes.
    most = override(base, **{"train.num_microbatches": 128})
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    assert not mesh.plan_run(most, device="h200", model="qwen3.5-9b").fits
