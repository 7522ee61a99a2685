"""Throughput and model-FLOPs utilisation of the sharded GRPO train step.

    python -m benchmarks.train_step [--preset qwen3_1p7b] [--batch 8] [--seq 2048]
        [--microbatches 4] [--epochs 1] [--kl-coef 0] [--remat] [--peak-tflops 989] [--json PATH]
    python -m benchmarks.train_step --preset tiny        # seconds on a CPU

A random Qwen3 of the preset's shapes (Qwen3-1.7B by default: hidden 2048, 28
layers, 16 heads, 8 kv heads, head_dim 128, intermediate 6144, vocab 151936,
tied embeddings) in the preset's dtype, on a mesh over all local devices
(``--data``/``--fsdp``/``--tensor``, default all on fsdp). One step is
`wmrl_jax.train.step`'s full update: ``--epochs`` optimizer updates, each
accumulating ``--microbatches`` forward+backward passes over ``batch x seq``
tokens, plus one reference forward when ``--kl-coef`` is non-zero; ``--remat``
is the step config's ``remat=True`` (per-layer remat and the blocked LM head).

Reported: compile seconds (first call), median step seconds over ``--repeats``
calls (each waited on), tokens/s (batch x seq / step time, one epoch's tokens),
model TFLOP/s and MFU against ``--peak-tflops`` (default: the H200's dense bf16
989 TFLOP/s). Model FLOPs are 6 N + attention per token and epoch (see
`benchmarks.forward.flops_per_token`), plus 2 N + a third of the attention per
token for the reference forward.
"""

import argparse
import os
import platform
import statistics
import time

import jax
import numpy as np

from benchmarks.forward import PRESETS as FORWARD_PRESETS
from benchmarks.forward import flops_per_token, write_json
from benchmarks.gated_delta import PRESETS as GDN_PRESETS
from wmrl_jax import models
from wmrl_jax.models import sharding
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib

PRESETS = {
    "qwen3_1p7b": dict(
        model=dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=True,
        ),
        dtype="bfloat16",
        batch=8,
        seq=2048,
        microbatches=4,
    ),
    # Qwen3.5-0.8B's text shapes (hybrid: three Gated DeltaNet layers, then one attention).
    "qwen3_5_0p8b": dict(
        family="qwen3_5", model=GDN_PRESETS["qwen3_5_0p8b"], dtype="bfloat16", batch=8,
        seq=2048, microbatches=4,
    ),
    "tiny": dict(model=FORWARD_PRESETS["tiny"], dtype="float32", batch=4, seq=32, microbatches=2),
    "qwen3_5_tiny": dict(
        family="qwen3_5", model=GDN_PRESETS["tiny"], dtype="float32", batch=4, seq=128,
        microbatches=2,
    ),
}  # fmt: skip


def model_config(preset: dict, dtype: str):
    """The raw config dict of a preset (Qwen3 dense, or Qwen3.5 with ``family="qwen3_5"``)."""
    if preset.get("family") == "qwen3_5":
        return models.qwen3_5_text_config_dict(**preset["model"], dtype=dtype)
    return models.qwen3_config_dict(**preset["model"], dtype=dtype)


def model_flops_per_token(config, seq: int) -> float:
    """Forward+backward FLOPs per token: 6 x matmul params + the softmax attention layers.

    Dense Qwen3: `benchmarks.forward.flops_per_token`. Qwen3.5: 6 x the params of
    every matrix (the embedding gather excluded, a tied head once) plus causal
    attention in its full-attention layers; the Gated DeltaNet's chunked recurrence
    (O(T C) per head, C = 64) is not counted, so its MFU leans low.
    """
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return flops_per_token(config, seq)
    from wmrl_jax.models import memory

    shapes = memory.param_shapes(config)
    matmul = sum(
        int(np.prod(s)) for p, s in shapes.items() if len(s) == 2 and p[0] != "embed_tokens"
    )
    if config.tie_word_embeddings:
        matmul += config.hidden_size * config.vocab_size
    q = config.num_attention_heads * config.head_dim
    return 6.0 * matmul + 6 * layer_types.count("full_attention") * q * seq


def random_batch(rng, *, batch: int, seq: int, vocab: int) -> dict:
    """A GRPO batch: a prompt quarter, then completions of random lengths, no padding."""
    prompt = seq // 4
    lengths = rng.integers(seq // 2, seq - prompt + 1, size=batch)
    cols = np.arange(seq)[None]
    loss = ((cols >= prompt) & (cols < prompt + lengths[:, None])).astype(np.float32)
    return {
        "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
        "attention_mask": np.ones((batch, seq), np.int32),
        "loss_mask": loss,
        "old_logprobs": (np.log(rng.uniform(1e-6, 1e-4, size=(batch, seq))) * loss).astype(
            np.float32
        ),
        "advantages": rng.normal(size=batch).astype(np.float32),
    }


def peak_bytes() -> int | None:
    """The most bytes the first device's allocator held (None where it does not say: CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def planned_bytes(config, args, batch: int, seq: int, micro: int, mesh, dtype: str) -> float:
    """The memory plan's train peak per device for this run (`train.memory.plan`)."""
    from wmrl_jax.train import memory

    workload = memory.Workload(
        param_dtype=dtype, compute_dtype=dtype, rollout_rows=batch, prompt_tokens=seq // 4,
        new_tokens=seq - seq // 4, anchors_per_task=0, wm_samples=1, wm_new_tokens=1,
        microbatches=micro, reference=args.kl_coef != 0, remat=args.remat,
    )  # fmt: skip
    device = memory.Device("measured", 2.0**60, 2.0**60)  # the peak only; no fit is asked
    return memory.plan(config, workload, dict(mesh.shape), device).train_peak


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3_1p7b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--microbatches", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--kl-coef", type=float, default=0.0)
    parser.add_argument("--remat", action="store_true", help="per-layer remat, blocked head")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    parser.add_argument("--data", type=int, default=1)
    parser.add_argument("--fsdp", type=int, default=None, help="default: devices / (data x tensor)")
    parser.add_argument("--tensor", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="device peak for MFU")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    batch = args.batch or preset["batch"]
    seq = args.seq or preset["seq"]
    micro = args.microbatches or preset["microbatches"]
    dtype = args.dtype or preset["dtype"]
    fsdp = args.fsdp or jax.device_count() // (args.data * args.tensor)
    mesh = sharding.make_mesh(args.data, fsdp, args.tensor)

    raw = model_config(preset, dtype)
    model = models.random_model(raw, jax.random.key(0), dtype=dtype)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(model.params))
    opt_config = state_lib.default_optimizer_config()
    opt_config.lr = 1e-6
    optimizer = state_lib.make_optimizer(opt_config)
    config = step_lib.default_step_config()
    config.num_microbatches, config.num_epochs = micro, args.epochs
    config.loss.kl_coef, config.compute_dtype = args.kl_coef, dtype
    config.remat = args.remat
    step = step_lib.make_train_step(model.graphdef, optimizer, config, mesh)
    state = step.shard_state(
        state_lib.init_train_state(model.params, optimizer, kl_coef=args.kl_coef)
    )
    del model
    data = random_batch(
        np.random.default_rng(0), batch=batch, seq=seq, vocab=preset["model"]["vocab_size"]
    )
    placed = step.shard_batch(data)

    start = time.perf_counter()
    state, metrics = step(state, placed, jax.random.key(0))
    jax.block_until_ready((state, metrics))
    compile_s = time.perf_counter() - start
    times = []
    for i in range(args.repeats):
        start = time.perf_counter()
        state, metrics = step(state, placed, jax.random.key(i + 1))
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)

    tokens = batch * seq
    per_token = model_flops_per_token(models.config_from_dict(raw), seq)
    flops = per_token * tokens * args.epochs + (per_token / 3) * tokens * (args.kl_coef != 0)
    tflops = flops / step_s / 1e12
    payload = {
        "benchmark": "train_step",
        "args": vars(args),
        "device": f"{jax.devices()[0].device_kind} x{jax.device_count()}",
        "mesh": dict(mesh.shape),
        "params": n_params,
        "batch": batch,
        "seq": seq,
        "microbatches": micro,
        "dtype": dtype,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "model_tflops": tflops,
        "mfu": tflops / args.peak_tflops,
        "traces": step.trace_count,
        "loss": float(metrics["loss"]),
        "grad_norm": float(metrics["grad_norm"]),
        "peak_bytes": peak_bytes(),
        "plan_bytes": planned_bytes(
            models.config_from_dict(raw), args, batch, seq, micro, mesh, dtype
        ),
    }
    print(
        f"train step, preset={args.preset} ({n_params / 1e6:,.1f}M params, {dtype}), "
        f"batch={batch} seq={seq} micro={micro} epochs={args.epochs} kl={args.kl_coef} "
        f"remat={args.remat}, "
        f"{payload['device']} mesh={payload['mesh']} ({platform.processor() or 'cpu'} "
        f"x{os.cpu_count()})"
    )
    print("| compile s | step s | tokens/s | model TFLOP/s | MFU |\n|---|---|---|---|---|")
    print(
        f"| {compile_s:.1f} | {step_s:.4f} | {tokens / step_s:,.0f} | {tflops:.1f} | "
        f"{tflops / args.peak_tflops:.1%} |"
    )
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
