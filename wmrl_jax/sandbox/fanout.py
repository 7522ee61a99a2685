"""Fan-out: programs spread over workers (engines, nodes), retried elsewhere when one fails.

The scheduling shared by `RayExecutor` (a worker per Ray node) and `EnginePool`
(a worker per Docker engine). Each worker has a number of slots; a program
waits in a queue until a live worker has a free one (back-pressure: nothing
is pushed onto a busy node), then runs there, and its future resolves as soon
as it finishes (results stream back in completion order).

Faults. When a worker dies mid-run (its engine stops answering, its node is
lost), its programs come back as "infra_error" results and the dead worker
gets no more work until `refresh` finds it answering again. A program that
came back as "infra_error" is queued again for a worker it has not failed on
yet, up to `max_retries` times; one whose worker died under it (`WorkerLost`:
it may have run in part or in whole, and may still be running there) only
with `rerun_lost`, else its result is that "infra_error".
Every submitted program resolves exactly once: a retried program is counted
once in `stats["results"]`, its lost attempts in `stats["lost"]` (and their
seconds in `stats["lost_seconds"]`, the last reasons in `lost_reasons`), never as
results. With `deadline_s`, a
program not finished that long after its submission resolves as an
"infra_error" whose message starts with `DEADLINE_MESSAGE` (counted in
`stats["dropped"]`), so a slow node cannot stall a training step: the
trainer drops it like any infrastructure failure (`on_infra_error`). What it
returns later is discarded (`stats["late"]`).
"""

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

from wmrl_jax.sandbox.result import ExecutionResult, check_files, check_input_dir, infra_error

log = logging.getLogger(__name__)

DEADLINE_MESSAGE = "deadline passed"
# The dispatcher's longest single wait: a wait past threading.TIMEOUT_MAX (~292 years)
# raises OverflowError in its thread, so a deadline meant as "no limit" (1e10 s) is
# waited for in slices instead.
MAX_WAIT_S = 3600.0
LOST_REASONS_KEPT = 32  # The most recent lost attempts' reasons, kept in `lost_reasons`.
STAT_NAMES = ("submitted", "results", "lost", "lost_seconds", "retries", "dropped", "late")


class WorkerLost(RuntimeError):
    """Raised by a worker's future when the worker itself died (not the program)."""


class Worker(Protocol):
    """One place that runs programs: a Docker engine, a Ray node's actor."""

    #: Unique among the fan-out's workers (an engine URL, a node id).
    name: str
    #: Programs it runs at once.
    slots: int

    def start(
        self, source: str, *, input_dir, timeout_s, files
    ) -> "concurrent.futures.Future[ExecutionResult]":
        """Starts one program; the future raises `WorkerLost` if the worker dies."""
        ...

    def alive(self) -> bool:
        """Whether it answers now (cheap; called after failures and by `refresh`)."""
        ...

    def close(self) -> None: ...


@dataclasses.dataclass(eq=False)
class _Job:
    source: str
    input_dir: object
    timeout_s: float | None
    files: object
    future: concurrent.futures.Future
    deadline: float
    tried: set = dataclasses.field(default_factory=set)
    attempts: int = 0


class FanOut:
    """An `Executor` over several `Worker`s; see the module docstring.

    Args:
        workers: the initial workers (at least one).
        environment: what programs run on (an image and its id); part of cache keys.
        max_retries: extra attempts after an "infra_error", each on another
            worker where one is left.
        rerun_lost: whether a program whose worker died while it ran
            (`WorkerLost`) counts as such an "infra_error" (run again; it may
            then run twice) or resolves as one, naming the worker.
        deadline_s: seconds from submission after which a program is dropped
            (None: wait as long as it takes).
        refresh_interval_s: how often, at most, dead workers are probed again
            (and new ones discovered) while programs wait.
    """

    def __init__(
        self,
        workers: Sequence[Worker],
        *,
        environment: str,
        max_retries: int = 2,
        rerun_lost: bool = True,
        deadline_s: float | None = None,
        refresh_interval_s: float = 5.0,
    ):
        if not workers:
            raise ValueError("need at least one worker")
        if max_retries < 0 or (deadline_s is not None and not deadline_s > 0):
            raise ValueError(
                f"need max_retries >= 0 and deadline_s > 0, got {max_retries}, {deadline_s}"
            )
        self.environment = environment
        self.max_retries = max_retries
        self.rerun_lost = rerun_lost
        self.deadline_s = deadline_s
        self.refresh_interval_s = refresh_interval_s
        self._workers: dict[str, Worker] = {}
        self._busy: dict[str, int] = {}
        self._dead: set[str] = set()
        self._queue: collections.deque[_Job] = collections.deque()
        self._running: dict[_Job, str] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._refreshing = False
        self._last_refresh = time.monotonic()
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self.stats["lost_seconds"] = 0.0
        self.per_worker: dict[str, int] = collections.Counter()
        # (worker, message) of the most recent lost attempts: why a retry happened.
        self.lost_reasons: collections.deque[tuple[str, str]] = collections.deque(
            maxlen=LOST_REASONS_KEPT
        )
        for worker in workers:
            self._add(worker)
        self._callbacks = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fanout")
        self._dispatcher = threading.Thread(target=self._dispatch, daemon=True, name="fanout")
        self._dispatcher.start()

    # -- the Executor interface ------------------------------------------------

    def submit(
        self, source: str, *, input_dir=None, timeout_s: float | None = None, files=None
    ) -> "concurrent.futures.Future[ExecutionResult]":
        """Queues one program; returns a Future of its `ExecutionResult`.

        Raises:
            ValueError: `input_dir` is not a directory, or a file name leaves the work dir.
            RuntimeError: the executor is closed.
        """
        check_input_dir(input_dir)  # a caller's mistake: raised here, never retried
        check_files(files)
        future: concurrent.futures.Future = concurrent.futures.Future()
        deadline = time.monotonic() + self.deadline_s if self.deadline_s else float("inf")
        with self._cond:
            if self._closed:
                raise RuntimeError("the executor is closed")
            self._queue.append(_Job(source, input_dir, timeout_s, files, future, deadline))
            self.stats["submitted"] += 1
            self._cond.notify_all()
        return future

    def run(self, source: str, *, input_dir=None, timeout_s=None, files=None) -> ExecutionResult:
        """Runs one program and waits for its result; see `Executor.run`."""
        return self.submit(source, input_dir=input_dir, timeout_s=timeout_s, files=files).result()

    def map(self, sources: Iterable[str], **kwargs) -> list[ExecutionResult]:
        """Runs every source (same keyword arguments) and returns the results in order."""
        futures = [self.submit(source, **kwargs) for source in sources]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Resolves queued programs as infra errors, waits for running ones (also those
        dropped at their deadline), closes workers."""
        with self._cond:
            self._closed = True
            dropped, self._queue = list(self._queue), collections.deque()
            self._cond.notify_all()
        for job in dropped:
            self._resolve(job, infra_error("the executor was closed before the program ran"))
        self._dispatcher.join()
        # Workers close first (they wait for what still runs: programs dropped at
        # their deadline), so that late answers are still seen and counted.
        for worker in list(self._workers.values()):
            try:
                worker.close()
            except Exception as e:  # a dead worker may not close cleanly
                log.warning("closing worker %s: %s", worker.name, e)
        self._callbacks.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- workers ----------------------------------------------------------------

    @property
    def workers(self) -> dict[str, Worker]:
        """Workers by name (a copy)."""
        with self._cond:
            return dict(self._workers)

    @property
    def live_workers(self) -> list[str]:
        """Names of the workers given work now."""
        with self._cond:
            return [name for name in self._workers if name not in self._dead]

    @property
    def busy(self) -> dict[str, int]:
        """Programs running now on each worker."""
        with self._cond:
            return dict(self._busy)

    def _add(self, worker: Worker) -> None:
        if worker.slots < 1:
            raise ValueError(f"worker {worker.name} needs slots >= 1, got {worker.slots}")
        self._workers[worker.name] = worker
        self._busy.setdefault(worker.name, 0)
        self._dead.discard(worker.name)

    def discover(self) -> list[Worker]:
        """New workers to add on `refresh` (e.g. nodes that joined); none by default."""
        return []

    def refresh(self) -> None:
        """Probes dead workers (revived ones get work again) and adds discovered ones."""
        with self._cond:
            dead = [self._workers[name] for name in self._dead]
        revived = [w.name for w in dead if _answers(w)]
        found = self.discover()
        with self._cond:
            self._dead.difference_update(revived)
            closed = self._closed
            if not closed:
                for worker in found:
                    if worker.name not in self._workers or worker.name in self._dead:
                        self._add(worker)
            self._last_refresh = time.monotonic()
            self._cond.notify_all()
        if closed:
            for worker in found:
                worker.close()
            return
        if revived or found:
            log.info("workers back: %s; new: %s", revived, [w.name for w in found])

    # -- scheduling ---------------------------------------------------------------

    def _pick(self, job: _Job) -> str | None:
        """The least busy live worker with a free slot, preferring one `job` has not failed on."""
        free = [
            name
            for name, worker in self._workers.items()
            if name not in self._dead and self._busy[name] < worker.slots
        ]
        if not free:
            return None
        fresh = [name for name in free if name not in job.tried] or free
        return min(fresh, key=lambda name: self._busy[name] / self._workers[name].slots)

    def _dispatch(self) -> None:
        while True:
            starts, expired = [], []
            refresh = False
            with self._cond:
                if self._closed and not self._running:
                    return
                now = time.monotonic()
                for job in [*self._queue, *self._running]:
                    if job.deadline <= now:
                        expired.append(job)
                self.stats["dropped"] += len(expired)
                for job in expired:
                    if job in self._running:
                        self._running.pop(job)  # its slot frees when the worker answers
                    else:
                        self._queue.remove(job)
                while self._queue and not self._closed:
                    name = self._pick(self._queue[0])
                    if name is None:
                        break
                    job = self._queue.popleft()
                    if job.attempts == 0 and not job.future.set_running_or_notify_cancel():
                        self.stats["results"] += 1  # cancelled while queued: resolved
                        continue
                    self._busy[name] += 1
                    self._running[job] = name
                    job.attempts += 1
                    starts.append((job, self._workers[name]))
                waiting = bool(self._queue) and not starts and not self._refreshing
                if waiting and (
                    now - self._last_refresh >= self.refresh_interval_s
                    or len(self._dead) == len(self._workers)  # nothing can run: look now
                ):
                    refresh = self._refreshing = True
                if not (starts or expired or refresh):
                    next_deadline = min(
                        (j.deadline for j in [*self._queue, *self._running]), default=float("inf")
                    )
                    timeout = next_deadline - now
                    if self._queue:
                        timeout = min(timeout, self.refresh_interval_s)
                    if timeout == float("inf"):
                        self._cond.wait()
                    else:
                        self._cond.wait(min(max(timeout, 0.0), MAX_WAIT_S))
                    continue
            for job in expired:
                self._resolve(
                    job,
                    infra_error(f"{DEADLINE_MESSAGE} ({self.deadline_s} s after submission)"),
                )
            for job, worker in starts:
                self._start(job, worker)
            if refresh:  # probes may take long: the dispatcher goes on meanwhile
                threading.Thread(target=self._refresh_or_give_up, daemon=True).start()

    def _refresh_or_give_up(self) -> None:
        """`refresh`; then, if no worker is left, resolves the queue instead of waiting."""
        stranded = []
        try:
            self.refresh()
        finally:
            with self._cond:
                self._refreshing = False
                if len(self._dead) == len(self._workers):
                    stranded, self._queue = list(self._queue), collections.deque()
                self._cond.notify_all()
        for job in stranded:
            self._resolve(job, infra_error("no worker answers; nothing can run"))

    def _start(self, job: _Job, worker: Worker) -> None:
        try:
            future = worker.start(
                job.source, input_dir=job.input_dir, timeout_s=job.timeout_s, files=job.files
            )
        except Exception as e:
            future = concurrent.futures.Future()
            future.set_exception(e)
        future.add_done_callback(lambda f: self._on_done(job, worker, f))

    def _on_done(self, job: _Job, worker: Worker, future: concurrent.futures.Future) -> None:
        # Not inline: a worker's callback thread (Ray's, say) must not wait on a probe.
        try:
            self._callbacks.submit(self._finished, job, worker, future)
        except RuntimeError:  # closed: only late answers of dropped programs get here
            pass

    def _finished(self, job: _Job, worker: Worker, future: concurrent.futures.Future) -> None:
        lost = died_under = False
        try:
            result = future.result()
        except WorkerLost as e:
            lost = died_under = True
            again = "" if self.rerun_lost else " (not run again: it may have run there)"
            result = infra_error(f"worker {worker.name} lost while the program ran{again}: {e}")
        except Exception as e:
            result = infra_error(f"worker {worker.name} raised {type(e).__name__}: {e}")
        if result.status == "infra_error" and not lost:
            lost = not _answers(worker)
        final = None
        with self._cond:
            self._busy[worker.name] -= 1
            if lost and worker.name in self._workers:
                if worker.name not in self._dead:
                    log.warning("worker %s is down; its programs run elsewhere", worker.name)
                self._dead.add(worker.name)
            if self._running.pop(job, None) is None:
                self.stats["late"] += 1  # dropped at its deadline; the answer is not used
            elif result.status == "infra_error":
                self.stats["lost"] += 1
                self.stats["lost_seconds"] += result.wall_seconds
                self.lost_reasons.append((worker.name, result.message))
                log.warning(
                    "a program came back from %s as infra_error: %s", worker.name, result.message
                )
                job.tried.add(worker.name)
                rerun = self.rerun_lost or not died_under
                if rerun and job.attempts <= self.max_retries and not self._closed:
                    self.stats["retries"] += 1
                    self._queue.appendleft(job)
                else:
                    final = result
            else:
                self.per_worker[worker.name] += 1
                final = result
            self._cond.notify_all()
        if final is not None:
            self._resolve(job, final)

    def _resolve(self, job: _Job, result: ExecutionResult) -> None:
        if job.future.done():
            return
        with self._cond:
            self.stats["results"] += 1
        if job.future.running() or job.future.set_running_or_notify_cancel():
            job.future.set_result(result)


def _answers(worker: Worker) -> bool:
    try:
        return bool(worker.alive())
    except Exception:
        return False
