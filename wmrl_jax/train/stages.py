"""One training step as named stages, each a function a reader can find and test.

    rollout → world-model pass → anchor choice → execution → correction → update → ledger

`Trainer._step` (`wmrl_jax.train.loop`) calls them in this order; each stage
returns its own record (`wmrl_jax.train.records`) and the step composes them
into a `StepRecord`, which step hooks (the studies' oracle metrics) read. The
stages here are the pure or host-only parts: what goes into the fed rewards,
which rows count, the advantages, the step's metrics.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.agents.programs import PROGRAM_CAUSES
from wmrl_jax.core import arms as core_arms
from wmrl_jax.core import grpo
from wmrl_jax.envs.task import Task
from wmrl_jax.train.arms import Arm
from wmrl_jax.train.ledger import LedgerStep
from wmrl_jax.train.records import Execution, Fed, Sampled, StepRecord, no_program_rows

__all__ = [
    "StepRecord", "advantages", "charge_rollout", "finite_rows", "group_scores",
    "no_program_rows", "policy_batch", "step_metrics", "step_tasks", "task_ids", "update_batch",
    "wm_free_rewards", "with_no_program_rows",
]  # fmt: skip

log = logging.getLogger(__name__)


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


def group_scores(
    sampled: Sampled, wm: WMOutput, score: str, debiased: np.ndarray | None
) -> np.ndarray:
    """Per-group anchor scores of shape [num_groups], over rows holding a program.

    "uncertainty": the group's mean WM variance (inf where a prediction is
    unusable: most uncertain); "exploit": the group's best debiased
    prediction. A group without any program scores -inf (nothing to run).
    """
    g = sampled.group_size
    missing = sampled.no_program.reshape(-1, g)
    if score == "uncertainty":
        values = np.asarray(wm.var, np.float64).reshape(-1, g)
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


def update_batch(
    sampled: Sampled, execution: Execution, fed: Fed, *, advantage: str, epochs: int,
    aux_batch: Callable | None, timing: LedgerStep,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The train step's batch from the step's records; its rows and tokens go to `timing`.

    Args:
      sampled, execution, fed: the step's rollout, outcomes and fed rewards.
      advantage: the group advantages' normalisation, for arms that do not form
        their own (`Fed.advantages` is None).
      epochs: passes over the batch (`config.train.num_epochs`), charged each.
      aux_batch: the agent's `aux_batch` when the backbone keeps learning outcomes
        from executions (`config.train.loss.aux_coef`), else None.
      timing: the step's ledger builder.
    """
    adv = fed.advantages  # Formed by arms that form their own (wmrl_ppi, wmrl_weighted).
    if adv is None:
        adv = advantages(fed.rewards, fed.valid, sampled.group_size, advantage)
    batch = policy_batch(sampled.rollout, adv, fed.valid)
    if aux_batch is not None:
        batch.update(
            aux_batch(list(sampled.tasks), sampled.rollout, execution.real, execution.executed)
        )
    # Rows out of the loss (masked) cost nothing: an implementation would drop them.
    trained = float(batch["attention_mask"][fed.valid].sum())
    rows = float(fed.valid.sum())
    if "aux_tokens" in batch:  # The world model's own sequences (those with a target).
        aux_rows = batch["aux_mask"].any(axis=1)
        trained += float(aux_rows.sum() * batch["aux_tokens"].shape[1])
        rows += float(aux_rows.sum())
    timing.add(train_tokens=trained * epochs, train_rows=rows * epochs)
    return batch


def step_metrics(record: StepRecord, arm: Arm) -> dict[str, float]:
    """The step's rewards, anchors, world-model and correction scalars."""
    wm, anchors, ex, fed = record.wm, record.anchors, record.execution, record.fed
    m: dict[str, float] = {f"correction/{k}": float(v) for k, v in fed.diagnostics.items()}
    m.update({f"anchors/{k}": float(v) for k, v in ex.counts.items()})
    m["anchors/groups"] = float(anchors.groups.sum())
    if anchors.fraction is not None:
        m["anchors/fraction"] = anchors.fraction
    if anchors.weights is not None and anchors.groups.any():
        m["anchors/ipw_weight_max"] = float(anchors.weights[anchors.groups].max())
    m["anchors/replicate_pairs"] = float(np.isfinite(ex.partner).sum())
    m["reward/masked_rows"] = float(np.sum(~fed.valid))
    if fed.valid.any():
        m["reward/fed_mean"] = float(np.mean(fed.rewards[fed.valid]))
    if ex.executed.any():
        m["reward/real_mean"] = float(np.nanmean(ex.real))
    if record.rollout.causes:
        for cause in PROGRAM_CAUSES[1:]:
            m[f"programs/none/{cause}"] = float(record.rollout.causes.count(cause))
    if arm.world_model and wm is not None:
        m["wm/parse_failures"] = float(wm.parse_failures)
        m.update({f"wm/parse_fail/{c}": float(v) for c, v in wm.parse_causes.items()})
        if wm.parse_causes:
            m["wm/clamped"] = float(wm.clamped)
        m.update({f"wm/{k}": float(v) for k, v in wm.diagnostics.items()})
        ok = np.isfinite(wm.mean)
        if ok.any():
            m["wm/pred_mean"] = float(np.mean(wm.mean[ok]))
        both = ex.executed & ok
        if both.any():
            m["wm/raw_bias_on_anchors"] = float(np.mean(wm.mean[both] - ex.real[both]))
    return m
