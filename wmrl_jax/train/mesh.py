"""The mesh of a run checked against the devices present, and those devices' memory.

`check_mesh(config.mesh, jax.devices())` is what the trainer calls before it
builds its mesh, and what `--dry_run` calls when it plans for the devices of
this machine: the product of the (data, fsdp, tensor) axes must be the number of
devices, or a `ConfigError` names the fields, the devices and a mesh that fits.
`plan_run` is the whole of `--dry_run`: a config's memory plan on a named
accelerator or on the devices present.

Example:
    >>> sizes = check_mesh(config.mesh, jax.devices())     # {"data": 1, "fsdp": 8, ...}
    >>> device = device_memory(jax.devices())              # a `memory.Device`
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

from wmrl_jax.models import architectures
from wmrl_jax.train import memory
from wmrl_jax.train.config import ConfigError
from wmrl_jax.train.memory import AXES, GIB, RESERVE, Device, named_device


def device_memory(devices: Sequence) -> Device:
    """The memory of the devices present: the smallest allocator limit among this process's.

    CPU devices report no limit; they share this host's RAM.
    """
    import jax

    local = [d for d in devices if getattr(d, "process_index", 0) == jax.process_index()]
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in local or devices]
    if any(limit is None for limit in limits):
        return dataclasses.replace(named_device("cpu", len(devices)), name=devices[0].platform)
    limit = float(min(limits))
    note = f"the allocator's limit less {RESERVE / GIB:g} GiB"
    return Device(devices[0].device_kind, limit, limit - RESERVE, note)


def resolve_mesh(mesh_config, device_count: int) -> dict:
    """Axis sizes of `config.mesh`; one axis may be -1 (the devices the others leave)."""
    sizes = {a: int(mesh_config[a]) for a in AXES}
    if list(sizes.values()).count(-1) > 1 or any(s == 0 or s < -1 for s in sizes.values()):
        raise ConfigError(f"config.mesh sizes must be >= 1 (one may be -1), got {sizes}")
    for axis, size in sizes.items():
        if size == -1:
            sizes[axis] = max(device_count // math.prod(s for s in sizes.values() if s != -1), 1)
    return sizes


def check_mesh(mesh_config, devices: Sequence) -> dict:
    """Checks `config.mesh` against the devices present; returns its axis sizes.

    The product of the axes must equal the device count. On CPU a smaller mesh is
    allowed (tests force several host devices and use the first ones).

    Raises:
        ConfigError: naming the fields, the devices present, and a mesh that fits.
    """
    n = len(devices)
    sizes = resolve_mesh(mesh_config, n)
    need = math.prod(sizes.values())
    cpu_subset = need < n and all(d.platform == "cpu" for d in devices)
    if need != n and not cpu_subset:
        kinds = collections.Counter(
            d.platform if d.device_kind.lower() == d.platform else f"{d.platform} {d.device_kind}"
            for d in devices
        )
        present = ", ".join(f"{count} x {kind.strip()}" for kind, count in sorted(kinds.items()))
        shown = ", ".join(f"{name}={sizes[name]}" for name in AXES)
        others = sizes["data"] * sizes["tensor"]
        fix = f"config.mesh.fsdp={n // others}" if n % others == 0 else (
            f"config.mesh.data=1, config.mesh.fsdp={n}, config.mesh.tensor=1"
        )  # fmt: skip
        raise ConfigError(
            f"config.mesh ({shown}) needs {need} devices; {n} present "
            f"({present}); set {fix}, or an axis to -1 (the devices the others leave)"
        )
    return sizes


def plan_run(
    config, *, device: str = "", model: str = "", devices=None, **fields
) -> memory.MemoryPlan:
    """The memory plan of a text-agent training config, without weights or tasks.

    Args:
        config: a training config (`config.agent.kind` "text").
        device: a named accelerator (`memory.named_device`) for the config's mesh;
            "" plans for `devices` after `check_mesh`.
        model: a known architecture (`models.architectures`) or a checkpoint
            directory; "" reads `config.agent.text.checkpoint`'s config.json.
        devices: the devices present (default `jax.devices()`).
        **fields: `memory.Workload` fields the config does not hold (`unsharded_load`).

    Raises:
        ConfigError: no architecture, an unknown device, a mesh the devices cannot hold.
    """
    if config.agent.kind != "text":
        raise ConfigError(
            f"--dry_run plans text-agent runs, not config.agent.kind={config.agent.kind!r}"
        )
    source = model or config.agent.text.checkpoint
    if not source:
        raise ConfigError(
            f"--dry_run needs the architecture: --dry_run_model={'|'.join(architectures.names())} "
            "(or a checkpoint directory), or config.agent.text.checkpoint"
        )
    try:
        arch = architectures.resolve(source)
        if device:
            sizes = {a: int(config.mesh[a]) for a in AXES}
            if min(sizes.values()) < 1:
                raise ConfigError(f"--dry_run_device needs explicit config.mesh sizes, got {sizes}")
            target = named_device(device, mesh_devices=math.prod(sizes.values()))
        else:
            if devices is None:
                import jax

                devices = jax.devices()
            sizes = check_mesh(config.mesh, devices)
            target = device_memory(devices[: math.prod(sizes.values())])
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return memory.plan(arch, memory.workload_from_config(config, **fields), sizes, target)
