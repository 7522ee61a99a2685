"""Real execution for the trainer: the outcome-source protocol, retries, and rejected rewards.

An outcome source turns (task, program) into a graded `Outcome` — a sandbox
that executes and grades (`envs.outcomes.SandboxOutcomes`) or the recipe
table's replay (`envs.outcomes.ReplayExecutor`). `Runner` submits a step's
anchors at once, retries infrastructure errors, and drops (and counts) what
cannot be trusted: infrastructure errors after the retries and non-finite
rewards. Failures of the *program* (crash, timeout, invalid output) are
rewards, never dropped.

The execution cache: programs are deterministic given their task (seeded), so
a (task, program) pair already executed in this run is answered from the
run's cache and charged nothing; a pair sampled twice in one step is executed
once. Every arm uses the same cache, so arms pay for unique executions only;
`executions` (charged) and `cached` (answered from the cache) are reported
apart. The cache travels with the checkpoints.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.envs.task import Task

log = logging.getLogger(__name__)


class OutcomeSource(Protocol):
    """Where real outcomes come from.

    Attributes:
      fingerprint: a content digest of whatever decides the answers (a replay
        table), checked when a run resumes; None for sources that execute.
    """

    fingerprint: str | None

    def submit(self, task: Task, source: str) -> concurrent.futures.Future:
        """Starts executing `source` on `task`; the future's result is an `Outcome`."""
        ...

    def close(self) -> None:
        """Releases workers and sandboxes."""
        ...


@dataclasses.dataclass
class Collected:
    """A step's executions, once they are back.

    Attributes:
      outcomes: {row: Outcome} of the rows with a trustworthy result.
      counts: "infra_errors" (failed attempts), "dropped" (rows given up on),
        "nonfinite" (rows whose reward was NaN or infinite), "cached" (rows
        answered from the cache or by another row of the step).
      executions: programs executed and charged (retries included).
      exec_seconds: their summed execution seconds.
    """

    outcomes: dict[int, Outcome]
    counts: dict[str, int]
    executions: int
    exec_seconds: float


def cache_key(task: Task, program: str) -> tuple[str, str]:
    """What identifies an execution: the task and the sha256 of the program's text."""
    return task.id, hashlib.sha256(program.encode()).hexdigest()


class Runner:
    """Runs a step's anchors: cache, submit, retry infrastructure errors, reject bad rewards.

    Args:
      source: the `OutcomeSource`.
      retries: resubmissions of a program whose execution failed for
        infrastructure reasons.
      on_infra_error: "wm_only" (drop the row: it keeps its world-model reward)
        or "raise" (stop training).
      cache: answer repeats of an executed (task, program) from the run's cache.
    """

    def __init__(
        self, source: OutcomeSource, *, retries: int, on_infra_error: str, cache: bool = True
    ):
        self.source, self.retries, self.on_infra_error = source, retries, on_infra_error
        self.use_cache = cache
        self.cache: dict[tuple[str, str], Outcome] = {}

    def submit(
        self, tasks: Sequence[Task], programs: Sequence[str], rows: Sequence[int], g: int
    ) -> dict[int, tuple[tuple[str, str], concurrent.futures.Future | None]]:
        """Starts `programs[i]` (of task `tasks[i // g]`) for every row i in `rows`.

        Returns `{row: (key, future)}`; the future is None where the cache or an
        earlier row of this step answers the row.
        """
        pending, started = {}, set()
        for i in map(int, rows):
            key = cache_key(tasks[i // g], programs[i])
            if self.use_cache and (key in self.cache or key in started):
                pending[i] = (key, None)
                continue
            started.add(key)
            pending[i] = (key, self.source.submit(tasks[i // g], programs[i]))
        return pending

    def collect(
        self, pending: dict, tasks: Sequence[Task], programs: Sequence[str], g: int
    ) -> Collected:
        """Waits for the rows of `submit`; dropped rows are absent from the outcomes."""
        counts = {"infra_errors": 0, "dropped": 0, "nonfinite": 0, "cached": 0}
        results: dict[tuple[str, str], Outcome | None] = {}
        executions, seconds = 0, 0.0
        for i, (key, fut) in pending.items():
            if fut is None:
                continue
            out = fut.result()
            executions += 1
            for _ in range(self.retries):
                if out.status != "infra_error":
                    break
                counts["infra_errors"] += 1
                out = self.source.submit(tasks[i // g], programs[i]).result()
                executions += 1
            if out.status == "infra_error":
                counts["infra_errors"] += 1
                if self.on_infra_error == "raise":
                    raise RuntimeError(
                        f"sandbox infrastructure error, retries spent: {out.message}"
                    )
                results[key] = None
                continue
            seconds += float(out.seconds)
            results[key] = out
            if self.use_cache:
                self.cache[key] = out
        done = {}
        for i, (key, fut) in pending.items():
            out = results.get(key) if fut is not None else results.get(key, self.cache.get(key))
            if fut is None and out is not None:
                counts["cached"] += 1
            if out is None:
                counts["dropped"] += 1
            elif not np.isfinite(out.reward):
                counts["nonfinite"] += 1
            else:
                done[i] = out
        if counts["dropped"]:
            log.warning(
                "%d anchor executions failed for infrastructure reasons after %d retries; "
                "those samples fall back to world-model rewards this step",
                counts["dropped"],
                self.retries,
            )
        if counts["nonfinite"]:
            log.warning("%d non-finite rewards rejected this step", counts["nonfinite"])
        return Collected(done, counts, executions, seconds)

    def cache_state(self) -> list[list]:
        """The cache as strict-JSON rows `[task_id, digest, *Outcome]`, NaN as None."""

        def plain(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return [[*key, *map(plain, out)] for key, out in self.cache.items()]

    def restore_cache(self, rows: Sequence[Sequence]) -> None:
        """Inverse of `cache_state` (None back to NaN)."""
        self.cache = {
            (r[0], r[1]): Outcome(*(math.nan if v is None else v for v in r[2:])) for r in rows
        }
