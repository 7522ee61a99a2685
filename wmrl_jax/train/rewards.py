"""A step's anchors and rewards: which groups are executed, and what GRPO is fed.

Between the rollout and the update (`wmrl_jax.train.loop.Trainer._step`), the
arm chooses the anchor groups (a fraction ρ of them, at random or by the world
model's debiased predictions; adaptive arms set ρ from the world model's
out-of-sample error, `core.rho`), and once their outcomes are back the reward
correction (Online Debiasing, IVD: `core.correction`) turns the predictions and
the anchors' real scores into the rewards fed to GRPO. Rows without a usable
reward are masked out; rows without a program get the invalid floor.

Both stages read, and the correction writes, the train state's ``extra``: the
correction's state (``extra["correction"]``) and, for adaptive arms, ρ's
(``extra["rho"]``) and, for arms that form their own advantages (`wmrl_ppi`,
`wmrl_weighted`: `core.ppi`), the online reliability's (``extra["reliability"]``),
so all travel with the checkpoints. `Rewarder` takes that
dict and returns it updated; it keeps nothing between steps.

Example:
    >>> rewarder = Rewarder(config, arm, builder.make_correction(config))
    >>> extra = rewarder.init()                             # into the train state
    >>> rewarder.choose_anchors(record, extra, key)         # record.anchor_groups
    >>> extra = rewarder.correct(record, extra)             # record.rewards, .valid
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from wmrl_jax.core import ppi, rho
from wmrl_jax.core.arms import real_rewards
from wmrl_jax.core.correction import RewardCorrection
from wmrl_jax.train import arms, builder, stages
from wmrl_jax.train.stages import StepRecord

__all__ = ["Rewarder"]


class Rewarder:
    """The arm's anchor choice and reward correction, jitted once per run.

    Args:
      config: a training config (`wmrl_jax.train.config.base_config`).
      arm: the run's arm (`arms.get(config.arm)`).
      correction: the reward correction (`builder.make_correction(config)`).
      remembered: the run's anchor memory (`execution.Runner.remembered`), read
        by arms with ``memory``.

    Attributes:
      anchor_policy: how anchors are chosen ("random", "uncertain", "active").
      invalid_reward: the reward of a row without a program.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        arm: arms.Arm,
        correction: RewardCorrection,
        *,
        remembered: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None,
    ):
        self.config, self.arm, self.correction = config, arm, correction
        self.remembered = remembered
        self.invalid_reward = builder.reward_floors(config).invalid  # rows with no program
        self.anchor_policy = arms.anchor_policy(arm, config.anchor_policy)
        self.fraction = config.anchor_fraction  # ρ: read here only.
        self._fed = jax.jit(functools.partial(arms.fed_rewards, arm, correction))
        self._debias = jax.jit(correction.debias)
        # Adaptive ρ starts from the share of groups the arm's ρ executes (at least one).
        a, groups = config.anchors.adaptive, config.tasks_per_step
        base = arms.adaptive_base(arm, num_groups=groups, fraction=self.fraction)
        self._rho_update = jax.jit(functools.partial(
            rho.update, fast_halflife=a.fast_halflife, slow_halflife=a.slow_halflife
        ))  # fmt: skip
        self._rho_fraction = jax.jit(functools.partial(
            rho.fraction, base=base, low=a.rho_min, high=a.rho_max, gain=a.gain,
            warmup_steps=a.warmup_steps,
        ))  # fmt: skip
        r = config.anchors.reliability
        self._advantages = jax.jit(functools.partial(
            ppi.advantages, arm.estimator, mode=config.advantage, decay=r.decay,
            warmup_rows=r.warmup_rows,
        ))  # fmt: skip

    def init(self) -> dict:
        """The train state's ``extra`` entries: the correction's state, and ρ's (adaptive)."""
        extra = {"correction": self.correction.init()}
        if self.arm.adaptive_rho:  # Checkpointed with the state: a resume keeps its ρ.
            extra["rho"] = rho.init()
        if self.arm.estimator != "grpo":  # So is the reliability λ.
            extra["reliability"] = ppi.init()
        return extra

    def sampled_groups(self, num_groups: int, key) -> np.ndarray:
        """bool [num_groups]: the groups the arm samples at all. An arm that samples its
        anchors only (`Arm.samples_anchors_only`) draws them here, as `wmrl` would anchor
        them (same rule, same key); every other arm samples every group."""
        if not self.arm.samples_anchors_only:
            return np.ones(num_groups, bool)
        return arms.choose_anchor_groups(
            self.arm, key, num_groups=num_groups, fraction=self.fraction
        ).groups

    def choose_anchors(self, record: StepRecord, extra: dict, key) -> None:
        """Sets ``record.anchor_groups`` and ``anchor_weights`` (and, adaptive, the fraction).

        Args:
          record: the step's record, with its rollout (and its ``wm`` when the
            policy scores groups by the world model's predictions).
          extra: the train state's ``extra``; read only.
          key: the step's anchor key.
        """
        num_groups = record.num_rows // record.group_size
        if self.arm.samples_anchors_only:  # `sampled_groups` chose them: all are anchors.
            record.anchor_groups = np.ones(num_groups, bool)
            record.anchor_weights = np.ones(num_groups, np.float32)
            return
        c, score, fraction = self.config, None, None
        if record.wm is not None and self.anchor_policy != "random":
            kind = "uncertainty" if self.anchor_policy == "uncertain" else c.anchors.score
            debiased = self._debias(extra["correction"], record.wm.mean)
            score = stages.group_scores(record, kind, np.asarray(debiased))
        if self.arm.adaptive_rho:  # ρ_t from the WM's out-of-sample error so far.
            fraction = self._rho_fraction(extra["rho"])
            record.anchor_fraction = float(fraction)
        count = arms.anchor_count(
            self.arm, key, num_groups=num_groups, fraction=self.fraction, rho_fraction=fraction
        )
        choice = arms.choose_anchor_groups(
            self.arm, key, num_groups=num_groups, fraction=self.fraction,
            policy=self.anchor_policy, group_score=score, uniform_share=c.anchors.uniform_share,
            count=int(count),
        )  # fmt: skip
        record.anchor_groups, record.anchor_weights = choice.groups, choice.weights

    def correct(self, record: StepRecord, extra: dict) -> dict:
        """Sets ``record.rewards`` and ``valid`` (and ``debiased``, ``correction``).

        Args:
          record: the step's record, with its outcomes collected (``real``,
            ``executed``, ``partner``) and, for world-model arms, its ``wm``.
          extra: the train state's ``extra``.

        Returns:
          ``extra`` with the correction's (and ρ's) updated state.
        """
        rows, pred_mean, pred_var = {}, None, None
        if self.arm.world_model:
            wm, before = record.wm, extra["correction"]
            pred_mean, pred_var = wm.mean, wm.var
            record.debiased = np.asarray(self._debias(before, wm.mean), np.float32)
            if self.arm.adaptive_rho:  # Out of sample: the map has not seen these anchors.
                errors = np.where(record.executed, record.real - record.debiased, np.nan)
                drift = self._rho_update(extra["rho"], errors, np.isfinite(errors))
                extra = {**extra, "rho": drift}
            rows["anchor_weight"] = np.repeat(record.anchor_weights, record.group_size)
            if self.arm.local:  # Same task, nearby program features.
                rows["task"] = stages.task_ids(record.tasks, record.group_size)
                if record.rollout.features is not None:
                    rows["features"] = record.rollout.features
            if self.arm.memory:  # Programs executed earlier in the run, fused from memory.
                known, count = self.remembered(record.tasks, record.rollout.programs,
                                               record.group_size)  # fmt: skip
                rows.update(known_real=known, known_count=count)
        fed = self._fed(
            extra["correction"], pred_mean, pred_var, record.real, record.executed,
            real_replicate=record.partner, **rows,
        )  # fmt: skip
        if self.arm.world_model:
            extra = {**extra, "correction": fed.state}
            record.correction = {k: float(v) for k, v in fed.diagnostics.items()}
        record.rewards = np.asarray(fed.rewards, np.float32)
        valid = np.asarray(fed.valid, bool)
        record.rewards, valid = stages.with_no_program_rows(
            record.rewards, valid, stages.no_program_rows(record.rollout), self.invalid_reward
        )
        record.valid = stages.finite_rows(record.rewards, valid, step=record.step)
        if self.arm.estimator != "grpo":
            extra = self._estimate(record, extra)
        return extra

    def _estimate(self, record: StepRecord, extra: dict) -> dict:
        """Sets ``record.advantages`` of a `wmrl_ppi` / `wmrl_weighted` arm; returns ``extra``
        with the reliability's updated state. Rows without a program hold the invalid floor
        in both streams (it is known without running anything)."""
        g = record.group_size
        none = stages.no_program_rows(record.rollout)
        real, has_real = real_rewards(record.real, record.executed, record.partner)
        real = np.where(none, self.invalid_reward, np.where(has_real, real, np.nan))
        wm = np.where(none, self.invalid_reward, record.debiased)

        def groups(x):
            return np.asarray(x).reshape(-1, g)

        out = self._advantages(
            extra["reliability"], fed=groups(record.rewards), valid=groups(record.valid),
            real=groups(real), wm=groups(wm), anchor=groups(np.repeat(record.anchor_groups, g)),
            weights=groups(np.repeat(record.anchor_weights, g)),
        )  # fmt: skip
        record.advantages = np.asarray(out.advantages, np.float32).reshape(-1)
        record.correction["reliability"] = float(out.lam)
        return {**extra, "reliability": out.state}
