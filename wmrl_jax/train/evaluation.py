"""Held-out evaluation: the policy's programs on held-out tasks, executed for real.

Executions made for evaluation are measurement, not training cost: they are
logged (`eval/*`) but not charged to the ledger, so every arm pays the same for
them and compute-to-target compares training cost alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wmrl_jax.agents.base import Agent
from wmrl_jax.envs.outcomes import failed_outcome
from wmrl_jax.envs.task import Task


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
