"""ExecutorPool: many programs at once on one executor, with retries and a cache.

Anchors go to the pool as soon as they are sampled and run while the world
model predicts. Only infrastructure errors are retried (a program's own
failure is a result and stays one); identical runs are answered from a cache
keyed by (environment, program digest, input digest).
"""

import concurrent.futures
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping

from wmrl_jax.sandbox.files import input_files
from wmrl_jax.sandbox.result import ExecutionResult, Executor, check_files, infra_error

log = logging.getLogger(__name__)


def program_digest(
    source: str, files: Mapping[str, bytes | str] | None = None, timeout_s: float | None = None
) -> str:
    """sha256 of the program, its extra files and its timeout."""
    h = hashlib.sha256(source.encode())
    for name, content in sorted(check_files(files).items()):
        h.update(b"\0file\0" + name.encode() + b"\0" + hashlib.sha256(content).digest())
    h.update(b"\0timeout\0" + repr(timeout_s).encode())
    return h.hexdigest()


def input_digest(input_dir: str | os.PathLike | None) -> str:
    """sha256 over the relative paths and contents of every file under `input_dir`.

    Raises:
        InputError: as `files.input_files` (a link leaving the dir, a special file).
    """
    if input_dir is None:
        return "none"
    h = hashlib.sha256()
    for rel, path in input_files(input_dir):
        h.update(rel.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


class ExecutorPool:
    """Runs programs concurrently on `executor`, `width` at a time.

    Example:
        >>> with ExecutorPool(LocalExecutor(), width=4) as pool:  # doctest: +SKIP
        ...     futures = [pool.submit(src) for src in sources]
        ...     results = [f.result() for f in futures]

    Args:
        executor: any `Executor`; the pool closes it on `close()`.
        width: programs running at once.
        max_retries: extra attempts after an "infra_error" result.
        retry_backoff_s: wait before the first retry, doubled for each further one.
        cache: answer repeated (environment, program, inputs) from memory.
        close_executor: whether `close()` closes the executor too.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        width: int = 4,
        max_retries: int = 2,
        retry_backoff_s: float = 1.0,
        cache: bool = True,
        close_executor: bool = True,
    ):
        if width < 1 or max_retries < 0:
            raise ValueError(f"need width >= 1 and max_retries >= 0, got {width}, {max_retries}")
        self.executor = executor
        self.width = width
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.close_executor = close_executor
        self._threads = concurrent.futures.ThreadPoolExecutor(width, thread_name_prefix="sandbox")
        self._cache: dict[tuple[str, str, str], concurrent.futures.Future] | None = (
            {} if cache else None
        )
        self._lock = threading.Lock()
        self._closed = False
        self.stats = {"runs": 0, "retries": 0, "cache_hits": 0}

    def submit(
        self, source: str, *, input_dir=None, timeout_s: float | None = None, files=None
    ) -> "concurrent.futures.Future[ExecutionResult]":
        """Schedules one program; returns a Future of its `ExecutionResult`."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        key = None
        if self._cache is not None:
            key = (
                self.executor.environment,
                program_digest(source, files, timeout_s),
                input_digest(input_dir),
            )
            with self._lock:
                if key in self._cache:  # done or in flight: identical runs share one future
                    self.stats["cache_hits"] += 1
                    return self._cache[key]
        future = self._threads.submit(self._run, source, input_dir, timeout_s, files)
        if key is not None:
            with self._lock:
                self._cache[key] = future
            future.add_done_callback(lambda f, key=key: self._forget_failures(key, f))
        return future

    def map(self, sources: Iterable[str], **kwargs) -> list[ExecutionResult]:
        """Runs every source (same keyword arguments) and waits for all results."""
        futures = [self.submit(source, **kwargs) for source in sources]
        return [f.result() for f in futures]

    def _forget_failures(self, key, future) -> None:
        # Infrastructure errors and cancellations are not answers worth keeping.
        if future.cancelled() or future.exception() or future.result().status == "infra_error":
            with self._lock:
                if self._cache is not None and self._cache.get(key) is future:
                    del self._cache[key]

    def _run(self, source, input_dir, timeout_s, files) -> ExecutionResult:
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.stats["runs"] += 1
            try:
                result = self.executor.run(
                    source, input_dir=input_dir, timeout_s=timeout_s, files=files
                )
            except Exception as e:  # an executor bug must not take the pool down
                result = infra_error(f"executor raised {type(e).__name__}: {e}")
            if result.status != "infra_error" or attempt == self.max_retries or self._closed:
                return result
            log.warning("infra error (attempt %d): %s", attempt + 1, result.message)
            with self._lock:
                self.stats["retries"] += 1
            time.sleep(self.retry_backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def close(self, *, cancel_pending: bool = True) -> None:
        """Stops taking work, waits for running programs, closes the executor (if owned)."""
        self._closed = True
        self._threads.shutdown(wait=True, cancel_futures=cancel_pending)
        if self.close_executor:
            self.executor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
