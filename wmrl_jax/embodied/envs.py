"""Batches of simulator episodes behind one small protocol.

`EpisodeEnv` is what the rollout needs from a simulator: N environment slots
that are reset from initial-state seeds, stepped together (inactive slots are
not simulated and not charged), asked for success at the end, and whose
simulator state can be copied from one slot to another (replicate episodes
continue a prefix twice). `GymnasiumEpisodes` implements it over N Gymnasium
MuJoCo environments; `wmrl_jax.embodied.libero.LiberoEpisodes` over LIBERO's.

Gymnasium's MuJoCo environments are stepped one by one in Python either way
(its ``SyncVectorEnv`` is the same loop, and it steps every slot): stepping
only the active slots is what lets a truncated (k-step) episode cost k steps.

Example:
  >>> from wmrl_jax.embodied import tasks
  >>> env = GymnasiumEpisodes(tasks.TASKS["reacher"], num_envs=2)
  >>> obs = env.reset([0, 0])
  >>> obs.shape, bool((obs[0] == obs[1]).all())  # the same seed: the same start
  ((2, 10), True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from wmrl_jax.embodied.tasks import TaskSpec


class EpisodeEnv(Protocol):
    """N episode slots stepped as one batch.

    Attributes:
      num_envs: N.
      obs_dim: D.
      act_dim: A.
      horizon: the episode length H.
    """

    num_envs: int
    obs_dim: int
    act_dim: int
    horizon: int

    def reset(self, seeds: Sequence[int]) -> np.ndarray:
        """Resets slot i from initial-state seed ``seeds[i]``; returns obs [N, D]."""

    def step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Steps the active slots; returns ``(obs [N, D], reward [N])`` (0 where inactive)."""

    def success(self) -> np.ndarray:
        """Bool [N]: whether each slot's current state counts as success."""

    def copy_state(self, src: int, dst: int) -> np.ndarray:
        """Copies slot ``src``'s simulator state into slot ``dst``; returns its obs [D]."""

    def raw_observations(self) -> list | None:
        """Each slot's last observation as the simulator gave it (e.g. frames), or None."""

    def close(self) -> None:
        """Releases the simulators."""


class GymnasiumEpisodes:
    """`EpisodeEnv` over N Gymnasium MuJoCo environments of one task.

    The unwrapped environments are used, with the time limit enforced by the
    caller (the horizon is the task's, and truncated episodes stop earlier).
    Actions are clipped to the action box before they reach the simulator.
    """

    def __init__(self, task: TaskSpec, num_envs: int):
        import gymnasium as gym  # Optional dependency: the "embodied" extra.

        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.task = task
        self.num_envs = num_envs
        self.horizon = task.horizon
        self._envs = [
            gym.make(task.env_id, disable_env_checker=True).unwrapped for _ in range(num_envs)
        ]
        space = self._envs[0].action_space
        self._low, self._high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.act_dim = int(space.shape[0])
        self.obs_dim = int(self._envs[0].observation_space.shape[0])
        if len(task.obs_scale) != self.obs_dim:
            raise ValueError(
                f"task {task.name!r} has obs_scale of length {len(task.obs_scale)}, "
                f"but {task.env_id} observations have {self.obs_dim} dimensions"
            )
        self._obs = np.zeros((num_envs, self.obs_dim), np.float32)

    def reset(self, seeds: Sequence[int]) -> np.ndarray:
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        for i, (env, seed) in enumerate(zip(self._envs, seeds, strict=True)):
            obs, _ = env.reset(seed=int(seed))
            self._obs[i] = obs
        return self._obs.copy()

    def step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        actions = np.clip(np.asarray(actions, np.float64), self._low, self._high)
        if actions.shape != (self.num_envs, self.act_dim):
            raise ValueError(f"actions must have shape {(self.num_envs, self.act_dim)}")
        reward = np.zeros(self.num_envs, np.float32)
        for i in np.flatnonzero(active):
            obs, r, *_ = self._envs[i].step(actions[i])
            self._obs[i], reward[i] = obs, r
        return self._obs.copy(), reward

    def success(self) -> np.ndarray:
        return np.array([self.task.distance(env) < self.task.threshold for env in self._envs])

    def copy_state(self, src: int, dst: int) -> np.ndarray:
        a, b = self._envs[src], self._envs[dst]
        b.set_state(a.data.qpos.copy(), a.data.qvel.copy())
        self._obs[dst] = self._obs[src]
        return self._obs[dst].copy()

    def raw_observations(self) -> None:
        return None  # The flat state vector is all there is.

    def close(self) -> None:
        for env in self._envs:
            env.close()
