"""GPUs for sandboxed programs: what a container asks the engine for, and what it gets.

A `DockerExecutor` built with `gpus=...` passes the engine a device request
(`docker.types.DeviceRequest`, the API behind `docker run --gpus`) with the
capabilities `[["gpu"]]`; the engine hands it to its GPU driver, the NVIDIA
Container Toolkit's hook, which mounts the chosen device nodes and the host's
driver libraries into the container. The engine sets `NVIDIA_VISIBLE_DEVICES`
in the main process's spec only, not in the container's configured
environment that an exec inherits; the program runs through an exec, so the
executor sets the same value in the program's environment.

What is enforced and what is advisory:
- **Which devices** (enforced): only the requested device nodes exist in the
  container and the device cgroup allows no others. A count `n` gives devices
  `0..n-1` (the engine's rule), so concurrent programs asking for one GPU each
  share device 0 unless the executor hands out disjoint devices
  (`gpus_per_program`, see `GpuLeases`). A MIG instance named by its UUID
  (`MIG-...`) is a hardware slice: its memory and compute are enforced too.
- **GPU memory** (advisory): no engine caps GPU memory per container. With
  `gpu_memory_fraction=f` the program's environment carries
  `XLA_PYTHON_CLIENT_MEM_FRACTION=f` (JAX's allocator takes at most `f` of each
  device) and `WMRL_GPU_MEMORY_FRACTION=f` (for other frameworks, e.g.
  `torch.cuda.set_per_process_memory_fraction`, which has no environment
  variable); a program can override both.

Devices may also be named by CDI (`nvidia.com/gpu=0`, engines started with CDI
enabled): those requests go to the engine's "cdi" driver instead.

Where the engine has no GPU driver it answers a device request with `could not
select device driver "" with capabilities: [["gpu"]]` when the container
starts; `gpu_refusal` finds that out once, with a probe container, so that
every run can end as an `infra_error` saying so (never a silent CPU run).
"""

import collections
import contextlib
import dataclasses
import logging
import numbers
import re
import threading
from collections.abc import Iterator, Sequence

from wmrl_jax.sandbox.result import InfraError, Limits, MiB

log = logging.getLogger(__name__)

# A GPU program's defaults where the caller gives no limits: CUDA, cuDNN and
# XLA start a thread pool per device and one sized by the host's cores, and
# load about 2 GB of libraries; JAX's compilation cache and ptxas use /tmp.
GPU_LIMITS = Limits(
    memory_bytes=32 * 1024 * MiB,
    cpus=4.0,
    pids=4096,
    tmp_bytes=2048 * MiB,
    work_bytes=2048 * MiB,
    file_size_bytes=1024 * MiB,
)

# Inside a container without GPUs: the NVIDIA runtime, where it is the engine's
# default, then exposes none (an image may set NVIDIA_VISIBLE_DEVICES=all).
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void"}
# Words in an engine's answer that name the GPU part of a container start.
_GPU_FAILURE = re.compile(r"device driver|nvidia|cdi|gpu|\bcuda", re.IGNORECASE)
_NO_DRIVER = "could not select device driver"
_CDI_NAME = re.compile(r"^[\w.-]+/[\w.-]+=[\w.:-]+$")
_UUID = re.compile(r"^(GPU|MIG)-[\w/-]+$")
TOOLKIT_HINT = (
    "install the NVIDIA Container Toolkit on the engine's machine and restart the engine"
    " (nvidia-ctk runtime configure --runtime=docker), point DOCKER_HOST at an engine"
    " that has it, or run without GPUs (gpus=0)"
)


@dataclasses.dataclass(frozen=True)
class GpuRequest:
    """The GPUs one container asks for: a count, or device ids.

    Attributes:
        count: -1 for all devices, n > 0 for devices 0..n-1, 0 when `device_ids` name them.
        device_ids: device indices ("0"), UUIDs ("GPU-...", "MIG-...") or CDI names.
        driver: the engine's device driver; "" lets the engine pick the one
            serving the "gpu" capability, "cdi" for CDI names.
    """

    count: int = 0
    device_ids: tuple[str, ...] = ()
    driver: str = ""

    def __post_init__(self):
        if bool(self.count) == bool(self.device_ids) or self.count < -1:
            raise ValueError(f"a GPU request needs a count or device ids, not both: {self}")

    def device_request(self):
        """The engine's `DeviceRequest` for this request."""
        import docker

        if self.driver == "cdi":  # the CDI driver takes names only, no capabilities
            return docker.types.DeviceRequest(driver="cdi", device_ids=list(self.device_ids))
        if self.device_ids:
            return docker.types.DeviceRequest(
                device_ids=list(self.device_ids), capabilities=[["gpu"]]
            )
        return docker.types.DeviceRequest(count=self.count, capabilities=[["gpu"]])

    def visible_devices(self) -> str | None:
        """`NVIDIA_VISIBLE_DEVICES` as the engine sets it for this request (None for CDI)."""
        if self.driver == "cdi":
            return None
        if self.device_ids:
            return ",".join(self.device_ids)
        if self.count < 0:
            return "all"
        return ",".join(str(i) for i in range(self.count))

    def spec(self) -> str:
        """The request as `parse_gpus` reads it: "2", "all" or "device=0,1"."""
        if self.device_ids:
            return "device=" + ",".join(self.device_ids)
        return "all" if self.count < 0 else str(self.count)

    def describe(self) -> str:
        if self.device_ids:
            return f"device{'s' * (len(self.device_ids) > 1)} {','.join(self.device_ids)}"
        return "all GPUs" if self.count < 0 else f"{self.count} GPU{'s' * (self.count > 1)}"


def parse_gpus(spec) -> GpuRequest | None:
    """A request from the ways a caller or a config names GPUs; None for no GPU.

    Example:
        >>> parse_gpus(2)
        GpuRequest(count=2, device_ids=(), driver='')
        >>> parse_gpus("device=0,1").device_ids
        ('0', '1')
        >>> parse_gpus("") is None
        True

    Args:
        spec: None, 0, "" or "none": no GPU. A positive int n or its digits
            ("2"): any n GPUs, i.e. devices 0..n-1 (as `docker run --gpus 2`).
            "all": every GPU. "device=0,1", "0,1" (a comma makes a list) or a
            sequence of strings: those devices, by index, UUID or CDI name
            (one device by id: "device=1", ["1"] or its UUID "GPU-...").

    Raises:
        ValueError: a negative count, an empty id, or CDI names mixed with others.
        TypeError: not one of the above (e.g. a bool or a float).
    """
    if spec is None:
        return None
    if isinstance(spec, bool) or not isinstance(spec, (numbers.Integral, str, Sequence)):
        raise TypeError(f"gpus must be an int, a string or a list of device ids, got {spec!r}")
    if isinstance(spec, numbers.Integral):
        if spec < 0:
            raise ValueError(f"gpus must be >= 0 (or 'all'), got {spec}")
        return GpuRequest(count=int(spec)) if spec else None
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() in ("", "none", "0"):
            return None
        if text.lower() == "all":
            return GpuRequest(count=-1)
        if text.isdigit():
            return GpuRequest(count=int(text))
        if text.startswith("device="):
            text = text[len("device=") :]
        elif "," not in text and not _CDI_NAME.match(text) and not _UUID.match(text):
            raise ValueError(
                f"gpus={spec!r}: want a count, 'all', 'device=<id>[,<id>...]' or a list of ids"
            )
        ids = [part.strip() for part in text.split(",")]
    else:
        ids = [str(part).strip() for part in spec]
        if not ids:
            return None
    if not all(ids):
        raise ValueError(f"gpus={spec!r} holds an empty device id")
    cdi = [bool(_CDI_NAME.match(i)) for i in ids]
    if any(cdi) and not all(cdi):
        raise ValueError(f"gpus={spec!r} mixes CDI names (vendor/class=name) with device ids")
    return GpuRequest(device_ids=tuple(ids), driver="cdi" if all(cdi) else "")


def split_devices(request: GpuRequest, per_program: int) -> list[GpuRequest]:
    """Disjoint groups of `per_program` devices out of `request`, one group per program.

    Example:
        >>> [g.device_ids for g in split_devices(parse_gpus(4), 2)]
        [('0', '1'), ('2', '3')]

    Raises:
        ValueError: `request` is "all" (its devices are not known here), or
            `per_program` does not divide its devices.
    """
    if request.count < 0:
        raise ValueError("gpus_per_program needs the devices named (a count or ids), not 'all'")
    ids = request.device_ids or tuple(str(i) for i in range(request.count))
    if per_program < 1 or len(ids) % per_program:
        raise ValueError(
            f"gpus_per_program={per_program} must divide the {len(ids)} devices of"
            f" gpus={request.spec()!r}"
        )
    return [
        GpuRequest(device_ids=ids[i : i + per_program], driver=request.driver)
        for i in range(0, len(ids), per_program)
    ]


class GpuLeases:
    """Hands each running program one group of devices, blocking while all are taken.

    Example:
        >>> leases = GpuLeases(split_devices(parse_gpus("0,1"), 1))
        >>> with leases.lease() as request:
        ...     request.device_ids
        ('0',)
    """

    def __init__(self, groups: Sequence[GpuRequest]):
        if not groups:
            raise ValueError("need at least one group of devices")
        self._free = collections.deque(groups)
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def lease(self) -> Iterator[GpuRequest]:
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            group = self._free.popleft()
        try:
            yield group
        finally:
            with self._cond:
                self._free.append(group)
                self._cond.notify()


def gpu_limits(client) -> Limits:
    """`GPU_LIMITS` with no more CPUs than the engine's machine has (it refuses more)."""
    try:
        cpus = int(client.info().get("NCPU") or 0)
    except Exception as e:  # keep the default; the engine says so at the first run
        log.warning("could not read the engine's CPU count: %s", e)
        cpus = 0
    if 0 < cpus < GPU_LIMITS.cpus:
        return dataclasses.replace(GPU_LIMITS, cpus=float(cpus))
    return GPU_LIMITS


def program_environment(request: GpuRequest | None, memory_fraction: float | None) -> dict:
    """Variables the program's exec gets: its devices, and the advisory memory cap."""
    if request is None:
        return dict(NO_GPU_ENV)
    env = {}
    if (visible := request.visible_devices()) is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = visible
    if memory_fraction is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{memory_fraction:g}"
        env["WMRL_GPU_MEMORY_FRACTION"] = f"{memory_fraction:g}"
    return env


def check_memory_fraction(fraction) -> float | None:
    """None, or a fraction in (0, 1]."""
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise TypeError(f"gpu_memory_fraction must be a number, got {fraction!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {fraction}")
    return float(fraction)


def is_gpu_failure(error: BaseException) -> bool:
    """Whether an engine error at container start concerns the GPU request."""
    return bool(_GPU_FAILURE.search(_explanation(error)))


def _explanation(error: BaseException) -> str:
    return str(getattr(error, "explanation", None) or error)


def _runtimes(client) -> str:
    try:
        return ", ".join(sorted(client.info().get("Runtimes") or {})) or "none listed"
    except Exception as e:  # only for the message
        return f"unknown ({type(e).__name__})"


def refusal_message(client, request: GpuRequest, error: BaseException) -> str:
    """What to tell the caller when the engine would not start a container with GPUs."""
    text = _explanation(error)
    what = (
        "the Docker engine has no GPU runtime"
        if _NO_DRIVER in text
        else "the Docker engine could not give a container GPUs"
    )
    return (
        f"{what}: asked for {request.describe()}, it answered {text!r}"
        f" (engine runtimes: {_runtimes(client)}); {TOOLKIT_HINT}"
    )


def gpu_refusal(client, image: str, request: GpuRequest, *, labels: dict) -> str | None:
    """Starts a probe container with `request`; None when it starts, else why not.

    The probe runs `true` with no network and a read-only root; it is always removed.

    Raises:
        InfraError: the engine failed otherwise (no answer within the client's timeout).
    """
    import docker

    container = None
    try:
        container = client.containers.create(
            image,
            ["true"],
            device_requests=[request.device_request()],
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            log_config=docker.types.LogConfig(type="none"),
            labels=labels,
        )
        container.start()
    except docker.errors.APIError as e:
        return refusal_message(client, request, e)
    except Exception as e:
        raise InfraError(f"the GPU probe container failed ({type(e).__name__}: {e})") from e
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError as e:
                log.warning("could not remove the GPU probe %s: %s", container.id[:12], e)
    return None
