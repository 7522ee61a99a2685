"""One training step as named stages, each a function a reader can find and test.

    rollout → world-model pass → anchor choice → execution → correction → update → ledger

`Trainer._step` (`wmrl_jax.train.loop`) calls them in this order and keeps
what each produced in a `StepRecord`; step hooks (the studies' oracle
metrics) read the finished record. The stages here are the pure or host-only
parts: what goes into the fed rewards, which rows count, the advantages, the
step's metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.agents.programs import PROGRAM_CAUSES
from wmrl_jax.core import arms as core_arms
from wmrl_jax.core import grpo
from wmrl_jax.envs.task import Task
from wmrl_jax.train.arms import Arm
from wmrl_jax.train.ledger import Ledger, LedgerStep

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepRecord:
    """What one step produced, stage by stage (host numpy, rows task-major).

    Attributes:
      step: the step number (1-based).
      tasks: the step's tasks; row i belongs to tasks[i // group_size].
      group_size: G.
      rollout: the sampled programs and their train batch.
      wm: world-model predictions, None for arms without a world model.
      anchor_groups: bool [num_groups], the groups executed for real.
      anchor_weights: [num_groups] the weight of each anchor group's pairs in
        the map's fit (1/π under the "active" policy, else 1).
      anchor_fraction: ρ_t of an adaptive-ρ arm (`wmrl_jax.core.rho`), else None.
      outcomes: {row: Outcome} of the executions that count.
      exec_counts: infrastructure errors, dropped rows and rejected rewards.
      real: [N] real rewards, NaN where not executed.
      executed: [N] bool, rows with a real reward.
      partner: [N] another replicate's real reward of the row's program, NaN
        where none (see `execution.Collected.partners`).
      debiased: [N] the world model's predictions under the map fitted before
        this step (the WM-only stream), None without a world model.
      rewards: [N] the rewards fed to GRPO.
      valid: [N] bool, rows that enter the group statistics and the loss.
      advantages: [N] the advantages of an arm that forms its own
        (`Arm.estimator` "ppi" or "weighted", `wmrl_jax.core.ppi`); None: the
        group advantages of ``rewards`` (`advantages`).
      correction: the correction's diagnostics (empty without a world model).
      ledger: the step's compute.
    """

    step: int
    tasks: list[Task]
    group_size: int
    rollout: Rollout | None = None
    wm: WMOutput | None = None
    anchor_groups: np.ndarray | None = None
    anchor_weights: np.ndarray | None = None
    anchor_fraction: float | None = None
    outcomes: dict = dataclasses.field(default_factory=dict)
    exec_counts: dict = dataclasses.field(default_factory=dict)
    real: np.ndarray | None = None
    executed: np.ndarray | None = None
    partner: np.ndarray | None = None
    debiased: np.ndarray | None = None
    rewards: np.ndarray | None = None
    valid: np.ndarray | None = None
    advantages: np.ndarray | None = None
    correction: dict = dataclasses.field(default_factory=dict)
    ledger: Ledger = Ledger()

    @property
    def num_rows(self) -> int:
        return len(self.rollout.programs)


def charge_rollout(timing: LedgerStep, rollout: Rollout, seconds: float) -> None:
    """Charges a rollout that took `seconds` of wall time to `timing`.

    Generation is charged the wall seconds less those spent waiting on sandbox
    tools (multi-turn episodes); the tools are charged their own sandbox
    seconds (`tool_seconds`), like executions, and counted (`tool_calls`).
    """
    timing.add(
        gen_seconds=max(float(seconds) - float(rollout.tool_wait_seconds), 0.0),
        tool_calls=float(rollout.tool_calls),
        tool_seconds=float(rollout.tool_seconds),
    )


def step_tasks(tasks: Sequence[Task], *, seed: int, step: int, count: int) -> list[Task]:
    """The tasks of one step, a pure function of (seed, step).

    Without replacement when `count <= len(tasks)`; otherwise every task
    appears `count // len(tasks)` or one more times (one group each).
    """
    rng = np.random.default_rng([seed, step])
    reps = -(-count // len(tasks))
    idx = np.concatenate([rng.permutation(len(tasks)) for _ in range(reps)])[:count]
    return [tasks[i] for i in sorted(idx)]


def group_scores(record: StepRecord, score: str, debiased: np.ndarray | None) -> np.ndarray:
    """Per-group anchor scores of shape [num_groups], over rows holding a program.

    "uncertainty": the group's mean WM variance (inf where a prediction is
    unusable: most uncertain); "exploit": the group's best debiased
    prediction. A group without any program scores -inf (nothing to run).
    """
    g = record.group_size
    missing = no_program_rows(record.rollout).reshape(-1, g)
    if score == "uncertainty":
        values = np.asarray(record.wm.var, np.float64).reshape(-1, g)
        values = np.where(np.isnan(values), np.inf, values)
        pool = np.mean
    else:
        values = np.asarray(debiased, np.float64).reshape(-1, g)
        values = np.where(np.isfinite(values), values, -np.inf)
        pool = np.max
    out = np.full(len(values), -np.inf)
    some = ~missing.all(axis=1)
    for i in np.flatnonzero(some):
        out[i] = pool(values[i][~missing[i]])
    return out


def task_ids(tasks: Sequence[Task], g: int) -> np.ndarray:
    """[N] int32: a stable id per row's task (a hash of the task's id), for the local
    correction's "same task"."""
    ids = [zlib.crc32(str(t.id).encode()) & 0x7FFFFFFF for t in tasks]
    return np.repeat(np.asarray(ids, np.int64), g).astype(np.int32)


def real_rewards(outcomes: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`(real, executed)` of shape [n]: each executed row's reward, NaN elsewhere."""
    real = np.full(n, np.nan, np.float32)
    executed = np.zeros(n, bool)
    for i, out in outcomes.items():
        real[i], executed[i] = out.reward, True
    return real, executed


def partner_rewards(partners: dict, n: int) -> np.ndarray:
    """[n]: each row's partner replicate reward, NaN where it has none."""
    out = np.full(n, np.nan, np.float32)
    for i, p in partners.items():
        out[i] = p.reward
    return out


def no_program_rows(rollout: Rollout) -> np.ndarray:
    """[N] bool: rows whose sample holds no program (`Rollout.causes`).

    Such a row is an invalid outcome known without running anything: it is never
    submitted, charged nothing, and fed the invalid floor in every arm.
    """
    if not rollout.causes:
        return np.zeros(len(rollout.programs), bool)
    return np.array([c != "ok" for c in rollout.causes], bool)


def with_no_program_rows(
    rewards: np.ndarray, valid: np.ndarray, no_program: np.ndarray, invalid_reward: float
) -> tuple[np.ndarray, np.ndarray]:
    """`(rewards, valid)` of shape [N] with rows without a program set to the invalid
    floor and counted: their reward is known exactly, whatever the arm."""
    rewards = np.where(no_program, np.float32(invalid_reward), rewards).astype(np.float32)
    return rewards, valid | no_program


def wm_free_rewards(
    real: np.ndarray, executed: np.ndarray, partner: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`core.arms.real_rewards` as numpy: the fed rewards and validity of an arm without
    a world model (the real stream of the oracle metrics)."""
    rewards, valid = core_arms.real_rewards(real, executed, partner)
    return np.asarray(rewards, np.float32), np.asarray(valid, bool)


def finite_rows(rewards: np.ndarray, valid: np.ndarray, *, step: int) -> np.ndarray:
    """`valid` without rows whose fed reward is not finite.

    Raises:
      RuntimeError: every valid row's reward is non-finite — a run that would
        go on training on nothing (e.g. the correction produced NaN everywhere).
    """
    finite = valid & np.isfinite(rewards)
    if valid.any() and not finite.any():
        raise RuntimeError(
            f"step {step}: every fed reward is non-finite ({int(valid.sum())} rows); "
            "check the correction's settings and the outcome source"
        )
    dropped = int(valid.sum() - finite.sum())
    if dropped:
        log.warning("step %d: %d non-finite fed rewards masked out", step, dropped)
    return finite


def advantages(rewards: np.ndarray, valid: np.ndarray, g: int, mode: str) -> np.ndarray:
    """Group advantages of shape [N] over groups of `g` rows; invalid rows get 0."""
    adv = jax.vmap(lambda r, m: grpo.group_advantages(r, mode=mode, mask=m))(
        jnp.asarray(np.where(valid, rewards, 0.0).reshape(-1, g)),
        jnp.asarray(valid.reshape(-1, g)),
    )
    return np.asarray(adv, np.float32).reshape(-1)


def policy_batch(rollout: Rollout, adv: np.ndarray, valid: np.ndarray) -> dict[str, np.ndarray]:
    """The train-step batch: the rollout's arrays, the advantages, and a loss mask that
    leaves out rows without a usable reward."""
    loss_mask = rollout.batch["loss_mask"] * valid[:, None].astype(np.float32)
    return dict(rollout.batch, advantages=adv, loss_mask=loss_mask)


def step_metrics(record: StepRecord, arm: Arm) -> dict[str, float]:
    """The step's rewards, anchors, world-model and correction scalars."""
    r, wm, valid = record, record.wm, record.valid
    m: dict[str, float] = {f"correction/{k}": float(v) for k, v in r.correction.items()}
    m.update({f"anchors/{k}": float(v) for k, v in r.exec_counts.items()})
    m["anchors/groups"] = float(r.anchor_groups.sum())
    if r.anchor_fraction is not None:
        m["anchors/fraction"] = r.anchor_fraction
    if r.anchor_weights is not None and r.anchor_groups.any():
        m["anchors/ipw_weight_max"] = float(r.anchor_weights[r.anchor_groups].max())
    m["anchors/replicate_pairs"] = float(np.isfinite(r.partner).sum())
    m["reward/masked_rows"] = float(np.sum(~valid))
    if valid.any():
        m["reward/fed_mean"] = float(np.mean(r.rewards[valid]))
    if r.executed.any():
        m["reward/real_mean"] = float(np.nanmean(r.real))
    if r.rollout.causes:
        for cause in PROGRAM_CAUSES[1:]:
            m[f"programs/none/{cause}"] = float(r.rollout.causes.count(cause))
    if arm.world_model and wm is not None:
        m["wm/parse_failures"] = float(wm.parse_failures)
        m.update({f"wm/parse_fail/{c}": float(v) for c, v in wm.parse_causes.items()})
        if wm.parse_causes:
            m["wm/clamped"] = float(wm.clamped)
        m.update({f"wm/{k}": float(v) for k, v in wm.diagnostics.items()})
        ok = np.isfinite(wm.mean)
        if ok.any():
            m["wm/pred_mean"] = float(np.mean(wm.mean[ok]))
        both = r.executed & ok
        if both.any():
            m["wm/raw_bias_on_anchors"] = float(np.mean(wm.mean[both] - r.real[both]))
    return m
