"""Program -> outcome: real execution and grading, or a replay from the recipe table.

Free-form programs and recipe programs share everything downstream of the
program text: both go through `submit(task, source, *, replicate=0) ->
Future[Outcome]`. `SandboxOutcomes` runs the program on an executor (or
`ExecutorPool`) and grades the submission it writes; `ReplayExecutor` answers
recipe programs from the tabular benchmark and charges the compute they cost
when they were executed.

Replicates: one program executed twice on the same data may score twice
differently (model seeds, validation splits). Every execution carries a
replicate index, a non-negative integer the program reads from the environment
variable `recipes.REPLICATE_ENV` (`WMRL_REPLICATE`) and seeds itself with;
recipe programs do. The same (task, program, replicate) gives the same outcome,
so a caller's execution cache keys on all three; the true reward of a program
is its mean over replicates (`ReplayExecutor.lookup`).

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
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

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


# The program's file name beside the launcher that sets its replicate index.
PROGRAM_FILE = "program.py"
_LAUNCHER = """import os
import runpy

os.environ[{env}] = {value}
runpy.run_path({program}, run_name="__main__")
"""


def with_replicate(source: str, replicate: int) -> tuple[str, dict[str, str]]:
    """A launcher that runs `source` with `recipes.REPLICATE_ENV` set to `replicate`.

    Executors take a program and extra files but no environment, so the
    program goes in as `PROGRAM_FILE` and a three-line launcher sets the
    variable and runs it as `__main__`. Executor caches key on both, so each
    replicate is its own entry.

    Returns:
        (launcher source, {PROGRAM_FILE: source}): the `source` and `files`
        arguments of an executor's `submit`.
    """
    value = check_replicate(replicate)
    launcher = _LAUNCHER.format(
        env=json.dumps(recipes.REPLICATE_ENV), value=json.dumps(str(value)),
        program=json.dumps(PROGRAM_FILE),
    )  # fmt: skip
    return launcher, {PROGRAM_FILE: source}


def check_replicate(replicate: int) -> int:
    """`replicate` as an int; ValueError unless it is a non-negative integer."""
    if isinstance(replicate, bool) or not isinstance(replicate, int | np.integer):
        raise ValueError(f"replicate must be a non-negative integer, got {replicate!r}")
    if replicate < 0:
        raise ValueError(f"replicate must be a non-negative integer, got {replicate}")
    return int(replicate)


def tasks_fingerprint(tasks: Sequence[Task]) -> str:
    """A digest (16 hex digits of a sha256) over the tasks' ids and their
    `grading.grader_digest`s, in any order: it changes when any task's answers,
    boards or grading fields change."""
    h = hashlib.sha256()
    for task_id, digest in sorted((t.id, grading.grader_digest(t)) for t in tasks):
        h.update(f"{task_id}\0{digest}\0".encode())
    return f"task answers, boards and grading fields {h.hexdigest()[:16]}"


def _resolved(outcome: Outcome) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(outcome)
    return future


class SandboxOutcomes:
    """Real execution: program -> executor -> grading -> `Outcome`.

    Args:
        executor: an `Executor` or `ExecutorPool` (anything with
            `submit(source, *, input_dir=, timeout_s=, files=) -> Future[ExecutionResult]`).
        floors: rewards for outcomes without a valid score.
        timeout_s: wall-clock limit; default each task's `limits["wall_seconds"]`.
        close_executor: whether `close()` closes the executor too.
        num_replicates: the seeds a program may run under (`submit`'s
            `replicate` in [0, num_replicates)).
        tasks: the tasks the run grades on; their grader side decides outcomes
            and enters `fingerprint`.

    Attributes:
        fingerprint: `tasks_fingerprint(tasks)`, a digest of the tasks' grader
            side (the trainer's resume guard compares it, so that a run whose
            answers, boards or grading config were edited is not resumed on
            outcomes graded before the edit); None without tasks.
    """

    def __init__(
        self,
        executor,
        *,
        floors: grading.RewardFloors | Mapping = grading.DEFAULT_FLOORS,
        timeout_s: float | None = None,
        close_executor: bool = True,
        num_replicates: int = 1,
        tasks: Sequence[Task] = (),
    ):
        self.fingerprint = tasks_fingerprint(tasks) if tasks else None
        self.num_replicates = check_replicate(num_replicates)
        if self.num_replicates < 1:
            raise ValueError(f"num_replicates must be >= 1, got {num_replicates}")
        self.executor = executor
        self.floors = floors
        self.timeout_s = timeout_s
        self.close_executor = close_executor

    def submit(self, task: Task, source: str, *, replicate: int = 0) -> concurrent.futures.Future:
        """Schedules `source` on `task`'s public data; a Future of its `Outcome`.

        The program runs with `recipes.REPLICATE_ENV` set to `replicate`
        (`with_replicate`); ValueError unless it is a non-negative integer.
        """
        timeout = self.timeout_s or task.limits.get("wall_seconds")
        launcher, files = with_replicate(source, replicate)
        try:
            inner = self.executor.submit(
                launcher, input_dir=task.public_dir, timeout_s=timeout, files=files
            )
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
    and the same data (both checked on first sight of a task). `submit` answers
    the recorded execution of the given replicate (in [0, `num_replicates`));
    `lookup` is the oracle, the replicate mean. The seconds charged are the
    recorded execution seconds plus the recorded interpreter start-up, which a
    sandboxed run pays and the table's in-process build did not.

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
    def num_replicates(self) -> int:
        """Replicates recorded per (task, recipe); `submit` takes indices below it."""
        return self.table.num_replicates

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

    def submit(self, task: Task, source: str, *, replicate: int = 0) -> concurrent.futures.Future:
        """An already-resolved Future of the recorded `Outcome` of `source` on `task`
        in replicate `replicate`; ValueError for a replicate the table lacks."""
        k = self.table.check_replicate(check_replicate(replicate))
        r = self.recipe_of(task, source)
        t = self.table.row(task.id)
        status = STATUS_NAMES[self.table.status[t, r, k]]
        seconds = float(self.table.seconds[t, r, k]) + self.startup_seconds
        if status != "ok":
            message = self.table.meta["tasks"][task.id]["messages"].get(f"{r}/{k}", "")
            return _resolved(
                failed_outcome(status, seconds=seconds, message=message, floors=self.floors)
            )
        reward = float(self._replicate_rewards(task.id)[r, k])
        pct = float(self.table.replicate_percentile(task.id)[r, k])
        return _resolved(Outcome("ok", reward, pct, float(self.table.score[t, r, k]), seconds))

    def _replicate_rewards(self, task_id: str) -> np.ndarray:
        if task_id not in self._rewards:
            self._rewards[task_id] = self.table.replicate_reward(task_id, self.floors)
        return self._rewards[task_id]

    def lookup(self, task: Task, source: str) -> Outcome:
        """The oracle: the recipe's true outcome, its mean over the recorded replicates.

        Studies compare the rewards they feed to GRPO with every sample's true
        reward; nothing is charged (the caller decides). reward, seconds: the
        replicate means; percentile, score: means over the valid replicates
        (NaN when none is valid); status: the most frequent replicate status
        (ties to the earlier name in `STATUS_NAMES`, "ok" first).
        """
        r = self.recipe_of(task, source)
        t = self.table.row(task.id)
        codes = self.table.status[t, r]
        status = STATUS_NAMES[int(np.argmax(np.bincount(codes, minlength=len(STATUS_NAMES))))]
        valid = codes == 0
        score = float(self.table.score[t, r][valid].mean()) if valid.any() else NAN
        return Outcome(
            status,
            float(self._replicate_rewards(task.id)[r].mean()),
            float(self.table.percentile(task.id)[r]),
            score,
            float(self.table.seconds[t, r].mean()) + self.startup_seconds,
        )

    def reward_mean(self, task: Task, source: str) -> float:
        """The program's true reward: the mean of its replicates' rewards."""
        return float(self._replicate_rewards(task.id)[self.recipe_of(task, source)].mean())

    def reward_var(self, task: Task, source: str) -> float:
        """The variance (ddof=1) of the program's reward over its replicates; NaN with one."""
        rewards = self._replicate_rewards(task.id)[self.recipe_of(task, source)]
        return float(rewards.var(ddof=1)) if rewards.size > 1 else NAN

    def close(self) -> None:
        """Nothing to release; for the shared submit/close API."""
