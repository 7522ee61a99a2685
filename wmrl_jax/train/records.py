"""What each stage of a training step returns: small frozen records, composed per step.

    sampled → wm → anchors → execution → fed → (update) → ledger

Each stage (`wmrl_jax.train.loop.Trainer._step`, `wmrl_jax.train.rewards.Rewarder`)
returns its own record, built whole when the stage ends; nothing is filled in
later. The step composes them into a `StepRecord`, which step hooks (the
studies' oracle metrics) and the step's metrics (`stages.step_metrics`) read.
Arrays are host numpy with rows task-major: row i belongs to
``tasks[i // group_size]``.

Example:
    >>> sampled = Sampled(step=1, tasks=(task,), group_size=4, rollout=rollout)
    >>> anchors = rewarder.choose_anchors(sampled, wm, extra, key)
    >>> execution = Execution.of(collected, num_rows=sampled.num_rows)
    >>> fed, extra = rewarder.correct(sampled, wm, anchors, execution, extra)
    >>> StepRecord(sampled, wm, anchors, execution, fed, ledger).fed.rewards
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train.ledger import Ledger

__all__ = ["Anchors", "Execution", "Fed", "Sampled", "StepRecord", "no_program_rows"]


def no_program_rows(rollout: Rollout) -> np.ndarray:
    """[N] bool: rows whose sample holds no program (`Rollout.causes`).

    Such a row is an invalid outcome known without running anything: it is never
    submitted, charged nothing, and fed the invalid floor in every arm.
    """
    if not rollout.causes:
        return np.zeros(len(rollout.programs), bool)
    return np.array([c != "ok" for c in rollout.causes], bool)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """The rollout stage: the step's tasks and the programs sampled for them.

    Attributes:
      step: the step number (1-based).
      tasks: the step's tasks; row i belongs to tasks[i // group_size].
      group_size: G.
      rollout: the sampled programs and their train batch.
      stale: the batch was sampled ahead, before the last update (`config.overlap`).
    """

    step: int
    tasks: tuple
    group_size: int
    rollout: Rollout
    stale: bool = False

    @property
    def num_rows(self) -> int:
        return len(self.rollout.programs)

    @property
    def num_groups(self) -> int:
        return self.num_rows // self.group_size

    @property
    def no_program(self) -> np.ndarray:
        """[N] bool: rows whose sample holds no program (`no_program_rows`)."""
        return no_program_rows(self.rollout)


@dataclasses.dataclass(frozen=True)
class Anchors:
    """The anchor choice: which groups are executed for real.

    Attributes:
      groups: bool [num_groups], the groups executed for real.
      weights: [num_groups] the weight of each anchor group's pairs in the map's
        fit (1/π under the "active" policy, else 1).
      fraction: ρ_t of an adaptive-ρ arm (`wmrl_jax.core.rho`); None where ρ is
        the config's fixed fraction.
    """

    groups: np.ndarray
    weights: np.ndarray
    fraction: float | None = None

    def rows(self, sampled: Sampled) -> np.ndarray:
        """The anchor groups' rows that hold a program (the others have nothing to run)."""
        rows = np.flatnonzero(np.repeat(self.groups, sampled.group_size))
        return rows[~sampled.no_program[rows]]


@dataclasses.dataclass(frozen=True)
class Execution:
    """The execution stage: the outcomes that came back, as real rewards per row.

    Attributes:
      results: {row: Outcome} of the executions that count.
      counts: infrastructure errors, dropped rows, rejected rewards, cached answers.
      real: [N] real rewards, NaN where not executed.
      executed: [N] bool, rows with a real reward.
      partner: [N] another replicate's real reward of the row's program, NaN
        where none (see `execution.Collected.partners`).
    """

    results: Mapping[int, Outcome]
    counts: Mapping[str, int]
    real: np.ndarray
    executed: np.ndarray
    partner: np.ndarray

    @classmethod
    def of(cls, results: Mapping[int, Outcome], counts: Mapping[str, int],
           partners: Mapping[int, Outcome], *, num_rows: int) -> Execution:  # fmt: skip
        """The record of `results` and `partners` ({row: Outcome}) over `num_rows` rows."""
        real = np.full(num_rows, np.nan, np.float32)
        executed = np.zeros(num_rows, bool)
        for i, out in results.items():
            real[i], executed[i] = out.reward, True
        partner = np.full(num_rows, np.nan, np.float32)
        for i, p in partners.items():
            partner[i] = p.reward
        return cls(dict(results), dict(counts), real, executed, partner)


@dataclasses.dataclass(frozen=True)
class Fed:
    """The reward stage: what GRPO is fed, and which rows count.

    Attributes:
      rewards: [N] the rewards fed to GRPO.
      valid: [N] bool, rows that enter the group statistics and the loss.
      debiased: [N] the world model's predictions under the map fitted before
        this step (the WM-only stream); None for arms without a world model.
      advantages: [N] the advantages of an arm that forms its own
        (`Arm.estimator` "ppi" or "weighted", `wmrl_jax.core.ppi`); None: the
        group advantages of ``rewards`` (`stages.advantages`).
      diagnostics: the correction's (and the reliability's) scalars; empty
        without a world model.
    """

    rewards: np.ndarray
    valid: np.ndarray
    debiased: np.ndarray | None = None
    advantages: np.ndarray | None = None
    diagnostics: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One finished step: its stage records, in order.

    Attributes:
      sampled: the tasks and the rollout.
      wm: the world model's predictions; None for arms without a world model.
      anchors: the groups executed for real.
      execution: the outcomes and real rewards.
      fed: the fed rewards, their validity, and the correction's diagnostics.
      ledger: the step's compute.
    """

    sampled: Sampled
    wm: WMOutput | None
    anchors: Anchors
    execution: Execution
    fed: Fed
    ledger: Ledger = Ledger()

    @property
    def step(self) -> int:
        return self.sampled.step

    @property
    def tasks(self) -> tuple:
        return self.sampled.tasks

    @property
    def group_size(self) -> int:
        return self.sampled.group_size

    @property
    def rollout(self) -> Rollout:
        return self.sampled.rollout

    @property
    def num_rows(self) -> int:
        return self.sampled.num_rows
