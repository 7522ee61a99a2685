"""The table of arms: what each compared method executes and feeds to GRPO.

An *arm* is one row of an ablation: which groups are executed for real, whether
the world model scores the groups, and how predictions and real scores become
the rewards fed to GRPO. The trainer (`wmrl_jax.train.rewards`), the
controlled study (`wmrl_jax.studies.controlled`) and the embodied study
(`wmrl_jax.embodied`) read the same records and call the same two decisions,
so an arm means the same thing everywhere:

* `choose_anchors`: which groups are executed (the count, `Arm.num_anchor_groups`
  or an adaptive ρ's draw, and the choice by policy);
* `fed_rewards`: the rewards fed to GRPO and their validity mask, from the
  predictions, the real scores, replicates and memory (`correction_for` builds
  the arm's reward correction, a chain of `wmrl_jax.core.correction_pieces`).

A new arm is one line in `ARMS`, plus, if it brings new behaviour, one piece.

| arm | executes | WM | debias | IVD | rewards fed to GRPO |
|---|---|---|---|---|---|
| `real` | every group | no | – | – | real scores |
| `anchors_only` | the anchors | no | – | – | real scores, anchor groups only |
| `wm_naive` | none | yes | no | no | raw predictions |
| `wm_debias` | the anchors | yes | yes | no | g(r̂); real scores on anchors |
| `wmrl` | the anchors | yes | yes | yes | g(r̂); anchors fused by inverse variance |
| `wmrl_memory` | the anchors | yes | yes | yes | as `wmrl`, and remembered means |
| `wmrl_local` | the anchors | yes | yes + local | yes | as `wmrl`, g(r̂) + local offset |
| `wmrl_active` | active anchors | yes | yes (1/π weights) | yes | as `wmrl` |
| `wmrl_plus` | active anchors | yes | yes + local (1/π) | yes | memory + local + active |
| `wmrl_adaptive` | ρ_t of the anchors | yes | yes | yes | as `wmrl` |
| `wmrl_ppi` | the anchors | yes | yes | no | real on anchors + λ·(zero-mean WM control variate) |
| `wmrl_weighted` | the anchors | yes | yes | yes | as `wmrl`, WM groups' advantages ×λ |

`wmrl_memory` adds anchor memory: a sample whose program was executed earlier
in the run is fused with that program's remembered mean real reward.
`wmrl_local` adds the local correction (`wmrl_jax.core.local`): the shrunk
residuals of executed programs of the same task and nearby features.
`wmrl_active` draws its anchor groups with probabilities that follow a score
(`config.anchors.score`) mixed with a uniform share, and weighs each anchor
pair in the map's fit by the inverse of its inclusion probability
(`wmrl_jax.core.anchors`), so the map stays unbiased.
`wmrl_adaptive` draws uniform anchor groups, but their number follows the
world model's out-of-sample error (`wmrl_jax.core.rho`, `config.anchors.adaptive`):
more when it rises, fewer when it falls.
`wmrl_ppi` and `wmrl_weighted` change the advantages rather than the fed
rewards (`Arm.estimator`, `wmrl_jax.core.ppi`): prediction-powered GRPO feeds
the anchors' real-reward advantages plus λ times a control variate of the
debiased world model's advantages that has mean zero over the anchor draw, so
its expected update is `anchors_only`'s whatever the world model predicts;
`wmrl_weighted` feeds `wmrl`'s rewards with its world-model-scored groups'
advantages scaled by the same online reliability λ.

`anchors_only` executes exactly the groups `wmrl` would anchor (same rule,
same key); with the "uncertain" anchor policy it has no variances to rank
by and picks at random. Having no use for the other groups, it does not
sample them (`Arm.samples_anchors_only`): its generation and training cost
are those of the anchor groups alone.

Rows without a usable reward (unexecuted rows of a WM-free arm) are masked
out of the group statistics and the loss.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from wmrl_jax.core import anchors, ppi
from wmrl_jax.core import rho as rho_lib
from wmrl_jax.core.correction import (
    RewardCorrection,
    make_reward_correction,
    usable_predictions,
)

EXECUTES = ("all", "anchors", "none")
# "random": uniform; "uncertain": the largest mean WM variance first (deterministic,
# so the map is fitted on a biased sample); "active": drawn with probabilities
# following `config.anchors.score`, anchor pairs weighted by 1/π.
ANCHOR_POLICIES = ("random", "uncertain", "active")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One compared method.

    Attributes:
      name: the arm's name in configs and tables.
      executes: "all" groups, the "anchors" (a fraction ρ of groups, at least
        one), or "none".
      world_model: the world model scores every group; without it only executed
        rows have a reward.
      debias: Online Debiasing (isotonic map fitted on anchor pairs).
      ivd: Inverse-Variance Denoising of anchors (needs `use_real`).
      use_real: real scores of executed rows enter the fed rewards.
      memory: anchor memory: a sample not executed this step whose program was
        executed earlier in the run gets that program's mean real reward
        (variance σ²_real / executions), fused with its prediction; it is
        neither executed nor charged.
      local: the local correction on top of the global map.
      anchor_policy: the arm's own anchor policy ("active"), or None for
        `config.anchor_policy`.
      adaptive_rho: the anchor fraction follows the world model's
        out-of-sample error (`wmrl_jax.core.rho`).
      estimator: how advantages are formed (`wmrl_jax.core.ppi.ESTIMATORS`):
        "grpo" (group advantages of the fed rewards), "ppi" (prediction-powered)
        or "weighted" (WM groups scaled by the online reliability).
    """

    name: str
    executes: str
    world_model: bool
    debias: bool = False
    ivd: bool = False
    use_real: bool = True
    memory: bool = False
    local: bool = False
    anchor_policy: str | None = None
    adaptive_rho: bool = False
    estimator: str = "grpo"

    def __post_init__(self):
        if self.executes not in EXECUTES:
            raise ValueError(f"executes must be one of {EXECUTES}, got {self.executes!r}")
        if not self.world_model and (self.executes == "none" or not self.use_real):
            raise ValueError(f"arm {self.name!r}: without a world model it must use real scores")
        if self.ivd and not self.use_real:
            raise ValueError(f"arm {self.name!r}: IVD fuses real scores, so it needs use_real")
        if self.memory and not (self.world_model and self.use_real):
            raise ValueError(f"arm {self.name!r}: anchor memory fuses real scores into WM rewards")
        if self.local and not self.debias:
            raise ValueError(f"arm {self.name!r}: the local correction refines the debiasing map")
        if self.anchor_policy is not None and self.anchor_policy not in ANCHOR_POLICIES:
            raise ValueError(f"arm {self.name!r}: anchor_policy must be one of {ANCHOR_POLICIES}")
        if self.adaptive_rho and not (self.debias and self.executes == "anchors"):
            raise ValueError(
                f"arm {self.name!r}: an adaptive ρ follows the debiased WM's error on anchors"
            )
        if self.estimator not in ppi.ESTIMATORS:
            raise ValueError(f"arm {self.name!r}: estimator must be one of {ppi.ESTIMATORS}")
        if self.estimator != "grpo" and not (self.debias and self.executes == "anchors"):
            raise ValueError(
                f"arm {self.name!r}: the {self.estimator} estimator compares anchors' real "
                "advantages with the debiased WM's"
            )

    @property
    def samples_anchors_only(self) -> bool:
        """WM-free and executing the anchors: unexecuted groups are never sampled."""
        return not self.world_model and self.executes == "anchors"

    def num_anchor_groups(self, num_groups: int, fraction: float) -> int:
        """Groups executed in a step of `num_groups`: all, none, or ρ·groups rounded.

        The one rounding rule of every consumer: ρ·B to the nearest whole
        number, ties to even (Python's `round`: 2.5 → 2), at least one group.
        """
        if self.executes == "all":
            return num_groups
        if self.executes == "none":
            return 0
        return min(num_groups, max(1, int(round(fraction * num_groups))))


ARMS: dict[str, Arm] = {
    arm.name: arm
    for arm in (
        Arm("real", executes="all", world_model=False),
        Arm("anchors_only", executes="anchors", world_model=False),
        Arm("wm_naive", executes="none", world_model=True, use_real=False),
        Arm("wm_debias", executes="anchors", world_model=True, debias=True),
        Arm("wmrl", executes="anchors", world_model=True, debias=True, ivd=True),
        Arm(
            "wmrl_memory", executes="anchors", world_model=True, debias=True, ivd=True, memory=True
        ),
        Arm("wmrl_local", executes="anchors", world_model=True, debias=True, ivd=True, local=True),
        Arm(
            "wmrl_active", executes="anchors", world_model=True, debias=True, ivd=True,
            anchor_policy="active",
        ),
        Arm(
            "wmrl_plus", executes="anchors", world_model=True, debias=True, ivd=True,
            memory=True, local=True, anchor_policy="active",
        ),
        Arm(
            "wmrl_adaptive", executes="anchors", world_model=True, debias=True, ivd=True,
            adaptive_rho=True,
        ),
        Arm("wmrl_ppi", executes="anchors", world_model=True, debias=True, estimator="ppi"),
        Arm(
            "wmrl_weighted", executes="anchors", world_model=True, debias=True, ivd=True,
            estimator="weighted",
        ),
    )
}  # fmt: skip


def get(name: str) -> Arm:
    """The arm called `name`; raises ValueError naming the known arms."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known: {tuple(ARMS)}")
    return ARMS[name]


def anchor_policy(arm: Arm, default: str) -> str:
    """The anchor policy `arm` runs under: its own, or `default` (`config.anchor_policy`)."""
    return arm.anchor_policy or default


def correction_for(arm: Arm, **settings) -> RewardCorrection:
    """The reward correction `arm` chains; `settings` go to `make_reward_correction`."""
    return make_reward_correction(
        debias=arm.debias, ivd=arm.ivd, use_real=arm.use_real, local=arm.local, **settings
    )


# -- which groups are executed ---------------------------------------------------
class AnchorChoice(NamedTuple):
    """The groups a step executes, and the weight of their anchor pairs in the map.

    Attributes:
      groups: bool of shape [B], the groups executed for real.
      weights: float32 of shape [B]: each drawn group's inverse inclusion
        probability, normalised to 1 under a uniform draw
        (`wmrl_jax.core.anchors.ipw_weights`); 1 for the other policies, 0 on
        groups not drawn.
    """

    groups: jax.Array
    weights: jax.Array


def anchor_count(arm: Arm, key, *, num_groups: int, fraction: float, rho_fraction=None):
    """How many of `num_groups` groups `arm` executes this step.

    `arm.num_anchor_groups` (the one rounding rule), or for an adaptive-ρ arm
    `rho_fraction`·B stochastically rounded (`wmrl_jax.core.rho.num_groups`,
    drawn with `fold_in(key, 1)`): an int32 scalar, traced under jit.
    """
    if arm.adaptive_rho and rho_fraction is not None:
        return rho_lib.num_groups(jax.random.fold_in(key, 1), rho_fraction, num_groups)
    return arm.num_anchor_groups(num_groups, fraction)


def adaptive_base(arm: Arm, *, num_groups: int, fraction: float) -> float:
    """An adaptive ρ's starting fraction: the share of groups the arm's ρ executes."""
    return arm.num_anchor_groups(num_groups, fraction) / num_groups


def choose_anchors(
    key, count, *, num_groups: int, policy: str = "random", group_score=None,
    uniform_share: float = 0.5,
) -> AnchorChoice:  # fmt: skip
    """Which `count` of `num_groups` groups are executed for real, and their anchors' weights.

    Pure and jit-able; `count` may be traced except under "active".

    Args:
      key: PRNG key of the random choice.
      count: groups to execute, in [0, num_groups] (`anchor_count`).
      num_groups: B.
      policy: one of `ANCHOR_POLICIES`: "random" (uniform: the groups whose
        place in a random permutation is below `count`), "uncertain" (the
        largest `group_score` first, deterministic) or "active" (drawn with
        inclusion probabilities proportional to the rank of `group_score`,
        mixed with `uniform_share` of the uniform draw; anchor pairs weighted
        1/π). Without `group_score` (an arm without a world model) both fall
        back to "random".
      group_score: scores of shape [B] (higher: more worth executing); NaN
        counts as largest.
      uniform_share: see `policy`.

    Example:
      >>> choose_anchors(jax.random.key(0), 3, num_groups=3).groups.tolist()
      [True, True, True]
    """
    if policy not in ANCHOR_POLICIES:
        raise ValueError(f"anchor policy must be one of {ANCHOR_POLICIES}, got {policy!r}")
    if group_score is None or policy == "random":
        groups = jax.random.permutation(key, num_groups) < count
        return AnchorChoice(groups, groups.astype(jnp.float32))
    score = jnp.nan_to_num(jnp.asarray(group_score, jnp.float32), nan=jnp.inf)
    if policy == "uncertain":
        order = jnp.argsort(-score, stable=True)
        groups = jnp.zeros(num_groups, bool).at[order].set(jnp.arange(num_groups) < count)
        return AnchorChoice(groups, groups.astype(jnp.float32))
    # By rank (1 = lowest), so the draw does not depend on the score's scale.
    rank = jnp.argsort(jnp.argsort(score, stable=True), stable=True) + 1.0
    return AnchorChoice(*anchors.draw(key, rank, k=int(count), uniform_share=uniform_share))


# -- the fed rewards -------------------------------------------------------------
class FedRewards(NamedTuple):
    """What an arm feeds GRPO for one step (arrays of shape [N]).

    Attributes:
      rewards: float32 rewards.
      valid: bool, the rows that enter the group statistics and the loss.
      state: the reward correction's updated state (unchanged without a WM).
      diagnostics: the correction's float32 scalars (empty without a WM).
    """

    rewards: jax.Array
    valid: jax.Array
    state: object
    diagnostics: dict


def real_rewards(real, executed, real_replicate=None) -> tuple[jax.Array, jax.Array]:
    """`(rewards, valid)` of shape [N] of an arm without a world model: the real scores of
    executed rows (a replicate pair's mean, as the fusion takes it), 0 and invalid elsewhere.

    Args:
      real: real rewards of shape [N] (NaN where not executed).
      executed: bool of shape [N].
      real_replicate: optional second real score of shape [N] (NaN where none).
    """
    real = jnp.asarray(real, jnp.float32)
    executed = jnp.asarray(executed, bool)
    if real_replicate is not None:
        replicate = jnp.asarray(real_replicate, jnp.float32)
        real = jnp.where(jnp.isfinite(replicate), 0.5 * (real + replicate), real)
    return jnp.where(executed, real, 0.0), executed


def fed_rewards(
    arm: Arm, correction: RewardCorrection, state, pred_mean, pred_var, real, executed, *,
    real_replicate=None, **rows,
) -> FedRewards:  # fmt: skip
    """The rewards `arm` feeds GRPO, and which rows are valid; pure and jit-able.

    A WM-free arm is fed the real scores of its executed rows (a replicate
    pair's mean, as the fusion takes it), the others masked. A WM arm's rows
    go through its reward correction; a row whose prediction is unusable
    (`correction.usable_predictions`: infinite or NaN variance, or no finite
    mean) is masked unless a real score of its own stands in for it.

    Args:
      arm: the arm (static).
      correction: its reward correction (`correction_for`).
      state: the correction's state.
      pred_mean: WM predictions of shape [N] (NaN: unusable); ignored without a WM.
      pred_var: their variances of shape [N] (inf or NaN: unusable).
      real: real rewards of shape [N] (NaN where not executed).
      executed: bool of shape [N].
      real_replicate: optional second real score of shape [N] (NaN where none).
      **rows: the correction update's per-row extras (`anchor_weight`, `task`,
        `features`, `known_real`, `known_count`).
    """
    real = jnp.asarray(real, jnp.float32)
    executed = jnp.asarray(executed, bool)
    if not arm.world_model:
        return FedRewards(*real_rewards(real, executed, real_replicate), state, {})
    rewards, state, diagnostics = correction.update(
        state, pred_mean, pred_var, real, executed, real_replicate=real_replicate, **rows
    )
    # An unusable prediction (infinite variance, or no finite mean) is no reward: the
    # row is masked, unless a real score of its own stands in.
    usable = usable_predictions(jnp.asarray(pred_mean, jnp.float32), pred_var)
    valid = usable | (executed & jnp.isfinite(real) & arm.use_real)
    return FedRewards(rewards, valid, state, diagnostics)
