"""Ahead-of-time compilation of the real shapes, without weights, beside the memory plan.

    python -m benchmarks.aot                                  # all four, 8 x H200 + one H200
    python -m benchmarks.aot --target=cpu --models=qwen3-4b   # 8 host CPU devices
    python -m benchmarks.aot --json out.json --readme benchmarks/README.md

For each MLE-Dojo config (`experiments/configs/*_mledojo.py`: Qwen3-4B, Qwen3-8B,
Qwen3.5-4B, Qwen3.5-9B), the sharded train step (`train.step`, with the config's
remat, micro-batches and blocked LM head) and the sampler (`models.sampler`:
one prefill into the cache, then the decode loop, one executable) are lowered
on `jax.ShapeDtypeStruct`s that carry their shardings and compiled for
`--target` (`benchmarks.aot_targets`: compile-only H100 / H200 devices, or
host CPUs). No weight is allocated and nothing runs. Each executable's own
`memory_analysis()` (per device: arguments, outputs, temporaries) is set beside
the plan of `--dry_run` (`train.mesh.plan_run`, `train.memory`) as ratios
plan / compiler.

Depth: the decoders loop over their layers in Python, so an executable's size
and its compile time grow with depth (a 2-layer Qwen3-4B train step takes
~1 min to compile for the GPU here). Each shape is compiled at full width and
two depths (`--depths`, multiples of Qwen3.5's period of 4 layers); every
byte count is then affine in depth (params, optimizer state and the kept layer
inputs per layer; one layer's working set and the LM head once), so the full
depth is extrapolated from the two, and the plan is evaluated at the same
depths, so plan and compiler are compared at compiled depths too.
Affine, that is, once the remat layer scan (`models.layer_scan`) runs at least
twice: Qwen3.5 scans groups of 4 layers, and at 4 layers XLA drops the
one-iteration forward and backward loops and schedules that group as straight-line
code, so depth 4 is off the line through 8, 12, 16, ... (tests/test_aot.py); its
default depths start at 8.
A third depth in `--depths` (e.g. ``--depths=2,4,8``) is compiled too and
`check` in the JSON gives extrapolated / compiled at it, per number.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math
import os
import time

from benchmarks import aot_targets

GIB = 2**30
CONFIGS = {
    "qwen3-4b": "experiments.configs.qwen3_4b_mledojo",
    "qwen3-8b": "experiments.configs.qwen3_8b_mledojo",
    "qwen3.5-4b": "experiments.configs.qwen3_5_4b_mledojo",
    "qwen3.5-9b": "experiments.configs.qwen3_5_9b_mledojo",
}
# One H200 (docs/main_job.md): fsdp=1, JAX's share 0.95, these micro-batches.
SINGLE = {"qwen3-4b": 32, "qwen3-8b": 128, "qwen3.5-4b": 64, "qwen3.5-9b": 128}
SINGLE_FRACTION = 0.95  # XLA_PYTHON_CLIENT_MEM_FRACTION of the documented one-H200 runs
PARTS = ("train", "rollout")
# Layer-scan lengths of at least 2: Qwen3 scans single layers, Qwen3.5 groups of 4
# (a one-group scan is compiled as straight-line code, off the affine line).
DEPTHS = {"qwen3": "2,4", "qwen3.5": "8,12"}


def run_config(name: str, mesh=None, microbatches=None, lora_rank: int = 0, remat: bool = True):
    """The MLE-Dojo config of `name`, optionally on another mesh / micro-batch count,
    with LoRA adapters of `lora_rank` (0: none), without remat if not `remat`."""
    config = importlib.import_module(CONFIGS[name]).get_config()
    config.unlock()
    if mesh is not None:
        config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
    if microbatches is not None:
        config.train.num_microbatches = microbatches
    config.train.lora.rank = lora_rank
    config.train.remat = config.train.remat and remat
    return config


def at_depth(arch, layers: int):
    """`arch` with its first `layers` layers (Qwen3.5: its layer types cut alike)."""
    fields = {"num_hidden_layers": layers}
    if hasattr(arch, "layer_types"):
        fields["layer_types"] = arch.layer_types[:layers]
    return dataclasses.replace(arch, **fields)


def _stats(compiled) -> dict:
    m = compiled.memory_analysis()
    return {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
    }


def _abstract(tree, shardings):
    import jax

    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def abstract_model(arch, config):
    """(graphdef, params as `jax.ShapeDtypeStruct`s) of `arch` in the config's dtype, with
    the config's LoRA adapters (`train.lora`) if any: made, small, then only their shapes
    kept."""
    import jax
    import jax.numpy as jnp

    from wmrl_jax.models import api, lora
    from wmrl_jax.train.config import lora_settings

    graphdef, shapes = api.abstract_split(arch, jnp.dtype(config.agent.text.dtype))
    adapters = lora_settings(config)
    if adapters:
        graphdef, shapes = lora.attach(graphdef, shapes, **adapters, key=jax.random.key(0))
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), shapes)
    return graphdef, shapes


def compile_train(arch, config, mesh) -> dict:
    """Memory analysis of the config's train step for `arch` on `mesh` (abstract arrays)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from wmrl_jax.train import builder, loss
    from wmrl_jax.train import state as state_lib
    from wmrl_jax.train import step as step_lib

    graphdef, shapes = abstract_model(arch, config)
    optimizer = state_lib.make_optimizer(builder.optimizer_config(config))
    kl = config.train.loss.kl_coef
    state = jax.eval_shape(lambda p: state_lib.init_train_state(p, optimizer, kl_coef=kl), shapes)
    step = step_lib.make_train_step(graphdef, optimizer, config.train, mesh)
    state = _abstract(state, step.state_shardings(state))
    rows = config.tasks_per_step * config.group_size
    tokens = config.agent.text.max_prompt_tokens + config.agent.text.max_new_tokens
    batch = {
        k: jax.ShapeDtypeStruct((rows, tokens) if rank == 2 else (rows,), dtype, sharding=s)
        for (k, (rank, dtype)), s in zip(
            loss.batch_spec(config.train).items(), step.batch_shardings.values(), strict=True
        )
    }
    key = jax.ShapeDtypeStruct(
        (), jax.random.key(0).dtype, sharding=NamedSharding(mesh, PartitionSpec())
    )
    start = time.perf_counter()
    compiled = step.lower(state, batch, key).compile()
    return {**_stats(compiled), "compile_s": time.perf_counter() - start}


def compile_sampler(arch, config, mesh, rows: int, *, hlo: bool = False) -> dict:
    """Memory analysis of one rollout generation (prefill + decode) of `rows` sequences.

    `hlo`: also the compiled program's text (per-device shapes), under "hlo".
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from wmrl_jax.models import sampler, sharding
    from wmrl_jax.train import state as state_lib

    graphdef, shapes = abstract_model(arch, config)
    # As the trainer places them: by the partition rules, keyed on each param's name.
    params = _abstract(shapes, state_lib.tree_shardings(shapes, mesh))
    text = config.agent.text
    prompt = text.max_prompt_tokens
    ids = NamedSharding(mesh, sharding.batch_spec((rows, prompt), mesh))
    prompt_ids = jax.ShapeDtypeStruct((rows, prompt), jnp.int32, sharding=ids)
    key = jax.ShapeDtypeStruct(
        (), jax.random.key(0).dtype, sharding=NamedSharding(mesh, PartitionSpec())
    )
    start = time.perf_counter()
    lowered = sampler._sample.lower(
        graphdef, params, prompt_ids, prompt_ids, key, max_new_tokens=text.max_new_tokens,
        temperature=float(text.temperature), top_k=0, top_p=float(text.top_p), greedy=False,
        stop_ids=(0,), pad_id=0, mesh=mesh, num_samples=1,
    )  # fmt: skip
    compiled = lowered.compile()
    out = {**_stats(compiled), "compile_s": time.perf_counter() - start}
    return {**out, "hlo": compiled.as_text()} if hlo else out


def plan_numbers(arch, config, device: str, gen_rows: int | None = None) -> dict:
    """The memory plan's per-device numbers in the compiler's terms.

    `gen_rows`: rollout rows per device (default: the plan's); given, so that every
    depth generates as many rows as the full depth's plan.
    """
    from wmrl_jax.train import memory

    sizes = {a: int(config.mesh[a]) for a in memory.AXES}
    target = memory.named_device(device, math.prod(sizes.values()))
    if sizes["fsdp"] * sizes["data"] * sizes["tensor"] == 1:  # one H200, as documented
        target = dataclasses.replace(target, usable=target.total * SINGLE_FRACTION - memory.RESERVE)
    p = memory.plan(arch, memory.workload_from_config(config), sizes, target)
    resident = p.resident
    # The params: the base and, under LoRA, the adapters (only they have moments).
    params = sum(v for k, v in resident.items() if k.startswith(("params", "LoRA adapters")))
    state = params + resident["optimizer (AdamW mu, nu)"]
    gathered = resident.get(memory.GATHERED, 0)
    rows = gen_rows or p.batch_sizes()["rollout"] // p.batch_devices
    return {
        "train_state": state,
        "train_temporaries": p.grads + p.scan_view + gathered + p.train_rows * p.train_row,
        "train_peak": p.train_peak,
        "train_rows": p.train_rows,
        "gen_rows": rows,
        "gen_params": params,
        "gen_temporaries": rows * p.gen_row + p.gen_gathered,
        "fits": p.fits,
    }


def extrapolate(at: dict, depths: tuple[int, int], full: int) -> dict:
    """Each number affine in depth through the two compiled depths, evaluated at `full`."""
    (a, b), (x, y) = depths, (at[depths[0]], at[depths[1]])
    out = {}
    for k, v in y.items():
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "compile_s":
            out[k] = v + (v - x[k]) * (full - b) / (b - a)
    return out


def measure(
    name: str, target: str, depths, parts, mesh_shape, microbatches, devices, device, saved=None,
    lora_rank: int = 0, remat: bool = True,
):  # fmt: skip
    """Compiler and plan numbers of one model and mesh, at each depth and extrapolated.

    `saved(out)` is called after each depth with what is known so far.
    """
    from wmrl_jax.models import architectures, sharding

    arch = architectures.get(name)
    config = run_config(name, mesh_shape, microbatches, lora_rank, remat)
    sizes = tuple(int(config.mesh[a]) for a in ("data", "fsdp", "tensor"))
    mesh = sharding.make_mesh(*sizes, devices=devices[: math.prod(sizes)])
    out = {"model": name, "mesh": sizes, "microbatches": config.train.num_microbatches,
           "target": target, "layers": arch.num_hidden_layers, "depths": {}}  # fmt: skip
    if lora_rank:
        out["lora_rank"] = lora_rank
    if not config.train.remat:
        out["remat"] = False
    out["full_plan"] = plan_numbers(arch, config, device)
    rows = out["full_plan"]["gen_rows"]
    for depth in depths:
        small = at_depth(arch, depth)
        row = {"plan": plan_numbers(small, config, device, rows)}
        if "train" in parts:
            row["train"] = compile_train(small, config, mesh)
        if "rollout" in parts:
            row["rollout"] = compile_sampler(small, config, mesh, rows * sizes[0] * sizes[1])
        out["depths"][depth] = row
        print(f"  {name} mesh={sizes} depth {depth}: {_brief(row)}", flush=True)
        if saved:
            saved(out)
    if len(depths) >= 2:
        pair = tuple(depths[:2])
        for part in parts:
            at = {d: out["depths"][d][part] for d in pair}
            out.setdefault("full", {})[part] = extrapolate(at, pair, arch.num_hidden_layers)
        if len(depths) > 2:  # the third depth checks the affine model
            check = depths[2]
            out["check"] = {
                part: {k: v / out["depths"][check][part][k] for k, v in extrapolate(
                    {d: out["depths"][d][part] for d in pair}, pair, check).items() if
                    out["depths"][check][part][k]}
                for part in parts
            }  # fmt: skip
    if saved:  # with the full depth's numbers
        saved(out)
    return out


def _brief(row: dict) -> str:
    parts = [f"{p} temp {row[p]['temporaries'] / GIB:.2f} GiB ({row[p]['compile_s']:.0f} s)"
             for p in PARTS if p in row]  # fmt: skip
    return ", ".join(parts)


def per_layer(result: dict, part: str) -> tuple[float, float]:
    """Temporaries added per layer between the two compiled depths: (compiler, plan)."""
    (a, x), (b, y) = sorted(result["depths"].items(), key=lambda kv: int(kv[0]))[:2]
    key = "train_temporaries" if part == "train" else "gen_temporaries"
    span = int(b) - int(a)
    return (
        (y[part]["temporaries"] - x[part]["temporaries"]) / span,
        (y["plan"][key] - x["plan"][key]) / span,
    )


def _rows(r: dict):
    """(label, plan, compiler numbers, part, per-layer slopes) of each row of one result:
    the full depth where it was extrapolated, else each compiled depth."""
    for part in PARTS:
        if part in r.get("full", {}):
            yield "", r["full_plan"], r["full"][part], part, per_layer(r, part)
            continue
        for depth, row in r["depths"].items():
            if part in row:
                yield f" ({depth} of {r['layers']} layers)", row["plan"], row[part], part, None


def run_label(result: dict) -> str:
    """What sets a run apart from its config: " + LoRA r<rank>", ", no remat"."""
    lora = f" + LoRA r{result['lora_rank']}" if result.get("lora_rank") else ""
    return lora + (", no remat" if result.get("remat") is False else "")


def table(results: list[dict]) -> str:
    """The plan-versus-compiler table (Markdown), per device, full depth."""
    head = (
        "| model | mesh, micro-batches | part | compiler args / temp GiB | plan state / temp GiB "
        "| plan / compiler: args, temp, peak | temp per layer GiB: compiler, plan |"
        "\n|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in results:
        for label, plan, c, part, slopes in _rows(r):
            key = "train" if part == "train" else "gen"
            p_args = plan["train_state"] if part == "train" else plan["gen_params"]
            p_temp = plan[f"{key}_temporaries"]
            c_peak = c["arguments"] + c["outputs"] - c["aliased"] + c["temporaries"]
            slope = f"{slopes[0] / GIB:.2f}, {slopes[1] / GIB:.2f}" if slopes else "-"
            lines.append(
                f"| {r['model']}{run_label(r)}{label} "
                f"| {'x'.join(map(str, r['mesh']))}, {r['microbatches']} "
                f"| {part} "
                f"| {c['arguments'] / GIB:.1f} / {c['temporaries'] / GIB:.1f} "
                f"| {p_args / GIB:.1f} / {p_temp / GIB:.1f} "
                f"| {p_args / c['arguments']:.2f}, {p_temp / c['temporaries']:.2f}, "
                f"{(p_args + p_temp) / c_peak:.2f} | {slope} |"
            )
    return "\n".join(lines)


def _save(path: str | None, done: list[dict], out: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump([*done, out], f, indent=1, default=str)


def load_results(spec: str) -> list[dict]:
    """Results of earlier `--json` runs: "a.json,b.json:train" (b's train parts only)."""
    results = []
    for item in spec.split(","):
        path, _, keep = item.partition(":")
        with open(path) as f:
            for r in json.load(f):
                if keep:
                    parts = set(keep.split("+"))
                    r["full"] = {p: v for p, v in r.get("full", {}).items() if p in parts}
                    r["depths"] = {d: {k: v for k, v in row.items() if k == "plan" or k in parts}
                                   for d, row in r["depths"].items()}  # fmt: skip
                results.append(r)
    return results


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="h200", choices=aot_targets.TARGETS)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument(
        "--depths", default="", help="two (or three: a check) depths; default 2,4 (Qwen3), 8,12"
    )
    parser.add_argument("--meshes", default="config,single", help="config: 8 devices; single: one")
    parser.add_argument("--lora-rank", type=int, default=0, help="train with LoRA adapters")
    parser.add_argument("--no-remat", action="store_true", help="train without remat")
    parser.add_argument(
        "--microbatches", type=int, default=0, help="instead of the config's (or SINGLE's)"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--readme", default=None, help="rewrite its --section")
    parser.add_argument(
        "--section", default="aot", help="the README's marked section the table goes to"
    )
    parser.add_argument(
        "--from-json", default="", help="comma list of earlier runs' PATH[:part+part] to tabulate"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        return report(load_results(args.from_json), args)
    # Nothing runs: JAX's own arrays (keys) stay on the host, whatever the target.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.target == "cpu":
        aot_targets.force_host_devices(8)
    devices = aot_targets.target_devices(args.target, 8)
    parts = [p for p in args.parts.split(",") if p]
    device = "h100" if args.target == "h100" else "h200"
    results = []
    for name in args.models.split(","):
        for which in args.meshes.split(","):
            mesh, micro = ((1, 1, 1), SINGLE[name]) if which == "single" else (None, None)
            micro = args.microbatches or micro
            depths = [int(d) for d in (args.depths or DEPTHS[name.split("-")[0]]).split(",")]

            done = list(results)
            results.append(
                measure(
                    name, args.target, depths, parts, mesh, micro, devices, device,
                    functools.partial(_save, args.json, done), lora_rank=args.lora_rank,
                    remat=not args.no_remat,
                )
            )  # fmt: skip
    return report(results, args)


def report(results: list[dict], args) -> list[dict]:
    """Prints the table and, with `--readme`, writes it into the README's aot section."""
    body = table(results)
    print(body)
    if args.readme:
        from wmrl_jax.readme import write_section

        targets = sorted({r["target"] for r in results})
        depths = "; ".join(
            f"{r['model']} {'x'.join(map(str, r['mesh']))}: {','.join(map(str, r['depths']))}"
            for r in results
        )
        note = f"Target: {', '.join(targets)}. Compiled depths (of full width): {depths}."
        write_section(args.readme, args.section, f"{note}\n\n{body}")
    return results


if __name__ == "__main__":
    main()
