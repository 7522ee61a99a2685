"""A stand-in for LIBERO's ``OffScreenRenderEnv``: the same API, a trivial scene.

The end effector moves in 3-D by ``0.05 * action[:3]`` per step towards an
object whose position is part of the initial state; the task succeeds (reward
1, ``done``) when it is within 0.05. Observations are dicts with LIBERO's
proprioceptive keys, the object position and a tiny "camera frame" whose
pixels encode the distance, so a progress model over frames has something to
read. The simulator state is ``[eef_pos (3), object_pos (3)]``.
"""

from __future__ import annotations

import numpy as np

FRAME = 4


class StandInLiberoEnv:
    """LIBERO's environment API: reset, set_init_state, step, check_success, get_sim_state."""

    def __init__(self):
        self._state = np.zeros(6)
        self.steps = 0
        self.closed = False

    def seed(self, seed: int) -> None:
        del seed

    def reset(self) -> dict:
        self._state = np.zeros(6)
        return self._obs()

    def set_init_state(self, state) -> dict:
        self._state = np.array(state, np.float64).copy()
        return self._obs()

    def get_sim_state(self) -> np.ndarray:
        return self._state.copy()

    def check_success(self) -> bool:
        return bool(np.linalg.norm(self._state[:3] - self._state[3:]) < 0.05)

    def step(self, action):
        action = np.asarray(action, np.float64)
        if action.shape != (7,):
            raise ValueError(f"action must have shape (7,), got {action.shape}")
        self.steps += 1
        self._state[:3] += 0.05 * np.clip(action[:3], -1, 1)
        done = self.check_success()
        return self._obs(), float(done), done, {"success": done}

    def close(self) -> None:
        self.closed = True

    def _obs(self) -> dict:
        distance = np.linalg.norm(self._state[:3] - self._state[3:])
        return {
            "agentview_image": np.full((FRAME, FRAME, 3), min(255, int(255 * distance)), np.uint8),
            "robot0_eef_pos": self._state[:3].copy(),
            "robot0_eef_quat": np.array([0.0, 0.0, 0.0, 1.0]),
            "robot0_gripper_qpos": np.zeros(2),
            "robot0_joint_pos": np.zeros(7),
            "object_pos": self._state[3:].copy(),
        }


def init_states(num: int, seed: int = 0) -> np.ndarray:
    """``num`` initial states: the end effector at the origin, the object 0.1-0.3 away."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=(num, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    obj = direction * rng.uniform(0.1, 0.3, size=(num, 1))
    return np.concatenate([np.zeros((num, 3)), obj], axis=1)
