"""The study's arms, as one table: what each arm simulates and how it scores episodes.

Every update samples B groups of G episodes (one initial-state seed per
group). An arm decides which groups are *executed* (run to the horizon H and
scored by their real outcome), which are *predicted* (run for the prefix of k
steps and scored by the progress model) and which are not run at all:

=============  =================  ==================  ==============================
arm            executed groups    predicted groups    reward
=============  =================  ==================  ==============================
real           all B              none                real outcome
anchors_only   ⌈ρB⌉ (anchors)     none (not run)      real outcome
wm_naive       none               all B               raw prediction (warm start only)
wmrl           ⌈ρB⌉ (anchors)     the rest            `make_reward_correction`
=============  =================  ==================  ==============================

``wmrl`` trains the progress model online on its anchors, debiases every
prediction with the isotonic map fitted on anchors, and fuses anchors'
predictions with their real outcomes by inverse variance, σ²_real coming from
replicate continuations of anchor prefixes.

Example:
  >>> ARMS["wmrl"].executed_groups(10, rho=0.1), ARMS["real"].predicted_groups(10, rho=0.1)
  (1, 0)
"""

from __future__ import annotations

import math
from typing import NamedTuple


class ArmSpec(NamedTuple):
    """One arm.

    Attributes:
      name: the registry key.
      executed: "all", "anchors" (⌈ρB⌉ groups, at least one) or "none".
      predicted: whether the groups not executed are run to k and predicted
        (False: they are not run at all).
      wm_online: whether the progress model keeps learning from executed episodes.
      correct: whether predictions go through `make_reward_correction`
        (isotonic debiasing, inverse-variance fusion); otherwise raw.
      replicates: replicate continuations per executed group (for σ²_real).
    """

    name: str
    executed: str
    predicted: bool
    wm_online: bool
    correct: bool
    replicates: bool

    def executed_groups(self, num_groups: int, *, rho: float) -> int:
        """Number of the B groups run to the horizon."""
        if self.executed == "all":
            return num_groups
        if self.executed == "none":
            return 0
        return min(num_groups, max(1, math.ceil(rho * num_groups - 1e-9)))

    def predicted_groups(self, num_groups: int, *, rho: float) -> int:
        """Number of the B groups run to the prefix and scored by the world model."""
        return num_groups - self.executed_groups(num_groups, rho=rho) if self.predicted else 0

    @property
    def uses_wm(self) -> bool:
        return self.predicted


ARMS: dict[str, ArmSpec] = {
    "real": ArmSpec("real", "all", False, False, False, False),
    "anchors_only": ArmSpec("anchors_only", "anchors", False, False, False, False),
    "wm_naive": ArmSpec("wm_naive", "none", True, False, False, False),
    "wmrl": ArmSpec("wmrl", "anchors", True, True, True, True),
}


def get_arm(name: str) -> ArmSpec:
    """Looks an arm up by name, with a clear error for unknown names."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known: {sorted(ARMS)}")
    return ARMS[name]
