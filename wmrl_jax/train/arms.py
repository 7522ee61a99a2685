"""The table of arms: what each compared method executes and feeds to GRPO.

An *arm* is one row of an ablation: which groups are executed for real, whether
the world model scores the groups, and how predictions and real scores become
the rewards fed to GRPO. The trainer (`wmrl_jax.train.stages`) and the
controlled study (`wmrl_jax.studies.controlled`) read the same records, so an
arm means the same thing everywhere. A new arm is one line in `ARMS`.

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
import numpy as np

from wmrl_jax.core import anchors
from wmrl_jax.core.correction import RewardCorrection, make_reward_correction

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

    @property
    def samples_anchors_only(self) -> bool:
        """WM-free and executing the anchors: unexecuted groups are never sampled."""
        return not self.world_model and self.executes == "anchors"

    def num_anchor_groups(self, num_groups: int, fraction: float) -> int:
        """Groups executed in a step of `num_groups`: all, none or max(1, round(ρ·groups))."""
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
    )
}  # fmt: skip


def get(name: str) -> Arm:
    """The arm called `name`; raises ValueError naming the known arms."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known: {tuple(ARMS)}")
    return ARMS[name]


def make_correction(arm: Arm, **kwargs) -> RewardCorrection:
    """The reward correction with `arm`'s switches; `kwargs` go to `make_reward_correction`."""
    return make_reward_correction(
        debias=arm.debias, ivd=arm.ivd, use_real=arm.use_real, local=arm.local, **kwargs
    )


def anchor_policy(arm: Arm, default: str) -> str:
    """The anchor policy `arm` runs under: its own, or `default` (`config.anchor_policy`)."""
    return arm.anchor_policy or default


class AnchorChoice(NamedTuple):
    """The groups a step executes, and the weight of their anchor pairs in the map.

    Attributes:
      groups: bool of shape [num_groups], the groups executed for real.
      weights: float32 of shape [num_groups]: each drawn group's inverse
        inclusion probability, normalised to 1 under a uniform draw
        (`wmrl_jax.core.anchors.ipw_weights`); 1 for the deterministic
        policies, 0 on groups not drawn.
    """

    groups: np.ndarray
    weights: np.ndarray


def choose_anchor_groups(
    arm: Arm,
    key,
    *,
    num_groups: int,
    fraction: float,
    policy: str = "random",
    group_score=None,
    uniform_share: float = 0.5,
    count: int | None = None,
) -> AnchorChoice:
    """Which groups are executed for real, and their anchors' weights in the map.

    Args:
      arm: the arm (decides how many).
      key: PRNG key of the random choice.
      num_groups: groups in the step.
      fraction: ρ, the anchor fraction.
      policy: one of `ANCHOR_POLICIES`: "random" (uniform), "uncertain" (the
        groups with the largest `group_score`, deterministic) or "active"
        (drawn with inclusion probabilities proportional to the rank of
        `group_score`, mixed with `uniform_share` of the uniform draw; anchor
        pairs weighted 1/π).
        Without `group_score` (an arm without a world model) both fall back
        to "random".
      group_score: scores of shape [num_groups] (higher: more worth
        executing); NaN counts as largest.
      uniform_share: see `policy`.
      count: the number of groups to execute, in place of the arm's
        `num_anchor_groups` (an adaptive ρ's draw).

    Example:
      >>> choose_anchor_groups(ARMS["real"], None, num_groups=3, fraction=0.1).groups
      array([ True,  True,  True])
    """
    if policy not in ANCHOR_POLICIES:
        raise ValueError(f"anchor policy must be one of {ANCHOR_POLICIES}, got {policy!r}")
    k = arm.num_anchor_groups(num_groups, fraction) if count is None else int(count)
    if not 0 <= k <= num_groups:
        raise ValueError(f"count must be in [0, {num_groups}], got {k}")
    mask = np.zeros(num_groups, bool)
    if k == num_groups:
        mask[:] = True
    elif k > 0 and policy == "active" and group_score is not None:
        # By rank (1 = lowest), so the draw does not depend on the score's scale.
        score = np.nan_to_num(np.asarray(group_score, np.float64), nan=np.inf)
        rank = np.argsort(np.argsort(score, kind="stable"), kind="stable") + 1
        drawn, weights = anchors.draw(
            key, jnp.asarray(rank, jnp.float32), k=k, uniform_share=float(uniform_share)
        )
        return AnchorChoice(np.asarray(drawn), np.asarray(weights, np.float32))
    elif k > 0:
        if policy == "uncertain" and group_score is not None:
            order = np.argsort(-np.nan_to_num(np.asarray(group_score), nan=np.inf), kind="stable")
        else:
            order = np.asarray(jax.random.permutation(key, num_groups))
        mask[order[:k]] = True
    return AnchorChoice(mask, mask.astype(np.float32))
