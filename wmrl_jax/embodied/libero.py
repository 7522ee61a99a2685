"""Adapter for LIBERO users: LIBERO environments and a user's progress model, plugged into WMRL.

**Not run on real LIBERO assets.** LIBERO (its robosuite scenes, BDDL task
files and initial states) and a VLA policy cannot be installed here; this
module is written against LIBERO's environment API and tested against a
stand-in environment with the same API (``tests/embodied/standin_libero.py``).

LIBERO's environment (``libero.libero.envs.OffScreenRenderEnv``) has the
old-Gym API: ``reset() -> obs``, ``set_init_state(state) -> obs`` (the
benchmark's fixed initial states, ``task_suite.get_task_init_states(i)``),
``step(action) -> (obs, reward, done, info)`` with ``done`` on success,
``check_success()``, ``get_sim_state()`` and ``close()``; observations are
dicts of camera frames and proprioception. `LiberoEpisodes` turns N of them
into an `EpisodeEnv`: the initial-state seed picks one of the benchmark's
initial states, the policy sees a flat state vector built by ``state_fn``
from the observation dict, success is latched (LIBERO ends an episode on
success; a succeeded slot is not stepped again and is not charged), and the
raw observation dicts after k steps reach the world model as
`Episodes.prefix_raw`.

A user's progress model — say, a learned reward model over the frames — is
any callable ``(raw_obs_list, prefix_return [N]) -> mean [N]`` or
``-> (mean [N], var [N])``; `CallableProgress` makes it a `WorldModel`. Use:

    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    suite = benchmark.get_benchmark_dict()["libero_10"]()
    task = suite.get_task(0)
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    make_env = functools.partial(
        LiberoEpisodes.from_factory,
        lambda: OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=128, camera_widths=128),
        init_states=suite.get_task_init_states(0),
        horizon=520,
        name=task.name,
    )
    run_arm(config, arm="wmrl", seed=0, make_env=make_env,
            world_model=CallableProgress(my_progress_model))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from wmrl_jax.embodied.rollout import Episodes
from wmrl_jax.embodied.tasks import TaskSpec

#: The proprioceptive keys of a LIBERO (robosuite) observation, in this order.
PROPRIO_KEYS = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos", "robot0_joint_pos")


def proprio_state(obs: dict) -> np.ndarray:
    """The default ``state_fn``: the concatenated proprioceptive keys, float32."""
    missing = [k for k in PROPRIO_KEYS if k not in obs]
    if missing:
        raise ValueError(f"LIBERO observation lacks {missing}; pass a state_fn for this env")
    return np.concatenate([np.ravel(obs[k]) for k in PROPRIO_KEYS]).astype(np.float32)


class LiberoEpisodes:
    """`EpisodeEnv` over N LIBERO environments of one task.

    Args:
      envs: N LIBERO environments (``OffScreenRenderEnv``) of the same task.
      init_states: the benchmark's initial simulator states, of shape [S, state_dim];
        seed s starts from ``init_states[s % S]``.
      horizon: episode length H (LIBERO-Long evaluates 520 steps).
      act_dim: action dimension (7: end-effector delta and gripper).
      state_fn: observation dict -> flat state [D] for the policy.
      obs_scale: divisor of the state for the policy, of shape [D] (ones if None).
      name: the task's name, for logs.
    """

    def __init__(
        self,
        envs: Sequence,
        *,
        init_states: np.ndarray,
        horizon: int,
        act_dim: int = 7,
        state_fn: Callable[[dict], np.ndarray] = proprio_state,
        obs_scale: Sequence[float] | None = None,
        name: str = "libero",
    ):
        if not envs:
            raise ValueError("LiberoEpisodes needs at least one environment")
        init_states = np.asarray(init_states)
        if init_states.ndim != 2 or not len(init_states):
            raise ValueError(f"init_states must be [S, state_dim], got {init_states.shape}")
        self._envs = list(envs)
        self._init_states, self._state_fn = init_states, state_fn
        self.num_envs, self.horizon, self.act_dim = len(self._envs), horizon, act_dim
        self._raw = [self._envs[0].set_init_state(init_states[0])]
        self.obs_dim = int(state_fn(self._raw[0]).shape[0])
        scale = tuple(obs_scale) if obs_scale is not None else (1.0,) * self.obs_dim
        if len(scale) != self.obs_dim:
            raise ValueError(f"obs_scale has {len(scale)} values, states have {self.obs_dim}")
        self.task = TaskSpec(f"libero:{name}", "libero", horizon, None, float("nan"), scale)
        self._raw = [None] * self.num_envs
        self._done = np.zeros(self.num_envs, bool)

    @classmethod
    def from_factory(cls, factory: Callable[[], object], num_envs: int, **kwargs):
        """Builds ``num_envs`` environments with ``factory()``; ``kwargs`` as in the constructor."""
        return cls([factory() for _ in range(num_envs)], **kwargs)

    def _state(self, i: int) -> np.ndarray:
        return self._state_fn(self._raw[i])

    def reset(self, seeds: Sequence[int]) -> np.ndarray:
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        for i, (env, seed) in enumerate(zip(self._envs, seeds, strict=True)):
            env.reset()
            self._raw[i] = env.set_init_state(self._init_states[int(seed) % len(self._init_states)])
        self._done[:] = False
        return np.stack([self._state(i) for i in range(self.num_envs)])

    def step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        actions = np.clip(np.asarray(actions, np.float64), -1.0, 1.0)
        if actions.shape != (self.num_envs, self.act_dim):
            raise ValueError(f"actions must have shape {(self.num_envs, self.act_dim)}")
        reward = np.zeros(self.num_envs, np.float32)
        for i in np.flatnonzero(np.asarray(active) & ~self._done):
            self._raw[i], r, done, _ = self._envs[i].step(actions[i])
            reward[i] = r
            self._done[i] = bool(done) or bool(self._envs[i].check_success())
        return np.stack([self._state(i) for i in range(self.num_envs)]), reward

    def success(self) -> np.ndarray:
        return self._done.copy()

    def copy_state(self, src: int, dst: int) -> np.ndarray:
        state = self._envs[src].get_sim_state()
        self._raw[dst] = self._envs[dst].set_init_state(state)
        self._done[dst] = self._done[src]
        return self._state(dst)

    def raw_observations(self) -> list:
        return list(self._raw)

    def close(self) -> None:
        for env in self._envs:
            env.close()


class CallableProgress:
    """A user's progress model as a `WorldModel` (fixed: it does not learn from anchors).

    Args:
      fn: ``(raw_obs_list, prefix_return [N]) -> mean [N]`` or ``(mean, var)``,
        where ``raw_obs_list`` holds each episode's observation after k steps
        (LIBERO: the dict with camera frames) and ``prefix_return`` the return
        of the first k steps. NaN means and infinite variances mark predictions
        the correction must not use.
    """

    def __init__(self, fn: Callable):
        self.fn = fn

    def predict(self, episodes: Episodes) -> tuple[np.ndarray, np.ndarray]:
        n = episodes.prefix_return.shape[0]
        raw = episodes.prefix_raw if episodes.prefix_raw is not None else list(episodes.prefix_obs)
        out = self.fn(raw, episodes.prefix_return)
        mean, var = out if isinstance(out, tuple) else (out, np.ones(n, np.float32))
        mean, var = np.asarray(mean, np.float32), np.asarray(var, np.float32)
        if mean.shape != (n,) or var.shape != (n,):
            raise ValueError(
                f"the progress model returned shapes {mean.shape} and {var.shape}, expected ({n},)"
            )
        return mean, var

    def observe(self, episodes: Episodes, executed: np.ndarray, outcome: np.ndarray) -> None:
        del episodes, executed, outcome  # A fixed model; the correction still learns the map.
