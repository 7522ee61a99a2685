"""The execution bridge: run programs in a sandbox, get `ExecutionResult`s back.

    from wmrl_jax.sandbox import DockerExecutor, ExecutorPool, LocalExecutor

`DockerExecutor` is the real backend (one locked-down container per program;
image from `python -m wmrl_jax.sandbox.image`); `LocalExecutor` is the
embedded fallback (subprocess + rlimits + a uid of its own per program when
root, network NOT isolated; it refuses to run programs as root unless
`allow_root=True`);
`make_executor()` picks Docker when an engine and the image are there.
`DockerExecutor(gpus=...)` gives containers GPUs (see `sandbox.gpus`).
Nothing here imports JAX.
"""

import logging

from wmrl_jax.sandbox.docker_backend import DockerExecutor
from wmrl_jax.sandbox.files import InputError
from wmrl_jax.sandbox.gpus import GpuRequest, parse_gpus
from wmrl_jax.sandbox.local import LocalExecutor, WeakIsolationWarning
from wmrl_jax.sandbox.pool import ExecutorPool, input_digest, program_digest
from wmrl_jax.sandbox.result import (
    STATUSES,
    ExecutionResult,
    Executor,
    InfraError,
    Limits,
)

__all__ = [
    "STATUSES",
    "DockerExecutor",
    "ExecutionResult",
    "Executor",
    "ExecutorPool",
    "GpuRequest",
    "InfraError",
    "InputError",
    "Limits",
    "LocalExecutor",
    "WeakIsolationWarning",
    "build_image",
    "default_image",
    "input_digest",
    "make_executor",
    "parse_gpus",
    "program_digest",
]


def __getattr__(name):
    # Lazy, so that `python -m wmrl_jax.sandbox.image` runs a module not yet imported.
    if name in ("build_image", "default_image"):
        from wmrl_jax.sandbox import image

        return getattr(image, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Keywords that only the local backend takes.
_LOCAL_ONLY = ("switch_user", "allow_root")
_DOCKER_ONLY = (
    "client",
    "api_timeout_s",
    "gpus",
    "gpus_per_program",
    "gpu_memory_fraction",
    "probe_gpus",
)


def make_executor(image: str | None = None, *, python: str | None = None, **kwargs) -> Executor:
    """`DockerExecutor(image, **kwargs)` when possible, else `LocalExecutor(python=python,
    **kwargs)` (with a warning saying why). Keywords of one backend only
    (`switch_user`, `allow_root`; `client`, `api_timeout_s` and the GPU ones) go
    to that backend.

    Raises:
        InfraError: GPUs were asked for (`gpus`) and Docker cannot run: the
            local backend cannot give a program GPUs, so there is no fallback.
    """
    local = {k: kwargs.pop(k) for k in _LOCAL_ONLY if k in kwargs}
    try:
        return DockerExecutor(image, **kwargs)
    except InfraError as e:
        if parse_gpus(kwargs.get("gpus")) is not None:
            raise InfraError(
                f"GPUs were asked for and the local backend has none to give: {e}"
            ) from e
        logging.getLogger(__name__).warning("falling back to LocalExecutor: %s", e)
        for key in _DOCKER_ONLY:
            kwargs.pop(key, None)
        return LocalExecutor(python=python, **kwargs, **local)
