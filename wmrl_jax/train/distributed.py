"""Multi-host training: `jax.distributed` from the config or the launcher's environment.

One trainer process per host; every process runs the same program. Where the
coordinator, the process count and this process's id come from, first match
wins (`resolve`):

1. the config (`config.distributed`: `coordinator`, `num_processes`, `process_id`);
2. `WMRL_COORDINATOR` / `WMRL_NUM_PROCESSES` / `WMRL_PROCESS_ID`;
3. a Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` is the process id, with
   `WMRL_COORDINATOR` (the index-0 pod's stable name) and `WMRL_NUM_PROCESSES`
   (the Job's completions) from the manifest (`launch/k8s/trainer.yaml`);
4. SLURM (one task per host, `launch/slurm/train.sbatch`): `SLURM_PROCID`,
   `SLURM_NTASKS`, the first host of `SLURM_STEP_NODELIST` (or
   `SLURM_JOB_NODELIST`) as coordinator, on a port derived from `SLURM_JOB_ID`
   so that two jobs sharing a host do not collide;
5. otherwise one process (no `jax.distributed` at all).

After `initialize`, `jax.devices()` lists every process's devices, so the
(data, fsdp, tensor) mesh of `state.make_mesh_from_config` spans all hosts
(devices are ordered by process: the batch rows of one process are
contiguous). Each process loads only its rows (`process_rows`) and
`global_batch` assembles the global arrays the train step takes. Every
process takes part in orbax saves and restores (orbax writes the JSON
metadata from process 0 only); files of our own (metrics, exports, reports)
are written by process 0 (`is_primary`, `write_on_primary`), and what must
happen once (executing anchors) happens there too, its results sent to the
others (`broadcast_from_primary`).

Example:
    >>> spec = initialize(resolve(config.distributed))    # before any other JAX call
    >>> mesh = state.make_mesh_from_config(config.mesh)   # all processes' devices
    >>> rows = process_rows(step.batch_shardings["tokens"], global_rows=B)
    >>> batch = global_batch(load(rows), step.batch_shardings, global_rows=B)
"""

import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

__all__ = [
    "ProcessSpec",
    "barrier",
    "broadcast_from_primary",
    "default_config",
    "expand_hostlist",
    "global_batch",
    "initialize",
    "is_primary",
    "process_rows",
    "resolve",
    "write_on_primary",
]

DEFAULT_PORT = 61234
# SLURM: the coordinator port is DEFAULT_PORT + job id mod this (jobs sharing a host differ).
SLURM_PORT_SPREAD = 2000


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """Where this process sits among the trainer's processes.

    Attributes:
        num_processes: trainer processes in all (1: no `jax.distributed`).
        process_id: this process, in [0, num_processes).
        coordinator: "host:port" of process 0's coordinator service (None when single).
        source: what it was read from: "single", "config", "env", "kubernetes", "slurm".
    """

    num_processes: int = 1
    process_id: int = 0
    coordinator: str | None = None
    source: str = "single"

    def __post_init__(self):
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"bad process layout from {self.source}: process_id {self.process_id} of "
                f"{self.num_processes} processes"
            )
        if self.num_processes > 1 and not _host_port(self.coordinator):
            raise ValueError(
                f"{self.num_processes} processes (from {self.source}) need a coordinator "
                f"'host:port', got {self.coordinator!r}"
            )


def default_config() -> ml_collections.ConfigDict:
    """`config.distributed`: empty / 0 / -1 fields are read from the environment."""
    return ml_collections.ConfigDict(
        dict(
            coordinator="",  # "host:port" of process 0
            num_processes=0,
            process_id=-1,
            port=DEFAULT_PORT,  # for a coordinator given without a port (and SLURM's base)
            initialization_timeout_s=300,
        )
    )


def expand_hostlist(text: str) -> list[str]:
    """Expands a SLURM host list: "gpu[01-03,07],cpu-a1" -> gpu01 gpu02 gpu03 gpu07 cpu-a1.

    Raises:
        ValueError: unbalanced brackets or a bad range.
    """
    hosts, depth, start = [], 0, 0
    items = []
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
        if depth not in (0, 1):
            raise ValueError(f"bad SLURM host list: {text!r}")
    if depth:
        raise ValueError(f"bad SLURM host list: {text!r}")
    for item in filter(None, items):
        match = re.fullmatch(r"([^\[\]]*)(?:\[([^\[\]]+)\]([^\[\]]*))?", item)
        if match is None:
            raise ValueError(f"bad SLURM host list item {item!r} in {text!r}")
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
                raise ValueError(f"bad range {part!r} in SLURM host list {text!r}")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    return hosts


def _host_port(address: str | None) -> bool:
    return bool(address) and re.fullmatch(r"\[?[^\s\[\]]+\]?:\d{1,5}", address) is not None


def _with_port(address: str, port: int) -> str:
    """`address` with `port` appended unless it names one ("" stays "")."""
    if not address or re.search(r":\d{1,5}$", address):
        return address
    return f"{address}:{port}"


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError as e:
        raise ValueError(f"{name} must be an integer, got {environ[name]!r}") from e


def resolve(config=None, environ: Mapping[str, str] | None = None) -> ProcessSpec:
    """The `ProcessSpec` from `config` (a `default_config()`-like dict) or the environment.

    Raises:
        ValueError: an incomplete or inconsistent layout (e.g. a process id but no
            coordinator), with the variables it was read from.
    """
    environ = os.environ if environ is None else environ
    config = default_config() if config is None else config
    port = int(config.get("port", DEFAULT_PORT))
    if config.get("coordinator") or int(config.get("num_processes", 0) or 0) > 1:
        return ProcessSpec(
            num_processes=int(config.num_processes),
            process_id=int(config.process_id),
            coordinator=_with_port(config.coordinator, port) if config.coordinator else None,
            source="config",
        )
    if "WMRL_PROCESS_ID" in environ or "JOB_COMPLETION_INDEX" in environ:
        explicit = "WMRL_PROCESS_ID" in environ  # wins over a Job's index
        if "WMRL_NUM_PROCESSES" not in environ:
            raise ValueError(
                "WMRL_NUM_PROCESSES must be set with "
                + ("WMRL_PROCESS_ID" if explicit else "a Kubernetes Indexed Job's index")
                + " (and WMRL_COORDINATOR, process 0's host:port)"
            )
        return ProcessSpec(
            num_processes=_int(environ, "WMRL_NUM_PROCESSES"),
            process_id=_int(environ, "WMRL_PROCESS_ID" if explicit else "JOB_COMPLETION_INDEX"),
            coordinator=_with_port(environ.get("WMRL_COORDINATOR", ""), port) or None,
            source="env" if explicit else "kubernetes",
        )
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise ValueError(
                "SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"
            )
        job = _int(environ, "SLURM_JOB_ID") if "SLURM_JOB_ID" in environ else 0
        return ProcessSpec(
            num_processes=_int(environ, "SLURM_NTASKS"),
            process_id=_int(environ, "SLURM_PROCID"),
            coordinator=f"{expand_hostlist(nodelist)[0]}:{port + job % SLURM_PORT_SPREAD}",
            source="slurm",
        )
    if int(environ.get("WMRL_NUM_PROCESSES", "1") or 1) > 1:
        raise ValueError("WMRL_NUM_PROCESSES > 1 needs WMRL_PROCESS_ID (or a launcher's id)")
    return ProcessSpec()


def initialize(spec: ProcessSpec, *, timeout_s: int = 300) -> ProcessSpec:
    """Starts `jax.distributed` for `spec` (nothing for one process); call it before any
    other JAX call. Returns `spec`.

    Raises:
        RuntimeError: JAX's backends are already up (too late to join), or the
            coordinator did not answer in `timeout_s`.
    """
    if spec.num_processes == 1:
        return spec
    jax.distributed.initialize(
        coordinator_address=spec.coordinator,
        num_processes=spec.num_processes,
        process_id=spec.process_id,
        initialization_timeout=int(timeout_s),
    )
    if jax.process_count() != spec.num_processes:
        raise RuntimeError(f"joined {jax.process_count()} processes, expected {spec.num_processes}")
    return spec


def is_primary() -> bool:
    """Whether this is process 0: the one that writes metrics, reports and exports."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier `name` (no-op for one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def broadcast_from_primary(tree):
    """Process 0's value of a pytree of numpy arrays, on every process.

    For what only process 0 may do once, e.g. executing the anchors in the
    sandbox (every process submitting would run each program once per host
    and count it as often in the ledger): process 0 executes, the others
    pass arrays of the same shapes and dtypes and receive its results.
    """
    if jax.process_count() == 1:
        return tree
    return multihost_utils.broadcast_one_to_all(tree, is_source=is_primary())


def write_on_primary(path: str | os.PathLike, data: bytes | str) -> bool:
    """Atomically writes `data` to `path` on process 0 only; returns whether it wrote."""
    if not is_primary():
        return False
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
    return True


def process_rows(sharding: jax.sharding.Sharding, global_rows: int) -> slice:
    """The contiguous rows (dim 0) of a [global_rows, ...] batch this process holds.

    Args:
        sharding: the batch's sharding (e.g. `TrainStep.batch_shardings["tokens"]`).
        global_rows: B, the global batch size.

    Raises:
        ValueError: this process's rows are not one contiguous block (a mesh whose
            batch axes interleave processes).
    """
    spans = set()
    for index in sharding.addressable_devices_indices_map((global_rows,)).values():
        rows = index[0]
        spans.add((rows.start or 0, global_rows if rows.stop is None else rows.stop))
    start, stop = min(s for s, _ in spans), max(e for _, e in spans)
    covered = np.zeros(global_rows, bool)
    for s, e in spans:
        covered[s:e] = True
    if not covered[start:stop].all():
        raise ValueError(
            f"process {jax.process_index()} holds rows {sorted(spans)}: not contiguous"
        )
    return slice(start, stop)


def global_batch(local: Mapping, shardings: Mapping, *, global_rows: int) -> dict:
    """Global `jax.Array`s from each process's rows (`local[k]` of shape [rows, ...]).

    Args:
        local: this process's rows of every batch entry (numpy), `process_rows` of them.
        shardings: the batch's shardings by key (`TrainStep.batch_shardings`).
        global_rows: B, the global batch size.

    Returns:
        Arrays of shape [B, ...] with `shardings[k]`, ready for the train step.
    """
    out = {}
    for key, sharding in shardings.items():
        x = np.asarray(local[key])
        shape = (global_rows, *x.shape[1:])
        out[key] = jax.make_array_from_process_local_data(sharding, x, shape)
    return out
