"""Compile targets without their hardware: a GPU described by its properties, or host CPUs.

XLA's GPU compiler needs only a description of the device (compute capability,
SM count, memory, caches) to compile, not the device: the CUDA PJRT plugin
(`pip install --no-deps jax-cuda12-plugin==$JAX jax-cuda12-pjrt==$JAX`, no CUDA
libraries, no driver) builds a compile-only topology from a
`stream_executor.GpuTargetConfigProto` given as text, and
`jax.jit(f).lower(...).compile()` on a mesh of its devices runs the whole GPU
pipeline (fusion, the latency-hiding scheduler, buffer assignment), so
`compiled.memory_analysis()` is what the GPU would allocate. Nothing is run.

The CPU target is the fallback: 8 host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set before JAX starts)
compile the same sharded program with the CPU backend's fusion and scheduling,
which differ from the GPU's; its memory analysis is the CPU's.

Example:
    >>> devices = target_devices("h200", 8)     # compile-only H200s
    >>> mesh = sharding.make_mesh(1, 8, 1, devices=devices)
"""

from __future__ import annotations

import os

# Published properties of each GPU (the numbers XLA's cost models and emitters read).
_GPUS = {
    "h100": dict(
        name="NVIDIA H100 80GB HBM3", memory=85_520_809_984, bandwidth=3_350_000_000_000,
        clock_ghz=1.98, cores=132,
    ),
    "h200": dict(
        name="NVIDIA H200", memory=151_397_597_184, bandwidth=4_800_000_000_000,
        clock_ghz=1.98, cores=132,
    ),
}  # fmt: skip
GPU_TARGETS = tuple(_GPUS)
TARGETS = (*GPU_TARGETS, "cpu")


def gpu_target_config(name: str) -> str:
    """The `GpuTargetConfigProto` text of a Hopper GPU ("h100" or "h200", sm_90)."""
    g = _GPUS[name]
    info = {
        "threads_per_block_limit": 1024,
        "threads_per_warp": 32,
        "shared_memory_per_block": 49152,
        "shared_memory_per_core": 233472,
        "shared_memory_per_block_optin": 232448,
        "threads_per_core_limit": 2048,
        "core_count": g["cores"],
        "fpus_per_core": 128,
        "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": g["bandwidth"],
        "l2_cache_size": 50 * 2**20,
        "clock_rate_ghz": g["clock_ghz"],
        "device_memory_size": g["memory"],
        "registers_per_core_limit": 65536,
        "registers_per_block_limit": 65536,
    }
    fields = "\n".join(f"  {k}: {v}" for k, v in info.items())
    return (
        f"gpu_device_info {{\n{fields}\n  cuda_compute_capability {{ major: 9 minor: 0 }}\n}}\n"
        'platform_name: "CUDA"\n'
        "dnn_version_info { major: 9 minor: 8 patch: 0 }\n"
        f'device_description_str: "{g["name"]}"\n'
    )


def target_devices(target: str, count: int) -> list:
    """`count` devices to compile for: compile-only GPUs of `target`, or host CPUs.

    Raises:
        ValueError: an unknown target; for a GPU target, no CUDA plugin (the
            message says what to install); for "cpu", fewer host devices than
            `count` (XLA_FLAGS must force them before JAX starts).
    """
    import jax

    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    if target == "cpu":
        devices = jax.devices("cpu")
        if len(devices) < count:
            raise ValueError(
                f"{len(devices)} host CPU devices, need {count}: start with "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={count}"
            )
        return devices[:count]
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            platform="cuda", topology_name="", topology=f"1x1x{count}",
            target_config=gpu_target_config(target),
        )  # fmt: skip
    except Exception as e:  # no plugin: jax raises RuntimeError or KeyError by version
        raise ValueError(
            f"cannot compile for {target} without a GPU: {str(e).splitlines()[0]}; install "
            f"the CUDA plugin (pip install --no-deps jax-cuda12-plugin=={jax.__version__} "
            f"jax-cuda12-pjrt=={jax.__version__}) or use --target=cpu"
        ) from None
    return list(topology.devices)


def force_host_devices(count: int) -> None:
    """Asks XLA for `count` host CPU devices (only before JAX initialises its backends)."""
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
