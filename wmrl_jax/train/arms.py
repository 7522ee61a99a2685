"""The table of arms, as the trainer reads it (`wmrl_jax.core.arms` holds it).

The arms are pure data and two pure decisions, shared by the trainer, the
controlled study and the embodied study, so they live in `core/`; this module
re-exports them and adds the trainer's host-side anchor choice
(`choose_anchor_groups`: numpy in, numpy out).
"""

from __future__ import annotations

import numpy as np

from wmrl_jax.core.arms import (
    ANCHOR_POLICIES,
    ARMS,
    EXECUTES,
    AnchorChoice,
    Arm,
    adaptive_base,
    anchor_count,
    anchor_policy,
    choose_anchors,
    correction_for,
    fed_rewards,
    get,
)

__all__ = [
    "ANCHOR_POLICIES",
    "ARMS",
    "EXECUTES",
    "AnchorChoice",
    "Arm",
    "adaptive_base",
    "anchor_count",
    "anchor_policy",
    "choose_anchor_groups",
    "correction_for",
    "fed_rewards",
    "get",
    "make_correction",
]

make_correction = correction_for  # The name the trainer's callers know.


def choose_anchor_groups(
    arm: Arm, key, *, num_groups: int, fraction: float, policy: str = "random",
    group_score=None, uniform_share: float = 0.5, count: int | None = None,
) -> AnchorChoice:  # fmt: skip
    """`core.arms.choose_anchors` for the trainer: numpy arrays, and the count checked.

    Args:
      arm: the arm (decides how many: `Arm.num_anchor_groups`).
      key: PRNG key of the random choice.
      num_groups: groups in the step.
      fraction: ρ, the anchor fraction.
      policy: one of `ANCHOR_POLICIES` (see `core.arms.choose_anchors`).
      group_score: scores of shape [num_groups], or None (random).
      uniform_share: the "active" policy's uniform share.
      count: the number of groups to execute, in place of the arm's (an
        adaptive ρ's draw, `core.arms.anchor_count`).

    Example:
      >>> choose_anchor_groups(ARMS["real"], None, num_groups=3, fraction=0.1).groups
      array([ True,  True,  True])
    """
    if policy not in ANCHOR_POLICIES:
        raise ValueError(f"anchor policy must be one of {ANCHOR_POLICIES}, got {policy!r}")
    k = arm.num_anchor_groups(num_groups, fraction) if count is None else int(count)
    if not 0 <= k <= num_groups:
        raise ValueError(f"count must be in [0, {num_groups}], got {k}")
    if k in (0, num_groups):  # Nothing to draw (and no key needed).
        groups = np.full(num_groups, k > 0)
        return AnchorChoice(groups, groups.astype(np.float32))
    choice = choose_anchors(
        key, k, num_groups=num_groups, policy=policy, group_score=group_score,
        uniform_share=uniform_share,
    )  # fmt: skip
    return AnchorChoice(np.asarray(choice.groups), np.asarray(choice.weights, np.float32))
