"""Episodes on real Gymnasium MuJoCo environments: seeds, truncation, replicates, success."""

import jax
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from wmrl_jax.embodied import envs, policy, rollout, tasks  # noqa: E402

REACHER = tasks.TASKS["reacher"]


def _params(env, seed=0):
    return policy.init_policy(jax.random.key(seed), obs_dim=env.obs_dim, act_dim=env.act_dim)


def test_returns_match_gymnasium_stepped_directly():
    env = envs.GymnasiumEpisodes(REACHER, num_envs=2)
    sampler = rollout.make_sampler(REACHER.obs_scale)
    ep = rollout.run_episodes(
        env, sampler, _params(env), jax.random.key(1), seeds=[3, 4], lengths=[50, 10], prefix_len=10
    )
    # Independent reference: Gymnasium's own wrapped env, the same seed and actions.
    ref = gym.make("Reacher-v5")
    for i, seed in enumerate([3, 4]):
        obs, _ = ref.reset(seed=seed)
        np.testing.assert_allclose(ep.obs[i, 0], obs / np.array(REACHER.obs_scale), rtol=1e-5)
        total = 0.0
        for t in range(int(ep.mask[i].sum())):
            obs, r, *_ = ref.step(np.clip(ep.actions[i, t], -1, 1))
            total += r
            if t == 9:
                np.testing.assert_allclose(ep.prefix_return[i], total, rtol=1e-5)
                prefix_obs = obs
        np.testing.assert_allclose(
            ep.prefix_obs[i], prefix_obs / np.array(REACHER.obs_scale), rtol=1e-5
        )
        if i == 0:
            np.testing.assert_allclose(ep.ret[i], total, rtol=1e-5)
            distance = np.linalg.norm(obs[-2:])  # fingertip - target, from Gymnasium's obs
            assert ep.success[i] == (distance < REACHER.threshold)
    assert np.isnan(ep.ret[1]) and not ep.success[1]
    assert ep.mask.sum(axis=1).tolist() == [50, 10] and ep.sim_steps == 60


def test_same_seed_same_start_and_replicates_continue_the_prefix():
    env = envs.GymnasiumEpisodes(REACHER, num_envs=4)
    params = _params(env)
    # Deterministic actions: a replicate of a prefix must reproduce its source exactly.
    det = rollout.make_sampler(REACHER.obs_scale, deterministic=True)
    ep = rollout.run_episodes(
        env,
        det,
        params,
        jax.random.key(0),
        seeds=[7, 7, 8],
        lengths=[50, 50, 10],
        prefix_len=10,
        replicate_src=[1],
    )
    np.testing.assert_array_equal(ep.obs[0], ep.obs[1])
    np.testing.assert_allclose(ep.replicate_ret[1], ep.ret[1], rtol=1e-5)
    assert np.isnan(ep.replicate_ret[[0, 2]]).all()
    assert ep.sim_steps == 50 + 50 + 10 + 40 and ep.replicate_steps == 40
    # With noise the continuation differs: a second draw of the same prefix's outcome.
    noisy = rollout.make_sampler(REACHER.obs_scale)
    ep = rollout.run_episodes(
        env,
        noisy,
        params,
        jax.random.key(0),
        seeds=[7, 7, 8],
        lengths=[50, 50, 10],
        prefix_len=10,
        replicate_src=[1],
    )
    assert ep.replicate_ret[1] != ep.ret[1]
    assert not np.array_equal(ep.obs[0, 1:], ep.obs[1, 1:])


def test_success_is_read_from_the_simulator_state():
    env = envs.GymnasiumEpisodes(REACHER, num_envs=1)
    env.reset([0])
    inner = env._envs[0]
    assert not env.success()[0]  # The target starts away from the fingertip.
    # Move the target onto the fingertip: success, whatever the last observation said.
    qpos = inner.data.qpos.copy()
    qpos[-2:] = inner.get_body_com("fingertip")[:2]  # The slide joints have ref = body pos.
    inner.set_state(qpos, inner.data.qvel.copy())
    assert REACHER.distance(inner) < 1e-6 and env.success()[0]


def test_bad_input_raises():
    env = envs.GymnasiumEpisodes(REACHER, num_envs=2)
    sampler = rollout.make_sampler(REACHER.obs_scale)
    run = lambda **kw: rollout.run_episodes(
        env, sampler, _params(env), jax.random.key(0), prefix_len=10, **kw
    )
    with pytest.raises(ValueError, match="slots"):
        run(seeds=[1], lengths=[50])
    with pytest.raises(ValueError, match="each 10 or 50"):
        run(seeds=[1, 2], lengths=[50, 20])
    with pytest.raises(ValueError, match="full-horizon"):
        rollout.run_episodes(
            env,
            sampler,
            _params(env),
            jax.random.key(0),
            seeds=[1],
            lengths=[10],
            prefix_len=10,
            replicate_src=[0],
        )
    with pytest.raises(ValueError, match="unknown embodied task"):
        tasks.get_task("hopper")


def test_pendulum_success_is_the_pole_angle_at_the_horizon():
    spec = tasks.TASKS["pendulum"]
    env = envs.GymnasiumEpisodes(spec, num_envs=2)
    env.reset([0, 1])
    assert env.success().all()  # Reset noise is 0.01 rad: upright.
    inner = env._envs[1]
    qpos = inner.data.qpos.copy()
    qpos[1] = 0.3  # Past Gymnasium's own termination angle (0.2).
    inner.set_state(qpos, inner.data.qvel.copy())
    assert env.success().tolist() == [True, False]
    _, reward = env.step(np.zeros((2, 1)), np.array([True, True]))
    assert reward.tolist() == [1.0, 0.0]  # Gymnasium's reward agrees: 1 per upright step.
