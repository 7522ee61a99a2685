"""A reduced-width Qwen3.5's remat train step compiled at several depths, against the plan.

    python -m benchmarks.aot_depth               # CPU: width 128, fsdp=4 of 8 host devices
    python -m benchmarks.aot_depth --target=h200 --width=512 --tokens=1024 --dtype=bfloat16 \
        --mesh=1,1,1 --rows=8                    # one H200 (compile-only, as benchmarks.aot)
    python -m benchmarks.aot_depth --target=h200 --width=512 --tokens=1024 --dtype=bfloat16 \
        --mesh=1,8,1 --rows=32                   # 8 x H200, fsdp=8

`benchmarks.aot` extrapolates each full-width model from two compiled depths.
Qwen3.5's layers are scanned in groups of four (`models.layer_scan`), so what
one more group costs per device, and whether the temporaries are affine in the
number of groups at all, is measured here on shapes that compile in seconds:
the MLE-Dojo Qwen3.5-4B config's train step (remat, blocked LM head, AdamW) on a
decoder of width `--width` (MLP 3x, 4 attention heads of width / 4, Gated
DeltaNet 2 key and 4 value heads of width / 4, vocabulary 8x), each depth
compiled on abstract arrays (`benchmarks.aot.compile_train`) beside the plan
(`benchmarks.aot.plan_numbers`). Prints the temporaries per device at each
depth and their growth per group of four layers, compiler and plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os

from benchmarks import aot, aot_targets

MIB = 2**20
PERIOD = 4  # layers per group of the Qwen3.5 layer scan


def reduced_qwen3_5(width: int):
    """Qwen3.5-4B's layer pattern at width `width` (a multiple of 4; 4 layers)."""
    from wmrl_jax.models import architectures

    head = width // 4
    return aot.at_depth(
        dataclasses.replace(
            architectures.get("qwen3.5-4b"), vocab_size=8 * width, hidden_size=width,
            intermediate_size=3 * width, num_attention_heads=4, num_key_value_heads=1,
            head_dim=head, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=head, linear_value_head_dim=head,
        ),
        PERIOD,
    )  # fmt: skip


def measure(
    depths, *, width=128, tokens=256, rows=16, mesh=(1, 4, 1), microbatches=2,
    dtype="float32", target="cpu",
) -> dict:  # fmt: skip
    """{depth: {"train": compiler numbers, "plan": plan numbers}} per device.

    `rows` sequences of `tokens` tokens per step, split into `microbatches`;
    `mesh` = (data, fsdp, tensor). JAX must see enough devices (`target` "cpu":
    force them before JAX starts, as `main` does).
    """
    from wmrl_jax.models import sharding

    base = reduced_qwen3_5(width)
    config = aot.run_config("qwen3.5-4b", tuple(mesh), microbatches)
    config.tasks_per_step, config.group_size = rows // 4, 4
    text = config.agent.text
    text.max_prompt_tokens, text.max_new_tokens = tokens - tokens // 4, tokens // 4
    text.dtype = config.train.compute_dtype = dtype
    devices = aot_targets.target_devices(target, math.prod(mesh))
    jax_mesh = sharding.make_mesh(*mesh, devices=devices)
    out = {}
    for depth in depths:
        arch = dataclasses.replace(
            base, num_hidden_layers=depth, layer_types=base.layer_types * (depth // PERIOD)
        )
        out[depth] = {
            "plan": aot.plan_numbers(arch, config, "h200", gen_rows=1),
            "train": aot.compile_train(arch, config, jax_mesh),
        }
    return out


def per_group(at: dict) -> list[tuple[int, int, float, float]]:
    """(depth, next depth, compiler, plan) temporaries added per group of four layers."""
    depths = sorted(at)
    return [
        (
            a, b,
            (at[b]["train"]["temporaries"] - at[a]["train"]["temporaries"]) * PERIOD / (b - a),
            (at[b]["plan"]["train_temporaries"] - at[a]["plan"]["train_temporaries"])
            * PERIOD / (b - a),
        )
        for a, b in zip(depths[:-1], depths[1:], strict=True)
    ]  # fmt: skip


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu", choices=aot_targets.TARGETS)
    parser.add_argument("--depths", default="4,8,12,16", help="multiples of 4")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rows", type=int, default=16, help="sequences per step")
    parser.add_argument("--mesh", default="1,4,1", help="data,fsdp,tensor")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile only; keys stay on the host
    if args.target == "cpu":
        aot_targets.force_host_devices(8)
    depths = [int(d) for d in args.depths.split(",")]
    if any(d % PERIOD for d in depths):
        raise ValueError(f"depths must be multiples of {PERIOD}, got {args.depths}")
    at = measure(
        depths, width=args.width, tokens=args.tokens, rows=args.rows,
        mesh=tuple(int(x) for x in args.mesh.split(",")), microbatches=args.microbatches,
        dtype=args.dtype, target=args.target,
    )  # fmt: skip
    print("| depth | compiler temp MiB | plan temp MiB | plan / compiler |\n|---|---|---|---|")
    for d, row in sorted(at.items()):
        c, p = row["train"]["temporaries"], row["plan"]["train_temporaries"]
        print(f"| {d} | {c / MIB:.2f} | {p / MIB:.2f} | {p / c:.2f} |")
    print("\n| depths | per group of 4 layers MiB: compiler, plan |\n|---|---|")
    for a, b, c, p in per_group(at):
        print(f"| {a} -> {b} | {c / MIB:.2f}, {p / MIB:.2f} |")
    return at


if __name__ == "__main__":
    main()
