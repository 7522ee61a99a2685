"""Throughput of `inverse_variance_fuse` against a plain memory copy.

    python -m benchmarks.fusion [--sizes 1e3,1e6] [--repeats 7] [--max-gb 2] [--json PATH]

Fusion is elementwise and memory bound, so the natural anchor is a copy of
the same arrays on the same device: a jitted `jnp.copy` (input not donated, so
XLA must write a new buffer) and numpy's `np.copyto` into a preallocated array.
Bytes moved count reads and writes: fusion reads 4 float32 arrays and writes 2,
a copy reads 1 and writes 1. The ratio is fusion GB/s over copy GB/s: 1.0 means
fusion runs at copy speed; below 1 means its arithmetic, or the per-call
dispatch overhead at small sizes, costs more than the memory traffic.

Timing: one warm-up call (compilation excluded), then each repeat times enough
back-to-back calls to last at least `MIN_REPEAT_SECONDS`, each call waited on
with `block_until_ready`; the median over repeats is reported.
"""

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.core.fusion import inverse_variance_fuse

DEFAULT_SIZES = (10**3, 10**4, 10**5, 10**6, 10**7, 5 * 10**7, 10**8)
MIN_REPEAT_SECONDS = 0.02
BYTES = np.dtype(np.float32).itemsize
# Live float32 arrays per element: 4 fusion inputs + 2 outputs, the jax copy's
# output and numpy's copy destination.
ARRAYS_PER_ELEMENT = 8


def median_seconds(fn: Callable[[], object], *, repeats: int) -> float:
    """Median wall time of one call of `fn` over `repeats` timed batches."""
    fn()  # warm-up: compilation and first-touch page faults stay out of the timing
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= MIN_REPEAT_SECONDS:
            break
        calls = max(2 * calls, int(calls * 1.2 * MIN_REPEAT_SECONDS / max(elapsed, 1e-9)))
    times = [elapsed / calls]
    for _ in range(repeats - 1):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure(size: int, *, repeats: int, rng: np.random.Generator) -> dict:
    """Times fusion, jitted copy and numpy copy on float32 arrays of `size` elements."""
    a, b = (rng.standard_normal(size, dtype=np.float32) for _ in range(2))
    var_a, var_b = (rng.uniform(0.1, 2.0, size).astype(np.float32) for _ in range(2))
    args = [jax.device_put(x) for x in (a, var_a, b, var_b)]
    fuse = jax.jit(inverse_variance_fuse)
    copy = jax.jit(jnp.copy)
    copied = copy(args[0])
    # Guard the anchor: a copy that aliased its input would time nothing.
    assert copied.unsafe_buffer_pointer() != args[0].unsafe_buffer_pointer()
    del copied
    dst = np.empty_like(a)

    fuse_s = median_seconds(lambda: jax.block_until_ready(fuse(*args)), repeats=repeats)
    copy_s = median_seconds(lambda: jax.block_until_ready(copy(args[0])), repeats=repeats)
    np_copy_s = median_seconds(lambda: np.copyto(dst, a), repeats=repeats)

    fuse_gbps = 6 * BYTES * size / fuse_s / 1e9
    copy_gbps = 2 * BYTES * size / copy_s / 1e9
    np_copy_gbps = 2 * BYTES * size / np_copy_s / 1e9
    return dict(
        size=size,
        fuse_ms=fuse_s * 1e3,
        fuse_gbps=fuse_gbps,
        jax_copy_ms=copy_s * 1e3,
        jax_copy_gbps=copy_gbps,
        np_copy_ms=np_copy_s * 1e3,
        np_copy_gbps=np_copy_gbps,
        ratio_vs_jax_copy=fuse_gbps / copy_gbps,
        ratio_vs_np_copy=fuse_gbps / np_copy_gbps,
    )


def run(sizes: Sequence[int], *, repeats: int = 7, max_gb: float = 2.0, seed: int = 0) -> dict:
    """Measures every size that fits in `max_gb`; returns metadata, rows and skipped sizes."""
    rng = np.random.default_rng(seed)
    rows, skipped = [], []
    for size in sizes:
        if ARRAYS_PER_ELEMENT * BYTES * size > max_gb * 1e9:
            skipped.append(size)
            continue
        rows.append(measure(size, repeats=repeats, rng=rng))
    meta = dict(
        jax=jax.__version__,
        device=str(jax.devices()[0]),
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        repeats=repeats,
        max_gb=max_gb,
    )
    return dict(meta=meta, rows=rows, skipped=skipped)


def format_table(result: dict) -> str:
    header = (
        f"{'elements':>10} {'fuse ms':>9} {'fuse GB/s':>9} {'jcopy ms':>9} {'jcopy GB/s':>10} "
        f"{'npcopy ms':>9} {'npcopy GB/s':>11} {'fuse/jcopy':>10} {'fuse/npcopy':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in result["rows"]:
        lines.append(
            f"{r['size']:>10.0e} {r['fuse_ms']:>9.4f} {r['fuse_gbps']:>9.2f} "
            f"{r['jax_copy_ms']:>9.4f} {r['jax_copy_gbps']:>10.2f} {r['np_copy_ms']:>9.4f} "
            f"{r['np_copy_gbps']:>11.2f} {r['ratio_vs_jax_copy']:>10.2f} "
            f"{r['ratio_vs_np_copy']:>11.2f}"
        )
    meta = result["meta"]
    lines.append(
        f"jax {meta['jax']} on {meta['device']}, {meta['cpu_count']} CPUs; "
        f"median of {meta['repeats']} repeats; GB/s counts bytes read + written."
    )
    if result["skipped"]:
        sizes = ", ".join(f"{s:.0e}" for s in result["skipped"])
        lines.append(f"skipped (over --max-gb {meta['max_gb']}): {sizes}")
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    return [int(float(s)) for s in text.split(",") if s.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(DEFAULT_SIZES),
        help="comma-separated element counts, e.g. 1e3,1e6",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per measurement")
    parser.add_argument(
        "--max-gb", type=float, default=2.0, help="skip sizes whose arrays exceed this many GB"
    )
    parser.add_argument("--json", default=None, help="also write the table to this JSON file")
    args = parser.parse_args(argv)
    result = run(args.sizes, repeats=args.repeats, max_gb=args.max_gb)
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
