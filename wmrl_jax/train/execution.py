"""Real execution for the trainer: the outcome-source protocol, retries, and rejected rewards.

An outcome source turns (task, program) into a graded `Outcome` — a sandbox
that executes and grades (`envs.outcomes.SandboxOutcomes`) or the recipe
table's replay (`envs.outcomes.ReplayExecutor`). `Runner` submits a step's
anchors at once, retries infrastructure errors, and drops (and counts) what
cannot be trusted: infrastructure errors after the retries and non-finite
rewards. Failures of the *program* (crash, timeout, invalid output) are
rewards, never dropped.

Replicates and the execution cache. A program's result varies with its seeds
(model seed, validation split): an outcome source declares `num_replicates`,
R, and executes replicate k of a program on request. The n-th request of a
(task, program) in a run gets replicate `(offset + n) mod R`, where the offset
is drawn from the run seed and the pair (so seeds of a study see different
replicates first). A replicate already executed in this run is answered from
the run's cache and charged nothing, so a run pays at most R executions per
distinct program; with R = 1 a program is executed once (and a pair sampled
twice in one step once). Every arm uses the same cache, so arms pay for
unique executions only; `executions` (charged) and `cached` (answered from
the cache) are reported apart. A fresh execution of a program whose other
replicate is already known comes back with that replicate as its *partner*:
the pair estimates σ²_real, the real outcome noise the fusion weighs. The
cache travels with the checkpoints.

`Executions` is the trainer's execution stage: the source, the runner and the
infrastructure watch, for the step's anchors and the held-out evaluations.
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
from wmrl_jax.train import multihost
from wmrl_jax.train.evaluation import InfraWatch, evaluate
from wmrl_jax.train.ledger import LedgerStep
from wmrl_jax.train.records import Anchors, Execution, Sampled
from wmrl_jax.train.sections import ExecutorSection

log = logging.getLogger(__name__)


class OutcomeSource(Protocol):
    """Where real outcomes come from.

    Attributes:
      fingerprint: a content digest of whatever decides the answers (a replay
        table), checked when a run resumes; None for sources that execute.
      num_replicates: R, the distinct executions a program has (seeds it runs
        under); `submit` takes `replicate` in [0, R).
    """

    fingerprint: str | None
    num_replicates: int

    def submit(self, task: Task, source: str, *, replicate: int = 0) -> concurrent.futures.Future:
        """Starts replicate `replicate` of `source` on `task`; the result is an `Outcome`."""
        ...

    def close(self) -> None:
        """Releases workers and sandboxes."""
        ...


@dataclasses.dataclass
class Collected:
    """A step's executions, once they are back.

    Attributes:
      outcomes: {row: Outcome} of the rows with a trustworthy result.
      partners: {row: Outcome}, for rows freshly executed whose program has
        another replicate known in this run: that replicate (finite rewards
        only), so that each pair is seen once.
      counts: "infra_errors" (failed attempts), "dropped" (rows given up on),
        "nonfinite" (rows whose reward was NaN or infinite), "cached" (rows
        answered from the cache or by another row of the step).
      executions: programs executed and charged (retries included).
      exec_seconds: their summed execution seconds.
    """

    outcomes: dict[int, Outcome]
    partners: dict[int, Outcome]
    counts: dict[str, int]
    executions: int
    exec_seconds: float


def cache_key(task: Task, program: str) -> tuple[str, str]:
    """What identifies a program: the task and the sha256 of the program's text."""
    return task.id, hashlib.sha256(program.encode()).hexdigest()


def first_replicate(key: tuple[str, str], seed: int, num_replicates: int) -> int:
    """The replicate a run's first request of `key` gets: a hash of (seed, key) mod R."""
    digest = hashlib.sha256(f"{seed}:{key[0]}:{key[1]}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % num_replicates


class Runner:
    """Runs a step's anchors: replicates, cache, retries, rejected rewards.

    Args:
      source: the `OutcomeSource`.
      retries: resubmissions of a program whose execution failed for
        infrastructure reasons.
      on_infra_error: "wm_only" (drop the row: it keeps its world-model reward)
        or "raise" (stop training).
      cache: answer a replicate already executed in this run from the cache.
      seed: the run seed, which decides each program's first replicate.
    """

    def __init__(
        self,
        source: OutcomeSource,
        *,
        retries: int,
        on_infra_error: str,
        cache: bool = True,
        seed: int = 0,
    ):
        self.source, self.retries, self.on_infra_error = source, retries, on_infra_error
        self.use_cache, self.seed = cache, seed
        self.num_replicates = int(source.num_replicates)
        if self.num_replicates < 1:
            raise ValueError(f"an outcome source needs num_replicates >= 1, got {source!r}")
        self.cache: dict[tuple[str, str], dict[int, Outcome]] = {}
        self.requests: dict[tuple[str, str], int] = {}
        self.last_infra_message = ""  # Why the last execution given up on failed.

    def _next_replicate(self, key: tuple[str, str]) -> int:
        n = self.requests.get(key, 0)
        self.requests[key] = n + 1
        return (first_replicate(key, self.seed, self.num_replicates) + n) % self.num_replicates

    def submit(
        self, tasks: Sequence[Task], programs: Sequence[str], rows: Sequence[int], g: int
    ) -> dict[int, tuple[tuple, concurrent.futures.Future | None]]:
        """Starts `programs[i]` (of task `tasks[i // g]`) for every row i in `rows`.

        Returns `{row: ((key, replicate), future)}`; the future is None where the
        cache or an earlier row of this step answers the row.
        """
        pending, started = {}, set()
        for i in map(int, rows):
            key = cache_key(tasks[i // g], programs[i])
            k = self._next_replicate(key)
            known = self.use_cache and (k in self.cache.get(key, {}) or (key, k) in started)
            if known:
                pending[i] = ((key, k), None)
                continue
            started.add((key, k))
            pending[i] = ((key, k), self.source.submit(tasks[i // g], programs[i], replicate=k))
        return pending

    def _result(self, fut, task: Task, program: str, k: int, counts: dict) -> tuple:
        """`(outcome or None when dropped, attempts)` of one submitted execution."""
        out, attempts = fut.result(), 1
        for _ in range(self.retries):
            if out.status != "infra_error":
                break
            counts["infra_errors"] += 1
            out = self.source.submit(task, program, replicate=k).result()
            attempts += 1
        if out.status != "infra_error":
            return out, attempts
        counts["infra_errors"] += 1
        self.last_infra_message = out.message
        if self.on_infra_error == "raise":
            raise RuntimeError(f"sandbox infrastructure error, retries spent: {out.message}")
        return None, attempts

    def collect(
        self, pending: dict, tasks: Sequence[Task], programs: Sequence[str], g: int
    ) -> Collected:
        """Waits for the rows of `submit`; dropped rows are absent from the outcomes."""
        counts = {"infra_errors": 0, "dropped": 0, "nonfinite": 0, "cached": 0}
        results: dict[tuple, Outcome | None] = {}
        partners: dict[int, Outcome] = {}
        executions, seconds = 0, 0.0
        for i, ((key, k), fut) in pending.items():
            if fut is None:
                continue
            out, attempts = self._result(fut, tasks[i // g], programs[i], k, counts)
            executions += attempts
            results[key, k] = out
            if out is None:
                continue
            seconds += float(out.seconds)
            known = self.cache.setdefault(key, {})
            others = [o for j, o in known.items() if j != k and np.isfinite(o.reward)]
            if others and np.isfinite(out.reward):
                partners[i] = others[-1]
            known[k] = out  # The seconds are charged; the result is kept even without cache.
        done = {}
        for i, ((key, k), fut) in pending.items():
            out = results.get((key, k), self.cache.get(key, {}).get(k))
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
        return Collected(done, partners, counts, executions, seconds)

    def cache_state(self) -> dict:
        """The cache as strict JSON: rows `[task_id, digest, replicate, *Outcome]` (NaN
        as None) and the request counts `[task_id, digest, n]`."""

        def plain(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        rows = [
            [*key, k, *map(plain, out)]
            for key, outs in self.cache.items()
            for k, out in outs.items()
        ]
        return {"outcomes": rows, "requests": [[*key, n] for key, n in self.requests.items()]}

    def restore_cache(self, state: dict | Sequence) -> None:
        """Inverse of `cache_state`; a list of rows `[task_id, digest, *Outcome]` (the
        format before replicates) restores replicate 0 of each."""
        if not isinstance(state, dict):
            state = {"outcomes": [[r[0], r[1], 0, *r[2:]] for r in state], "requests": []}
        self.cache = {}
        for r in state["outcomes"]:
            out = Outcome(*(math.nan if v is None else v for v in r[3:]))
            self.cache.setdefault((r[0], r[1]), {})[int(r[2])] = out
        self.requests = {(r[0], r[1]): int(r[2]) for r in state["requests"]}

    def remembered(
        self, tasks: Sequence[Task], programs: Sequence[str], g: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Anchor memory: per row, the mean finite reward of the program's replicates
        executed so far in the run, and how many (NaN and 0 where none), shape [N]."""
        mean = np.full(len(programs), np.nan, np.float32)
        count = np.zeros(len(programs), np.float32)
        for i, program in enumerate(programs):
            known = self.cache.get(cache_key(tasks[i // g], program), {})
            rewards = [o.reward for o in known.values() if np.isfinite(o.reward)]
            if rewards:
                mean[i], count[i] = np.mean(rewards), len(rewards)
        return mean, count


class Executions:
    """The run's execution stage: the outcome source (shared across processes), the
    `Runner` (replicates, cache, retries) and the infrastructure watch, together.

    Args:
      source: the outcome source (`multihost.SharedOutcomes`: process 0 executes).
      executor: the executor settings (`sections.ExecutorSection`).
      seed: the run seed (each program's first replicate).
    """

    def __init__(self, source, executor: ExecutorSection, *, seed: int):
        self.source = source
        self.runner = Runner(
            source, retries=executor.infra_retries, on_infra_error=executor.on_infra_error,
            cache=executor.cache, seed=seed,
        )  # fmt: skip
        self.watch = InfraWatch(executor.max_infra_steps)

    def submit(self, sampled: Sampled, anchors: Anchors) -> dict:
        """Starts the anchor groups' programs (`Runner.submit`)."""
        return self.runner.submit(
            list(sampled.tasks), sampled.rollout.programs, anchors.rows(sampled),
            sampled.group_size,
        )  # fmt: skip

    def collect(self, sampled: Sampled, pending: dict, timing: LedgerStep) -> Execution:
        """The execution stage's record: waits for `pending` with process 0's answers
        everywhere, reports the infrastructure errors to the watch and charges the
        executions, and the step's samples and generated tokens, to `timing`."""
        g, tasks, programs = sampled.group_size, list(sampled.tasks), sampled.rollout.programs
        got = self.source.exchange(lambda: self.runner.collect(pending, tasks, programs, g))
        self.watch.observe(
            attempts=got.executions, failed=got.counts["infra_errors"],
            where=f"step {sampled.step}", message=self.runner.last_infra_message,
        )  # fmt: skip
        timing.add(
            gen_tokens=sampled.rollout.gen_tokens, samples=sampled.num_rows,
            executions=got.executions, exec_seconds=got.exec_seconds,
            cached=got.counts["cached"],
        )  # fmt: skip
        return Execution.of(got.outcomes, got.counts, got.partners, num_rows=sampled.num_rows)

    def evaluate(self, agent, params, tasks: Sequence[Task], *, samples: int, key) -> dict:
        """A held-out evaluation (`evaluation.evaluate`), executed by process 0, its
        infrastructure errors reported to the watch."""
        result = evaluate(
            agent, params, tasks, self.source.evaluation_source(), samples=samples, key=key,
            retries=self.runner.retries,
        )  # fmt: skip
        result = multihost.agree(result)  # Executed on process 0.
        self.watch.observe(
            attempts=int(result["eval/executions"]), failed=int(result["eval/infra_errors"]),
            where="a held-out evaluation",
        )  # fmt: skip
        return result
