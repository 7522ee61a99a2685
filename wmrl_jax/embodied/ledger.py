"""The embodied compute ledger: simulator steps first, then seconds.

Simulator steps are the unit of "execution" here: every arm of the study is
given the same budget of them, and the headline ratio is computed from them.
Seconds are recorded next to them (simulation, policy sampling, world-model
prediction and training, train step) so that the cost a step count hides is
visible too. Host-side Python floats, never traced.

Example:
  >>> total = SimLedger()
  >>> total = total.add(SimLedger(sim_steps=500.0, full_episodes=10.0))
  >>> total.sim_steps
  500.0
"""

from __future__ import annotations

from typing import NamedTuple


class SimLedger(NamedTuple):
    """Counts for one update, or cumulative totals (add to accumulate).

    Attributes:
      sim_steps: environment steps simulated (each is `frame_skip` physics steps).
      full_episodes: episodes run to the horizon (anchors, or all of them in `real`).
      prefix_episodes: episodes run only to the prefix length k.
      replicate_steps: steps spent on replicate continuations (inside `sim_steps`).
      warm_start_steps: steps spent on the world model's warm-start episodes
        (inside `sim_steps`).
      sim_seconds: wall seconds inside the simulator loop (policy calls excluded).
      policy_seconds: wall seconds of policy sampling.
      wm_seconds: wall seconds of world-model prediction and training.
      train_seconds: wall seconds of the GRPO update.
    """

    sim_steps: float = 0.0
    full_episodes: float = 0.0
    prefix_episodes: float = 0.0
    replicate_steps: float = 0.0
    warm_start_steps: float = 0.0
    sim_seconds: float = 0.0
    policy_seconds: float = 0.0
    wm_seconds: float = 0.0
    train_seconds: float = 0.0

    def add(self, other: SimLedger) -> SimLedger:
        """Field-wise sum."""
        return SimLedger(*(a + b for a, b in zip(self, other, strict=True)))
