"""Control tasks: Gymnasium MuJoCo environments with success read from their own state.

A `TaskSpec` names a Gymnasium environment, the episode horizon H, a success
rule (a distance computed from the simulator's state, below a threshold at
the end of the episode) and a fixed observation scale for the policy. Tasks
are registered once in `TASKS`; everything else takes a spec.

* ``reacher`` (``Reacher-v5``, H = 50): a two-link arm; success is the
  fingertip ending within ``threshold`` of the target.
* ``pendulum`` (``InvertedPendulum-v5``, H = 100): a cart-pole; success is the
  pole ending within ``threshold`` radians of upright (the environment's own
  termination rule, read at the horizon; the unwrapped environment keeps
  simulating after a fall, and its reward, 1 per upright step, stops).
* ``pusher`` (``Pusher-v5``, H = 100): a seven-joint arm; success is the object
  ending within ``threshold`` of the goal (it starts at least 0.17 away).

Example:
  >>> spec = TASKS["reacher"]
  >>> spec.env_id, spec.horizon
  ('Reacher-v5', 50)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class TaskSpec(NamedTuple):
    """A control task.

    Attributes:
      name: short name (the registry key).
      env_id: Gymnasium id, made with ``gymnasium.make``.
      horizon: episode length H in environment steps.
      distance: ``unwrapped_env -> float``, the task distance read from the
        simulator's state (``get_body_com``), not from the observation.
      threshold: success when ``distance`` at the end of the episode is below it.
      obs_scale: per-dimension divisor of the observation for the policy and
        the progress model, of shape [D] (velocities are ~10x positions).
    """

    name: str
    env_id: str
    horizon: int
    distance: Callable[[object], float]
    threshold: float
    obs_scale: tuple[float, ...]


def _pole_angle(env) -> float:
    """|pole hinge angle| in radians: the pole's distance from upright."""
    return abs(float(env.data.qpos[1]))


def _body_distance(a: str, b: str) -> Callable[[object], float]:
    def distance(env) -> float:
        return float(np.linalg.norm((env.get_body_com(a) - env.get_body_com(b))[:2]))

    distance.__name__ = f"distance_{a}_{b}"
    return distance


TASKS: dict[str, TaskSpec] = {
    "reacher": TaskSpec(
        name="reacher",
        env_id="Reacher-v5",
        horizon=50,
        distance=_body_distance("fingertip", "target"),
        threshold=0.05,
        # cos θ (2), sin θ (2), target xy (2), joint velocities (2), fingertip - target (2).
        obs_scale=(1.0, 1.0, 1.0, 1.0, 0.2, 0.2, 10.0, 10.0, 0.2, 0.2),
    ),
    "pendulum": TaskSpec(
        name="pendulum",
        env_id="InvertedPendulum-v5",
        horizon=100,
        distance=_pole_angle,
        threshold=0.2,
        # Cart position, pole angle, cart velocity, pole angular velocity.
        obs_scale=(1.0, 0.2, 1.0, 1.0),
    ),
    "pusher": TaskSpec(
        name="pusher",
        env_id="Pusher-v5",
        horizon=100,
        distance=_body_distance("object", "goal"),
        threshold=0.12,
        # Joint angles (7), joint velocities (7), tip, object and goal positions (9).
        obs_scale=(1.0,) * 7 + (10.0,) * 7 + (0.5,) * 9,
    ),
}


def get_task(name: str) -> TaskSpec:
    """Looks a task up by name, with a clear error for unknown names."""
    if name not in TASKS:
        raise ValueError(f"unknown embodied task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]
