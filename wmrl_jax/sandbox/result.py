"""The execution contract shared by every backend: limits, results, the protocol.

A program is Python source run with the work dir as its current directory;
`input/` in the work dir holds the read-only inputs and files the program
writes under `output/` come back in `ExecutionResult.files`. A program's
failure is a result; only infrastructure that cannot work at all (no engine,
no image) raises `InfraError` at construction.
"""

import concurrent.futures
import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

Status = Literal["ok", "error", "timeout", "oom", "killed", "infra_error"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "oom", "killed", "infra_error")
PROGRAM_NAME = "main.py"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
MiB = 1 << 20
# Largest timeout a caller may ask for: 7 days, well below the 2**31 ms that a
# wait in milliseconds (epoll, poll) can express.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


class InfraError(RuntimeError):
    """The sandbox itself cannot run programs; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-program resource limits (all keyword-only).

    Attributes:
        memory_bytes: memory cap (Docker: cgroup memory = memory+swap; local:
            RLIMIT_AS, i.e. address space, which counts more than resident memory).
        cpus: CPU quota in cores (Docker only; local bounds CPU time instead).
        pids: processes and threads the program may have at once.
        file_size_bytes: largest file the program may write.
        work_bytes: size of the work dir (Docker tmpfs; local: not enforced).
        tmp_bytes: size of /tmp (Docker tmpfs; local: /tmp and /dev/shm are tmpfs
            of this size each, and TMPDIR is a dir inside the work dir).
        tail_bytes: last bytes of stdout and of stderr kept in the result.
        output_bytes: total bytes of output files returned; the rest is dropped.
    """

    memory_bytes: int = 1024 * MiB
    cpus: float = 1.0
    pids: int = 64
    file_size_bytes: int = 256 * MiB
    work_bytes: int = 512 * MiB
    tmp_bytes: int = 64 * MiB
    tail_bytes: int = 64 * 1024
    output_bytes: int = 16 * MiB


@dataclasses.dataclass(frozen=True)
class ExecutionResult:
    """What one run of a program produced.

    Attributes:
        status: one of "ok", "error" (non-zero exit), "timeout" (wall clock or
            CPU time), "oom", "killed" (another signal) and "infra_error" (the
            sandbox failed, not the program; `message` says why).
        exit_code: the program's exit code, negative for a signal, None when
            it never ran.
        wall_seconds: host-side wall time of the run.
        cpu_seconds: user + system CPU time where measurable, else None.
        peak_memory_bytes: peak resident memory where measurable, else None.
        stdout, stderr: the last `Limits.tail_bytes` bytes, decoded as UTF-8.
        stdout_truncated, stderr_truncated: whether earlier bytes were dropped.
        files: output files, relative path -> content (regular files only;
            symlinks and special files are never followed nor returned).
        message: what the sandbox has to say (dropped files, infra failures).
    """

    status: Status
    exit_code: int | None = None
    wall_seconds: float = 0.0
    cpu_seconds: float | None = None
    peak_memory_bytes: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    message: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def infra_error(message: str, *, wall_seconds: float = 0.0) -> ExecutionResult:
    return ExecutionResult(status="infra_error", wall_seconds=wall_seconds, message=message)


@runtime_checkable
class Executor(Protocol):
    """Runs Python programs in isolation. Implementations: DockerExecutor, LocalExecutor."""

    #: Identifies what a program runs on (an image tag, "local:<python>"); part of cache keys.
    environment: str

    def run(
        self,
        source: str,
        *,
        input_dir: str | os.PathLike | None = None,
        timeout_s: float | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecutionResult: ...

    def submit(
        self,
        source: str,
        *,
        input_dir: str | os.PathLike | None = None,
        timeout_s: float | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> "concurrent.futures.Future[ExecutionResult]": ...

    def close(self) -> None: ...


class TailBuffer:
    """Keeps the last `limit` bytes written to it and counts all of them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self._chunks = bytearray()

    def write(self, data: bytes) -> None:
        self.total += len(data)
        if len(data) >= self.limit:
            self._chunks = bytearray(data[len(data) - self.limit :])
            return
        self._chunks += data
        if len(self._chunks) > 2 * self.limit:  # amortised trimming
            del self._chunks[: len(self._chunks) - self.limit]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        return bytes(self._chunks[-self.limit :] if self.limit else b"").decode(
            "utf-8", errors="replace"
        )


def check_files(files: Mapping[str, bytes | str] | None) -> dict[str, bytes]:
    """Validates extra program files: relative paths inside the work dir."""
    out = {}
    for name, content in (files or {}).items():
        parts = name.replace("\\", "/").split("/")
        if name.startswith("/") or ".." in parts or name in ("", PROGRAM_NAME):
            raise ValueError(f"file name must be a relative path inside the work dir: {name!r}")
        if parts[0] in (INPUT_NAME, OUTPUT_NAME):
            raise ValueError(f"{parts[0]}/ is reserved: {name!r}")
        out[name] = content.encode() if isinstance(content, str) else bytes(content)
    return out


def check_timeout(timeout_s) -> float:
    """A caller's timeout as a float, in (0, `MAX_TIMEOUT_S`].

    NaN, infinite, non-positive, too large or non-numbers are refused: a NaN
    deadline would never pass, and waits on the program's pipes take their
    timeout in milliseconds as a C int (epoll, poll), which overflows past
    2**31 ms (about 24.8 days): every run would fail. "No limit" is not
    offered: a program that never ends would hold its worker forever.
    """
    value = math.nan
    if isinstance(timeout_s, numbers.Real) and not isinstance(timeout_s, bool):
        try:
            value = float(timeout_s)
        except OverflowError:
            pass
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"timeout_s must be a positive finite number of seconds, got {timeout_s!r}"
        )
    if value > MAX_TIMEOUT_S:
        raise ValueError(
            f"timeout_s must be at most {MAX_TIMEOUT_S:.0f} s (7 days), got {timeout_s!r}; "
            "there is no 'no limit' value"
        )
    return value


def check_input_dir(input_dir: str | os.PathLike | None) -> None:
    """A caller's mistake, raised as such: it is neither the program's nor the sandbox's."""
    if input_dir is not None and not os.path.isdir(input_dir):
        raise ValueError(f"input_dir is not a directory: {input_dir}")


class BaseExecutor:
    """`submit`, `close` and the context manager on top of a subclass's `run`."""

    environment: str = ""

    def __init__(self, *, max_workers: int | None = None):
        self._max_workers = max_workers or os.cpu_count() or 1
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None

    def run(self, source, *, input_dir=None, timeout_s=None, files=None) -> ExecutionResult:
        raise NotImplementedError

    def submit(self, source, *, input_dir=None, timeout_s=None, files=None):
        """Like `run`, in a background thread; returns a Future of the result."""
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                self._max_workers, thread_name_prefix=type(self).__name__
            )
        return self._threads.submit(
            self.run, source, input_dir=input_dir, timeout_s=timeout_s, files=files
        )

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
