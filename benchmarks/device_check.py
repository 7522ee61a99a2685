"""The first measurements on a lent accelerator, each written as JSON under one directory.

    python -m benchmarks.device_check --out results/h200           # on the GPU (~6 min)
    python -m benchmarks.device_check --out /tmp/check --quick     # tiny shapes, a CPU

`launch/device_check.sh DIR` runs this, then the GPU sandbox check. Each check
reuses a benchmark of this folder and writes `<check>.json` (its own payload,
plus what is derived here); a check that fails writes its error instead and
the others still run. `summary.json` lists every check with its status.

* `train_qwen3`, `train_qwen3_5`: `benchmarks.train_step` at Qwen3-1.7B and
  Qwen3.5-0.8B shapes in bfloat16 with remat: tokens/s, MFU against
  `--peak-tflops`, and the allocator's peak bytes beside the memory plan's
  train peak for the same run (`plan_over_peak`).
* `sampler`: `benchmarks.sampler` (Qwen3-0.6B shapes, float32 as that
  benchmark runs, batch 1 / 16 / 64) against the memory-bandwidth bound of the
  same shape: each decode step reads every param and the cache once, so
  tokens/s <= batch x bandwidth / (param bytes + batch x cache bytes).
* `gated_delta`: `benchmarks.gated_delta`'s kernel table (the chunked Gated
  DeltaNet against its token-by-token recurrent reference), at 2,048 and 8,192
  tokens, plus its model and decode tables.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
import traceback

import jax

# Peak dense bf16 TFLOP/s and HBM bytes/s of the accelerators we plan for.
PEAKS = {"h200": (989.0, 4.8e12), "h100": (989.0, 3.35e12)}


def _device_name() -> str:
    kind = jax.devices()[0].device_kind.lower()
    return next((name for name in PEAKS if name in kind), "cpu")


def decode_bound(preset: dict, batch: int, slots: int, dtype_bytes: int, bandwidth: float):
    """Tokens/s a decode step cannot beat: weights and the batch's caches read once per token."""
    from wmrl_jax import models
    from wmrl_jax.models import memory

    config = models.config_from_dict(models.qwen3_config_dict(**preset))
    weights = memory.param_count(config) * dtype_bytes
    cache = memory.cache_bytes_per_row(config, slots, dtype_bytes)
    return batch * bandwidth / (weights + batch * cache)


def check_train(preset: str, quick: bool, out: str, peak_tflops: float) -> dict:
    from benchmarks import train_step

    argv = ["--preset", "qwen3_5_tiny" if quick and "5" in preset else "tiny" if quick else preset]
    argv += ["--remat", "--repeats", "1" if quick else "3", "--peak-tflops", str(peak_tflops)]
    payload = train_step.main([*argv, "--json", out])
    if payload.get("peak_bytes"):
        payload["plan_over_peak"] = payload["plan_bytes"] / payload["peak_bytes"]
    return payload


def check_sampler(quick: bool, out: str, bandwidth: float) -> dict:
    from benchmarks import forward, sampler

    preset = "tiny" if quick else "qwen3_0p6b"
    prompt, new = (8, 4) if quick else (64, 64)
    argv = ["--preset", preset, "--skip", "torch,tunix", "--prompt", str(prompt), "--new", str(new)]
    argv += ["--batches", "2" if quick else "1,16,64", "--repeats", "1" if quick else "3"]
    payload = sampler.main([*argv, "--json", out])
    for row in payload["rows"]:
        if "tokens_per_s" in row:  # the benchmark decodes in float32
            bound = decode_bound(forward.PRESETS[preset], row["batch"], prompt + new, 4, bandwidth)
            row.update(bound_tokens_per_s=bound, fraction_of_bound=row["tokens_per_s"] / bound)
    return payload


def check_gated_delta(quick: bool, out: str) -> dict:
    from benchmarks import gated_delta

    if quick:  # the kernel table only, at one short length
        return {"kernel": gated_delta.kernel_table([128], 1, {"torch"})}
    argv = ["--seqs", "2048,8192", "--skip", "torch", "--repeats", "3", "--json", out]
    gated_delta.main(argv)
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the JSON results")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a CPU fallback)")
    parser.add_argument("--only", default="", help="comma list of checks to run")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    device = _device_name()
    peak_tflops, bandwidth = PEAKS.get(device, PEAKS["h200"])
    checks = {
        "train_qwen3": lambda out: check_train("qwen3_1p7b", args.quick, out, peak_tflops),
        "train_qwen3_5": lambda out: check_train("qwen3_5_0p8b", args.quick, out, peak_tflops),
        "sampler": lambda out: check_sampler(args.quick, out, bandwidth),
        "gated_delta": lambda out: check_gated_delta(args.quick, out),
    }
    only = {c for c in args.only.split(",") if c}
    summary = {"device": jax.devices()[0].device_kind, "count": jax.device_count(),
               "quick": args.quick, "checks": {}}  # fmt: skip
    for name, run in checks.items():
        if only and name not in only:
            continue
        out = os.path.join(args.out, f"{name}.json")
        start = time.perf_counter()
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):
                payload = run(out)
            status = "ok"
        except Exception as e:  # one failed check must not stop the others
            payload, status = {"error": f"{type(e).__name__}: {e}"}, "failed"
            log.write(traceback.format_exc())
        payload["log"] = log.getvalue()[-4000:]
        with open(out, "w") as f:
            json.dump(payload, f, indent=1, default=str)
        summary["checks"][name] = {"status": status, "seconds": time.perf_counter() - start}
        print(f"{name}: {status} ({summary['checks'][name]['seconds']:.0f} s)", flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
