"""Held-out evaluation: when a run evaluates (`EvalSchedule`) and what it measures
(`evaluate`: the policy's programs on held-out tasks, executed for real).

Executions made for evaluation are measurement, not training cost: they are
logged (`eval/*`) but not charged to the ledger, so every arm pays the same for
them and compute-to-target compares training cost alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_collections
import numpy as np

from wmrl_jax.agents.base import Agent
from wmrl_jax.envs.outcomes import failed_outcome
from wmrl_jax.envs.task import Task
from wmrl_jax.train.ledger import Ledger


def evaluate(
    agent: Agent, params, tasks: Sequence[Task], source, *, samples: int = 0, key=None
) -> dict[str, float]:
    """Held-out programs executed for real: mean leaderboard percentile (invalid counts 0).

    With `samples == 0`, one greedy program per task; otherwise `samples`
    programs per task from the policy (the expected percentile, a smoother
    measure than greedy's single pick; use the same `key` at every evaluation).
    """
    if samples > 0:
        rollout = agent.rollout(params, tasks, group_size=samples, key=key)
        programs, owners = rollout.programs, [t for t in tasks for _ in range(samples)]
    else:
        programs, owners = agent.greedy_programs(params, tasks), list(tasks)
    # A sample without a program ("") is invalid without running anything.
    futures = [source.submit(t, p) if p else None for t, p in zip(owners, programs, strict=True)]
    outs = [failed_outcome("invalid", message="no program") if f is None else f.result()
            for f in futures]  # fmt: skip
    pct = np.array([o.percentile if o.status == "ok" and np.isfinite(o.percentile) else 0.0
                    for o in outs]).reshape(len(tasks), -1)  # fmt: skip
    result = {
        "eval/heldout_percentile": float(pct.mean()),
        "eval/valid_fraction": float(np.mean([o.status == "ok" for o in outs])),
        "eval/exec_seconds": float(sum(o.seconds for o in outs)),
    }
    per_task = pct.mean(axis=1)
    result.update(
        {f"eval/percentile/{t.id}": float(p) for t, p in zip(tasks, per_task, strict=True)}
    )
    return result


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
