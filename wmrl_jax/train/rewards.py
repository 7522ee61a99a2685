"""A step's anchors and rewards: which groups are executed, and what GRPO is fed.

Between the rollout and the update (`wmrl_jax.train.loop.Trainer._step`), the
arm chooses the anchor groups (a fraction ρ of them, at random or by the world
model's debiased predictions; adaptive arms set ρ from the world model's
out-of-sample error, `core.rho`), and once their outcomes are back the reward
correction (Online Debiasing, IVD: `core.correction`) turns the predictions and
the anchors' real scores into the rewards fed to GRPO. Rows without a usable
reward are masked out; rows without a program get the invalid floor.

Each stage returns its own record (`records.Anchors`, `records.Fed`). Both
read, and the correction writes, the train state's ``extra``: the correction's
state (``extra["correction"]``) and, for adaptive arms, ρ's (``extra["rho"]``)
and, for arms that form their own advantages (`wmrl_ppi`, `wmrl_weighted`:
`core.ppi`), the online reliability's (``extra["reliability"]``), so all travel
with the checkpoints. `Rewarder` takes that dict and returns it updated; it
keeps nothing between steps.

Example:
    >>> rewarder = Rewarder.from_config(config, arm, builder.make_correction(config))
    >>> extra = rewarder.init()                                       # into the train state
    >>> anchors = rewarder.choose_anchors(sampled, wm, extra, key)    # records.Anchors
    >>> fed, extra = rewarder.correct(sampled, wm, anchors, execution, extra)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from wmrl_jax.agents.base import WMOutput
from wmrl_jax.core import ppi, rho
from wmrl_jax.core.arms import real_rewards
from wmrl_jax.core.correction import RewardCorrection
from wmrl_jax.train import arms, builder, stages
from wmrl_jax.train.records import Anchors, Execution, Fed, Sampled
from wmrl_jax.train.sections import AnchorsSection

__all__ = ["Rewarder"]


class Rewarder:
    """The arm's anchor choice and reward correction, jitted once per run.

    Args:
      arm: the run's arm (`arms.get(config.arm)`).
      correction: the reward correction (`builder.make_correction(config)`).
      anchors: the anchor settings (`sections.AnchorsSection.of(config)`).
      num_groups: groups per step (`config.tasks_per_step`).
      advantage: the group advantages' normalisation (`config.advantage`).
      invalid_reward: the reward of a row without a program.
      remembered: the run's anchor memory (`execution.Runner.remembered`), read
        by arms with ``memory``.

    Attributes:
      anchor_policy: how anchors are chosen ("random", "uncertain", "active").
    """

    def __init__(
        self,
        arm: arms.Arm,
        correction: RewardCorrection,
        anchors: AnchorsSection,
        *,
        num_groups: int,
        advantage: str,
        invalid_reward: float,
        remembered: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None,
    ):
        self.arm, self.correction, self.anchors = arm, correction, anchors
        self.remembered = remembered
        self.invalid_reward = invalid_reward
        self.anchor_policy = arms.anchor_policy(arm, anchors.policy)
        self.fraction = anchors.fraction  # ρ: read here only.
        self._fed = jax.jit(functools.partial(arms.fed_rewards, arm, correction))
        self._debias = jax.jit(correction.debias)
        # Adaptive ρ starts from the share of groups the arm's ρ executes (at least one).
        a = anchors.adaptive
        base = arms.adaptive_base(arm, num_groups=num_groups, fraction=self.fraction)
        self._rho_update = jax.jit(functools.partial(
            rho.update, fast_halflife=a.fast_halflife, slow_halflife=a.slow_halflife
        ))  # fmt: skip
        self._rho_fraction = jax.jit(functools.partial(
            rho.fraction, base=base, low=a.rho_min, high=a.rho_max, gain=a.gain,
            warmup_steps=a.warmup_steps,
        ))  # fmt: skip
        r = anchors.reliability
        self._advantages = jax.jit(functools.partial(
            ppi.advantages, arm.estimator, mode=advantage, decay=r.decay,
            warmup_rows=r.warmup_rows,
        ))  # fmt: skip

    @classmethod
    def from_config(
        cls, config: ml_collections.ConfigDict, arm: arms.Arm, correction: RewardCorrection,
        *, remembered: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> Rewarder:  # fmt: skip
        """The rewarder of a training config (`wmrl_jax.train.config.base_config`)."""
        return cls(
            arm, correction, AnchorsSection.of(config), num_groups=config.tasks_per_step,
            advantage=config.advantage, invalid_reward=builder.reward_floors(config).invalid,
            remembered=remembered,
        )  # fmt: skip

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

    def choose_anchors(self, sampled: Sampled, wm: WMOutput | None, extra: dict, key) -> Anchors:
        """The step's anchor groups, their weights (and, adaptive, the fraction ρ_t).

        Args:
          sampled: the step's tasks and rollout.
          wm: the world model's predictions when the policy scores groups by them
            (else None: they come after the choice, while the anchors execute).
          extra: the train state's ``extra``; read only.
          key: the step's anchor key.
        """
        num_groups = sampled.num_groups
        if self.arm.samples_anchors_only:  # `sampled_groups` chose them: all are anchors.
            return Anchors(np.ones(num_groups, bool), np.ones(num_groups, np.float32))
        score, fraction, rho_t = None, None, None
        if wm is not None and self.anchor_policy != "random":
            kind = "uncertainty" if self.anchor_policy == "uncertain" else self.anchors.score
            debiased = self._debias(extra["correction"], wm.mean)
            score = stages.group_scores(sampled, wm, kind, np.asarray(debiased))
        if self.arm.adaptive_rho:  # ρ_t from the WM's out-of-sample error so far.
            fraction = self._rho_fraction(extra["rho"])
            rho_t = float(fraction)
        count = arms.anchor_count(
            self.arm, key, num_groups=num_groups, fraction=self.fraction, rho_fraction=fraction
        )
        choice = arms.choose_anchor_groups(
            self.arm, key, num_groups=num_groups, fraction=self.fraction,
            policy=self.anchor_policy, group_score=score,
            uniform_share=self.anchors.uniform_share, count=int(count),
        )  # fmt: skip
        return Anchors(choice.groups, choice.weights, rho_t)

    def correct(
        self, sampled: Sampled, wm: WMOutput | None, anchors: Anchors, execution: Execution,
        extra: dict,
    ) -> tuple[Fed, dict]:  # fmt: skip
        """The fed rewards and which rows count, from the step's records.

        Args:
          sampled: the step's tasks and rollout.
          wm: the world model's predictions (world-model arms), else None.
          anchors: the step's anchor choice.
          execution: the outcomes collected (``real``, ``executed``, ``partner``).
          extra: the train state's ``extra``.

        Returns:
          `(fed, extra)`: the reward stage's record, and ``extra`` with the
          correction's (and ρ's, and the reliability's) updated state.
        """
        ex, rows, pred_mean, pred_var, debiased = execution, {}, None, None, None
        if self.arm.world_model:
            pred_mean, pred_var = wm.mean, wm.var
            debiased = np.asarray(self._debias(extra["correction"], wm.mean), np.float32)
            if self.arm.adaptive_rho:  # Out of sample: the map has not seen these anchors.
                errors = np.where(ex.executed, ex.real - debiased, np.nan)
                drift = self._rho_update(extra["rho"], errors, np.isfinite(errors))
                extra = {**extra, "rho": drift}
            rows = self._wm_rows(sampled, anchors)
        out = self._fed(
            extra["correction"], pred_mean, pred_var, ex.real, ex.executed,
            real_replicate=ex.partner, **rows,
        )  # fmt: skip
        diagnostics = {}
        if self.arm.world_model:
            extra = {**extra, "correction": out.state}
            diagnostics = {k: float(v) for k, v in out.diagnostics.items()}
        rewards, valid = stages.with_no_program_rows(
            np.asarray(out.rewards, np.float32), np.asarray(out.valid, bool),
            sampled.no_program, self.invalid_reward,
        )  # fmt: skip
        valid = stages.finite_rows(rewards, valid, step=sampled.step)
        advantages = None
        if self.arm.estimator != "grpo":
            advantages, lam, extra = self._estimate(
                sampled, anchors, ex, rewards, valid, debiased, extra
            )
            diagnostics["reliability"] = lam
        return Fed(rewards, valid, debiased, advantages, diagnostics), extra

    def _wm_rows(self, sampled: Sampled, anchors: Anchors) -> dict[str, np.ndarray]:
        """The correction's per-row inputs beside the predictions, each of shape [N]: the
        anchor weights, and the task ids and program features (local) or the remembered
        real rewards (memory)."""
        g = sampled.group_size
        rows = {"anchor_weight": np.repeat(anchors.weights, g)}
        if self.arm.local:  # Same task, nearby program features.
            rows["task"] = stages.task_ids(sampled.tasks, g)
            if sampled.rollout.features is not None:
                rows["features"] = sampled.rollout.features
        if self.arm.memory:  # Programs executed earlier in the run, fused from memory.
            known, count = self.remembered(sampled.tasks, sampled.rollout.programs, g)
            rows.update(known_real=known, known_count=count)
        return rows

    def _estimate(self, sampled, anchors, ex, rewards, valid, debiased, extra):
        """`(advantages [N], λ, extra)` of a `wmrl_ppi` / `wmrl_weighted` arm, ``extra`` with
        the reliability's updated state. Rows without a program hold the invalid floor in
        both streams (it is known without running anything)."""
        g, none = sampled.group_size, sampled.no_program
        real, has_real = real_rewards(ex.real, ex.executed, ex.partner)
        real = np.where(none, self.invalid_reward, np.where(has_real, real, np.nan))
        wm = np.where(none, self.invalid_reward, debiased)

        def groups(x):
            return np.asarray(x).reshape(-1, g)

        out = self._advantages(
            extra["reliability"], fed=groups(rewards), valid=groups(valid), real=groups(real),
            wm=groups(wm), anchor=groups(np.repeat(anchors.groups, g)),
            weights=groups(np.repeat(anchors.weights, g)),
        )  # fmt: skip
        advantages = np.asarray(out.advantages, np.float32).reshape(-1)
        return advantages, float(out.lam), {**extra, "reliability": out.state}
