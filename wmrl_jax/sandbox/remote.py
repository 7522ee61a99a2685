"""EnginePool: programs fanned out over several Docker engines, each with its own concurrency.

Each engine is named by a `DOCKER_HOST`-style URL (`unix:///run/docker.sock`,
`tcp://10.0.0.7:2376`, `ssh://user@host`) and gets its own `DockerExecutor`
and its own number of slots; a program goes to the engine with the most free
room and is run elsewhere when its engine dies mid-run (see `FanOut`).

Every engine must hold the same sandbox image (same image id: `docker save`
on one, `docker load` on the others keeps it), so that a result does not
depend on where it ran; the pool refuses engines that differ. Bind mounts
name paths on the engine's machine: a remote engine needs this machine's
`TMPDIR` (where `DockerExecutor` writes each program's files) and the input
dirs on a filesystem it shares at the same paths (the same holds for one
`DockerExecutor`); for machines that share nothing, use `RayExecutor`, which
ships inputs to each node and runs the programs there.

Example:
    >>> pool = EnginePool(["unix:///run/docker.sock", "tcp://10.0.0.7:2376"],  # doctest: +SKIP
    ...                   slots=[4, 8], timeout_s=600)
    >>> results = pool.map(sources, input_dir="task/data")
"""

import concurrent.futures
import logging
import os
from collections.abc import Sequence

from wmrl_jax.sandbox.docker_backend import DockerExecutor
from wmrl_jax.sandbox.fanout import FanOut
from wmrl_jax.sandbox.result import InfraError

log = logging.getLogger(__name__)

ENGINES_ENV = "WMRL_DOCKER_ENGINES"
PING_TIMEOUT_S = 5


def engines_from_env(environ=None, *, default_slots: int = 2) -> list[tuple[str, int]]:
    """Engines from `WMRL_DOCKER_ENGINES`: comma-separated `url` or `url=slots` items.

    Example:
        >>> engines_from_env({"WMRL_DOCKER_ENGINES": "unix:///a.sock=4, tcp://h:2375"})
        [('unix:///a.sock', 4), ('tcp://h:2375', 2)]

    Raises:
        ValueError: the variable is unset or empty, or a slot count is not a positive int.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(ENGINES_ENV, "").strip()
    if not text:
        raise ValueError(
            f"{ENGINES_ENV} is not set (e.g. 'unix:///run/docker.sock=4,tcp://h:2375')"
        )
    engines = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        url, _, slots = item.rpartition("=") if "=" in item else (item, "", "")
        try:
            count = int(slots) if slots else default_slots
        except ValueError:
            count = 0
        if count < 1 or not url:
            raise ValueError(f"bad engine {item!r} in {ENGINES_ENV}: want 'url' or 'url=slots'")
        engines.append((url, count))
    return engines


class _NoGpus(InfraError):
    """The engine answers but cannot give containers the requested GPUs (until restarted)."""


class _EngineWorker:
    """A `fanout.Worker` over one engine's `DockerExecutor`."""

    def __init__(self, url: str, slots: int, image, executor_kwargs: dict):
        import docker

        self.name, self.slots = url, slots
        try:
            client = docker.DockerClient(
                base_url=url, timeout=int(executor_kwargs.pop("api_timeout_s", 600))
            )
        except Exception as e:
            raise InfraError(f"engine {url}: {e}") from e
        self.executor = DockerExecutor(image, client=client, max_workers=slots, **executor_kwargs)
        if self.executor.gpu_refusal:  # every run there would be an infra_error
            self.executor.close()
            raise _NoGpus(f"engine {url}: {self.executor.gpu_refusal}")
        self._probe = docker.APIClient(base_url=url, timeout=PING_TIMEOUT_S)

    def start(self, source, *, input_dir, timeout_s, files) -> concurrent.futures.Future:
        return self.executor.submit(source, input_dir=input_dir, timeout_s=timeout_s, files=files)

    def alive(self) -> bool:
        try:
            return bool(self._probe.ping())
        except Exception:
            return False

    def close(self) -> None:
        self.executor.close()
        self._probe.close()


class EnginePool(FanOut):
    """An `Executor` over several Docker engines; see the module docstring.

    Args:
        engines: engine URLs, or (url, slots) pairs.
        image: the sandbox image (default: `DockerExecutor`'s).
        slots: programs per engine at once: one int for all, or one per engine
            (ignored for engines given as (url, slots)).
        require_all: raise when an engine does not answer at construction
            (default: leave it out, with a warning, while one answers).
        max_retries, deadline_s, refresh_interval_s: as in `FanOut`.
        **executor_kwargs: `limits`, `timeout_s`, `api_timeout_s` and the GPU
            keywords (`gpus`, ...) of each `DockerExecutor`; an engine that
            cannot give GPUs is left out for good (one that does not answer
            is looked for again).

    Raises:
        InfraError: no engine answers, an engine lacks the image, or two
            engines hold different images under the tag.
    """

    def __init__(
        self,
        engines: Sequence[str | tuple[str, int]],
        image: str | None = None,
        *,
        slots: int | Sequence[int] = 2,
        require_all: bool = False,
        max_retries: int = 2,
        deadline_s: float | None = None,
        refresh_interval_s: float = 5.0,
        **executor_kwargs,
    ):
        pairs = _pairs(engines, slots)
        self._image, self._executor_kwargs = image, executor_kwargs
        workers, self._missing, reasons = [], [], []
        for url, count in pairs:
            try:
                workers.append(_EngineWorker(url, count, image, dict(executor_kwargs)))
            except InfraError as e:
                if require_all:
                    raise
                log.warning("engine %s left out: %s", url, e)
                if not isinstance(e, _NoGpus):  # looked for again when it answers
                    self._missing.append((url, count))
                reasons.append(str(e))
        if not workers:
            raise InfraError(
                f"no Docker engine answers among {[u for u, _ in pairs]}: {'; '.join(reasons)}"
            )
        environments = {w.executor.environment for w in workers}
        if len(environments) > 1:
            for worker in workers:
                worker.close()
            raise InfraError(
                "engines hold different images under the tag (load one image everywhere, "
                f"e.g. docker save | docker load): {sorted(environments)}"
            )
        super().__init__(
            workers,
            environment=environments.pop(),
            max_retries=max_retries,
            deadline_s=deadline_s,
            refresh_interval_s=refresh_interval_s,
        )

    def discover(self) -> list:
        """Engines that did not answer at construction and answer now (same image only)."""
        found, still = [], []
        for url, count in self._missing:
            try:
                worker = _EngineWorker(url, count, self._image, dict(self._executor_kwargs))
            except InfraError:
                still.append((url, count))
                continue
            if worker.executor.environment != self.environment:
                log.warning("engine %s holds another image; left out", url)
                worker.close()
                continue
            found.append(worker)
        self._missing = still
        return found


def _pairs(engines, slots) -> list[tuple[str, int]]:
    if isinstance(engines, str):
        raise ValueError("engines must be a list of URLs, not one string")
    if isinstance(slots, int):
        slots = [slots] * len(engines)
    if len(slots) != len(engines):
        raise ValueError(f"{len(engines)} engines but {len(slots)} slot counts")
    pairs = [e if isinstance(e, tuple) else (e, s) for e, s in zip(engines, slots, strict=True)]
    urls = [u for u, _ in pairs]
    if not pairs or len(set(urls)) != len(urls):
        raise ValueError(f"need at least one engine, each once; got {urls}")
    return pairs
