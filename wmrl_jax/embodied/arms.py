"""The embodied study's arms: rows of the shared table (`wmrl_jax.core.arms.ARMS`).

Every update samples B groups of G episodes (one initial-state seed per
group). An arm decides which groups are *executed* (run to the horizon H and
scored by their real outcome), which are *predicted* (run for the prefix of k
steps and scored by the progress model) and which are not run at all:

=============  =================  ==================  ==============================
arm            executed groups    predicted groups    reward
=============  =================  ==================  ==============================
real           all B              none                real outcome
anchors_only   round(ρB) anchors  none (not run)      real outcome
wm_naive       none               all B               raw prediction (warm start only)
wm_debias      round(ρB) anchors  the rest            debiased; real outcome on anchors
wmrl           round(ρB) anchors  the rest            debiased, anchors fused (IVD)
=============  =================  ==================  ==============================

The count is the trainer's (`Arm.num_anchor_groups`: ρB to the nearest whole
number, ties to even, at least one) and the rewards are `core.arms.fed_rewards`'s.
WM arms that use real scores keep training the progress model on their
anchors; ``wmrl`` estimates σ²_real from replicate continuations of anchor
prefixes. Arms with anchor memory, local offsets, or active or adaptive
anchors need what episodes do not have (recurring programs, features, scores
per group) and are not run here; nor are the arms that form their own
advantages (`wmrl_ppi`, `wmrl_weighted`: `Arm.estimator`), which this study's
update does not implement yet.

Example:
  >>> executed_groups(ARMS["wmrl"], 10, rho=0.1), predicted_groups(ARMS["real"], 10, rho=0.1)
  (1, 0)
"""

from __future__ import annotations

from wmrl_jax.core.arms import ARMS as _ALL_ARMS
from wmrl_jax.core.arms import Arm

ARMS: dict[str, Arm] = {
    name: arm
    for name, arm in _ALL_ARMS.items()
    if not (arm.memory or arm.local or arm.anchor_policy or arm.adaptive_rho)
    and arm.estimator == "grpo"
}


def get_arm(name: str) -> Arm:
    """Looks an arm up by name, with a clear error for unknown names."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r} for the embodied study; known: {sorted(ARMS)}")
    return ARMS[name]


def executed_groups(arm: Arm, num_groups: int, *, rho: float) -> int:
    """Number of the B groups run to the horizon (`Arm.num_anchor_groups`)."""
    return arm.num_anchor_groups(num_groups, rho)


def predicted_groups(arm: Arm, num_groups: int, *, rho: float) -> int:
    """Number of the B groups run to the prefix and scored by the world model."""
    return num_groups - executed_groups(arm, num_groups, rho=rho) if arm.world_model else 0


def learns_online(arm: Arm) -> bool:
    """Whether the progress model keeps learning from the arm's executed episodes."""
    return arm.world_model and arm.use_real


def replicates(arm: Arm) -> bool:
    """Whether executed groups get replicate continuations (σ²_real, for the fusion)."""
    return arm.ivd
