"""Program -> outcome: real execution and grading, or a replay from the recipe table.

Free-form programs and recipe programs share everything downstream of the
program text: both go through `submit(task, source) -> Future[Outcome]`.
`SandboxOutcomes` runs the program on an executor (or `ExecutorPool`) and grades
the submission it writes; `ReplayExecutor` answers recipe programs from the
tabular benchmark and charges the compute they cost when they were executed.

Failures are outcomes, never exceptions: a crash, a timeout or a garbage
submission gets its floor reward; a sandbox failure is "infra_error" with a
NaN reward (mask or re-run that sample).

Example:
    >>> outcomes = SandboxOutcomes(LocalExecutor())                 # doctest: +SKIP
    >>> outcomes.submit(task, source).result().reward               # doctest: +SKIP
    0.81
"""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
from collections.abc import Mapping
from typing import NamedTuple

from wmrl_jax.envs import grading, recipes
from wmrl_jax.envs.tabular import (
    STATUS_NAMES,
    RecipeTable,
    programs_digest,
    recipe_digests,
    source_digest,
)
from wmrl_jax.envs.task import Task

OUTCOME_STATUSES = ("ok", "invalid", "error", "killed", "timeout", "oom", "infra_error")
NAN = float("nan")


class Outcome(NamedTuple):
    """What one program earned.

    Attributes:
        status: one of `OUTCOME_STATUSES` ("invalid": it ran, the submission is unusable).
        reward: `grading.reward` on the reward scale; NaN for "infra_error".
        percentile: leaderboard percentile in [0, 1] when valid, else NaN.
        score: the raw metric value, NaN unless valid.
        seconds: execution seconds to charge to the compute ledger.
        message: why, when something failed.
    """

    status: str
    reward: float
    percentile: float
    score: float
    seconds: float
    message: str = ""


def _floor(status: str, floors) -> float:
    if status == "invalid":
        value = grading.reward(grading.GradeResult(valid=False), floors=floors)
    else:
        value = grading.reward(None, status=status, floors=floors)
    return NAN if value is None else float(value)


def failed_outcome(
    status: str, *, seconds: float = 0.0, message: str = "", floors=grading.DEFAULT_FLOORS
) -> Outcome:
    """The outcome of a program without a valid score: its floor reward, NaN score."""
    if status not in OUTCOME_STATUSES or status == "ok":
        raise ValueError(f"status must be a failure in {OUTCOME_STATUSES}, got {status!r}")
    return Outcome(status, _floor(status, floors), NAN, NAN, float(seconds), message)


def _resolved(outcome: Outcome) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(outcome)
    return future


class SandboxOutcomes:
    """Real execution: program -> executor -> grading -> `Outcome`.

    Args:
        executor: an `Executor` or `ExecutorPool` (anything with
            `submit(source, *, input_dir=, timeout_s=) -> Future[ExecutionResult]`).
        floors: rewards for outcomes without a valid score.
        timeout_s: wall-clock limit; default each task's `limits["wall_seconds"]`.
        close_executor: whether `close()` closes the executor too.
    """

    def __init__(
        self,
        executor,
        *,
        floors: grading.RewardFloors | Mapping = grading.DEFAULT_FLOORS,
        timeout_s: float | None = None,
        close_executor: bool = True,
    ):
        self.executor = executor
        self.floors = floors
        self.timeout_s = timeout_s
        self.close_executor = close_executor

    def submit(self, task: Task, source: str) -> concurrent.futures.Future:
        """Schedules `source` on `task`'s public data; a Future of its `Outcome`."""
        timeout = self.timeout_s or task.limits.get("wall_seconds")
        try:
            inner = self.executor.submit(source, input_dir=task.public_dir, timeout_s=timeout)
        except Exception as e:  # the sandbox could not take it: not the program's fault
            return _resolved(self._infra(f"submit failed: {type(e).__name__}: {e}"))
        outer: concurrent.futures.Future = concurrent.futures.Future()

        def finish(done: concurrent.futures.Future) -> None:
            try:
                outcome = self.outcome(task, done.result())
            except Exception as e:  # an executor or grader bug must not escape as a crash
                outcome = self._infra(f"{type(e).__name__}: {e}")
            outer.set_result(outcome)

        inner.add_done_callback(finish)
        return outer

    def _infra(self, message: str, seconds: float = 0.0) -> Outcome:
        return failed_outcome("infra_error", seconds=seconds, message=message, floors=self.floors)

    def outcome(self, task: Task, result) -> Outcome:
        """Grades one `ExecutionResult` of a program run on `task`."""
        seconds = float(result.wall_seconds)
        if result.status == "infra_error":
            return self._infra(result.message, seconds)
        if result.status != "ok":
            tail = (result.stderr or result.message)[-500:]
            return failed_outcome(result.status, seconds=seconds, message=tail, floors=self.floors)
        name = task.submission.file
        with tempfile.TemporaryDirectory(prefix="wmrl-grade-") as tmp:
            path = None
            if name in result.files:
                path = os.path.join(tmp, os.path.basename(name))
                with open(path, "wb") as f:
                    f.write(result.files[name])
            graded = grading.grade(task, path)
        if not graded.valid:
            message = f"{graded.error_kind}: {graded.message}"
            return failed_outcome("invalid", seconds=seconds, message=message, floors=self.floors)
        reward = grading.reward(graded, floors=self.floors)
        return Outcome("ok", float(reward), graded.percentile, graded.score, seconds)

    def close(self) -> None:
        if self.close_executor:
            self.executor.close()


class ReplayExecutor:
    """Answers recipe programs from a `RecipeTable`, charging the recorded seconds.

    A program is recognised by the digest of its text: every recipe is compiled
    for a task once, and the table must have been built from the same programs
    and the same data (both checked on first sight of a task). The seconds
    charged are the recorded execution seconds plus the recorded interpreter
    start-up, which a sandboxed run pays and the table's in-process build did not.

    Args:
        table: the tabular benchmark.
        floors: rewards for outcomes without a valid score.
    """

    def __init__(
        self,
        table: RecipeTable,
        *,
        floors: grading.RewardFloors | Mapping = grading.DEFAULT_FLOORS,
    ):
        self.table = table
        self.floors = floors
        self._lookup: dict[str, dict[str, int]] = {}
        self._rewards: dict[str, object] = {}
        self.startup_seconds = float(table.meta["startup_seconds"])

    @property
    def fingerprint(self) -> str:
        """What decides this source's answers (the table's digest); a run resumes only
        from checkpoints made with the same fingerprint."""
        return f"replay:{self.table.digest()}"

    def _digests(self, task: Task) -> dict[str, int]:
        if task.id not in self._lookup:
            self.table.check_task(task)
            digests = recipe_digests(task)
            built = self.table.meta["tasks"][task.id]["programs_digest"]
            if programs_digest(digests) != built:
                raise ValueError(
                    f"task {task.id!r}: the recipes now compile to other programs than the "
                    "table was built from; rebuild the table"
                )
            self._lookup[task.id] = {d: i for i, d in enumerate(digests)}
        return self._lookup[task.id]

    def recipe_of(self, task: Task, source: str) -> int:
        """The recipe index whose program for `task` is `source`; ValueError if none."""
        index = self._digests(task).get(source_digest(source))
        if index is None:
            raise ValueError(
                f"task {task.id!r}: the program is not one of the {recipes.NUM_RECIPES} "
                "compiled recipes, so the recipe table cannot answer it (execute it instead)"
            )
        return index

    def submit(self, task: Task, source: str) -> concurrent.futures.Future:
        """An already-resolved Future of the recorded `Outcome` of `source` on `task`."""
        r = self.recipe_of(task, source)
        t = self.table.row(task.id)
        status = STATUS_NAMES[self.table.status[t, r]]
        seconds = float(self.table.seconds[t, r]) + self.startup_seconds
        if status != "ok":
            message = self.table.meta["tasks"][task.id]["messages"].get(str(r), "")
            return _resolved(
                failed_outcome(status, seconds=seconds, message=message, floors=self.floors)
            )
        if task.id not in self._rewards:
            self._rewards[task.id] = self.table.reward(task.id, self.floors)
        pct = float(self.table.percentile(task.id)[r])
        reward = float(self._rewards[task.id][r])
        return _resolved(Outcome("ok", reward, pct, float(self.table.score[t, r]), seconds))

    def lookup(self, task: Task, source: str) -> Outcome:
        """The recorded outcome, as an oracle: studies compare the rewards they feed to
        GRPO with every sample's true reward (nothing is charged; the caller decides)."""
        return self.submit(task, source).result()

    def close(self) -> None:
        """Nothing to release; for the shared submit/close API."""
