"""Held-out evaluation: when a run evaluates (`EvalSchedule`) and what it measures
(`evaluate`: the policy's programs on held-out tasks, executed for real).

Executions made for evaluation are measurement, not training cost: they are
logged (`eval/*`) but not charged to the ledger, so every arm pays the same for
them and compute-to-target compares training cost alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import ml_collections
import numpy as np

from wmrl_jax.agents.base import Agent
from wmrl_jax.envs.outcomes import Outcome, failed_outcome
from wmrl_jax.envs.task import Task
from wmrl_jax.train.ledger import Ledger

log = logging.getLogger(__name__)


def _result(source, task: Task, program: str, future, retries: int) -> Outcome:
    """One execution's outcome, resubmitted up to `retries` times after an infra error."""
    out = future.result()
    for _ in range(retries):
        if out.status != "infra_error":
            break
        out = source.submit(task, program).result()
    return out


def evaluate(
    agent: Agent, params, tasks: Sequence[Task], source, *, samples: int = 0, key=None,
    retries: int = 0,
) -> dict[str, float]:  # fmt: skip
    """Held-out programs executed for real: mean leaderboard percentile (invalid counts 0).

    With `samples == 0`, one greedy program per task; otherwise `samples`
    programs per task from the policy (the expected percentile, a smoother
    measure than greedy's single pick; use the same `key` at every evaluation).

    An execution that ends in an infrastructure error (the sandbox's fault,
    not the program's) is resubmitted up to `retries` times; one that still
    fails is masked: it counts neither as 0 nor at all. A task's percentile is
    the mean of its usable executions, the held-out percentile the mean over
    the tasks that have one, and NaN when none has (`eval/infra_errors`
    counts the masked executions).
    """
    if samples > 0:
        rollout = agent.rollout(params, tasks, group_size=samples, key=key)
        programs, owners = rollout.programs, [t for t in tasks for _ in range(samples)]
    else:
        programs, owners = agent.greedy_programs(params, tasks), list(tasks)
    # A sample without a program ("") is invalid without running anything.
    futures = [source.submit(t, p) if p else None for t, p in zip(owners, programs, strict=True)]
    outs = [failed_outcome("invalid", message="no program") if f is None
            else _result(source, t, p, f, retries)
            for t, p, f in zip(owners, programs, futures, strict=True)]  # fmt: skip
    usable = np.array([o.status != "infra_error" for o in outs])
    pct = np.array([o.percentile if o.status == "ok" and np.isfinite(o.percentile) else 0.0
                    for o in outs])  # fmt: skip
    pct = np.where(usable, pct, np.nan).reshape(len(tasks), -1)
    counted = usable.reshape(len(tasks), -1).any(axis=1)
    # Masked executions leave the means; a task with none usable has no percentile.
    per_task = np.full(len(tasks), np.nan)
    per_task[counted] = np.nanmean(pct[counted], axis=1)
    ok = np.array([o.status == "ok" for o in outs])
    if not usable.all():
        message = str(next(o.message for o in outs if o.status == "infra_error") or "")
        log.warning(
            "%d held-out executions failed for infrastructure reasons after %d retries; "
            "masked out of the held-out percentile (%s)",
            int((~usable).sum()), retries, " ".join(message.split())[:200],
        )  # fmt: skip
    result = {
        "eval/heldout_percentile": float(per_task[counted].mean()) if counted.any() else math.nan,
        "eval/valid_fraction": float(ok[usable].mean()) if usable.any() else math.nan,
        "eval/exec_seconds": float(sum(o.seconds for o in outs)),
        "eval/infra_errors": float((~usable).sum()),
        "eval/executions": float(sum(f is not None for f in futures)),
    }
    result.update(
        {f"eval/percentile/{t.id}": float(p) for t, p in zip(tasks, per_task, strict=True)}
    )
    return result


class ExecutionFailure(RuntimeError):
    """Every execution of several steps and evaluations in a row was an infrastructure
    error: the executor cannot run programs, and training on would report nothing real."""


class InfraWatch:
    """Stops a run whose executor runs nothing: `limit` consecutive steps or
    evaluations whose every execution (retries included) ended in an
    infrastructure error raise `ExecutionFailure`, in one line.

    A step or evaluation that executed nothing (all answered by the cache, or
    an arm without executions) leaves the count as it is; one usable
    execution resets it.

    Args:
      limit: the consecutive all-failed steps or evaluations that stop the run; 0: never.
    """

    def __init__(self, limit: int):
        self.limit, self.streak = int(limit), 0

    def observe(self, *, attempts: int, failed: int, where: str, message: str = "") -> None:
        """Counts one step's or evaluation's `attempts` executions, `failed` of them
        infrastructure errors; raises `ExecutionFailure` at the limit."""
        if attempts <= 0:
            return
        if failed < attempts:
            self.streak = 0
            return
        self.streak += 1
        if self.limit and self.streak >= self.limit:
            why = f" (the last: {' '.join(str(message).split())[:200]})" if message else ""
            raise ExecutionFailure(
                f"every execution of the last {self.streak} steps or evaluations, up to "
                f"{where}, was an infrastructure error after retries{why}: the executor "
                "cannot run programs; check config.executor and the sandbox backend"
            )


class EvalSchedule:
    """When a run evaluates and when it stops: by steps, or by compute spent.

    Without a budget: every `eval_every` steps and at `num_steps`. With
    `budget.compute_seconds` B: whenever the ledger first reaches one of the
    points B·k/`eval_points` (k = 1..), the same grid for every arm, and the
    run stops once B is spent.
    """

    def __init__(self, config: ml_collections.ConfigDict):
        self.every = int(config.eval_every)
        self.budget = float(config.budget.compute_seconds)
        self.points = int(config.budget.eval_points)

    def spent(self, ledger: Ledger) -> bool:
        """The budget is used up (never, without one)."""
        return self.budget > 0 and ledger.compute_seconds >= self.budget

    def due(self, step: int, ledger: Ledger, history: Sequence[dict]) -> bool:
        """This step is an evaluation point."""
        if self.budget <= 0:
            return step % self.every == 0
        last = history[-1] if history else {}
        fields = ("gen_seconds", "wm_seconds", "exec_seconds", "tool_seconds")
        spent_then = sum(float(last.get(k, 0.0)) for k in fields)
        grid = self.budget / self.points
        return int(ledger.compute_seconds // grid) > int(spent_then // grid)
