"""One training run: an arm, a task and a seed, until a simulator-step budget is spent.

Every update draws B initial-state seeds, simulates G episodes from each (the
groups the arm executes to the horizon H, the groups it predicts to the prefix
k), scores them (real outcome, raw prediction or corrected prediction, see
`wmrl_jax.embodied.arms`), and takes a GRPO step. The policy is evaluated —
its mean action, on a fixed set of held-out seeds, not charged — every time the
charged simulator steps cross a point of a grid shared by all arms, so curves
of success against simulator steps are comparable point by point.

Example (a few seconds):
  >>> from wmrl_jax.embodied import config as cfg_lib
  >>> config = cfg_lib.run_config("reacher", budget=4000, eval_points=2)
  >>> out = run_arm(config, arm="wmrl", seed=0)
  >>> [p["sim_steps"] for p in out["curve"]]
  [0, 2000, 4000]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import numpy as np
import optax

from wmrl_jax.core import arms as core_arms
from wmrl_jax.core.stats import group_rank_correlation
from wmrl_jax.embodied import arms as arms_lib
from wmrl_jax.embodied import envs as envs_lib
from wmrl_jax.embodied import grpo_step, progress, rollout, tasks
from wmrl_jax.embodied import policy as policy_lib
from wmrl_jax.embodied.ledger import SimLedger

EVAL_SEED_BASE = 10**7  # Held-out initial states; training seeds stay below it.


def _evaluate(env, sampler, params, seeds, prefix_len) -> dict:
    """Success rate and mean return of the mean action on held-out initial states."""
    ep = rollout.run_episodes(
        env,
        sampler,
        params,
        jax.random.key(0),
        seeds=seeds,
        lengths=[env.horizon] * len(seeds),
        prefix_len=prefix_len,
    )
    return {
        "success": float(ep.success.mean()),
        "return": float(ep.ret.mean()),
        "seconds": ep.sim_seconds + ep.policy_seconds,
    }


@functools.cache
def _policy_update(learning_rate: float, horizon: int, epochs: int, clip: float) -> tuple:
    """The optimiser and jitted GRPO update, shared by runs with the same settings."""
    optimizer = optax.adam(learning_rate)
    update = grpo_step.make_grpo_update(optimizer, horizon=horizon, epochs=epochs, clip=clip)
    return optimizer, update


@functools.cache
def _fed_rewards(arm, capacity, decay, real_var_prior, real_var_prior_count, min_anchors) -> tuple:
    """The arm's correction's init and its jitted `core.arms.fed_rewards`, shared by runs
    with the same settings."""
    correction = core_arms.correction_for(
        arm,
        capacity=capacity,
        decay=decay,
        real_var_prior=real_var_prior,
        real_var_prior_count=real_var_prior_count,
        min_anchors=min_anchors,
    )
    return correction.init, jax.jit(functools.partial(core_arms.fed_rewards, arm, correction))


def _scripted_policy(obs_dim: int, act_dim: int, scale: float) -> policy_lib.PolicyParams:
    """Zero-mean Gaussian actions of standard deviation ``scale``, whatever the state."""
    params = policy_lib.init_policy(
        jax.random.key(0), obs_dim=obs_dim, act_dim=act_dim, hidden=(1,)
    )
    return jax.tree.map(np.zeros_like, params)._replace(
        log_std=np.full(act_dim, np.log(scale), np.float32)
    )


def _warm_start(config, make_env, wm: progress.LearnedProgress, key) -> int:
    """Fits the progress model on scripted-policy episodes; returns their simulator steps."""
    c = config.wm
    env = make_env(c.warm_episodes)
    sampler = rollout.make_sampler(tuple(env.task.obs_scale))
    steps = 0
    for j, scale in enumerate(c.warm_action_scales):
        seeds = np.asarray(
            jax.random.randint(jax.random.fold_in(key, j), (c.warm_episodes,), 0, EVAL_SEED_BASE)
        )
        ep = rollout.run_episodes(
            env,
            sampler,
            _scripted_policy(env.obs_dim, env.act_dim, scale),
            jax.random.fold_in(key, 1000 + j),
            seeds=seeds.tolist(),
            lengths=[env.horizon] * c.warm_episodes,
            prefix_len=config.prefix_len,
        )
        last = j == len(c.warm_action_scales) - 1
        wm.pretrain(
            ep,
            np.ones(c.warm_episodes, bool),
            ep.ret / env.horizon,
            num_steps=c.warm_fit_steps if last else 0,
        )
        steps += ep.sim_steps
    env.close()
    return steps


def run_arm(
    config,
    *,
    arm: str,
    seed: int,
    make_env: Callable[[int], envs_lib.EpisodeEnv] | None = None,
    world_model: progress.WorldModel | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Trains one arm from one seed until ``config.budget`` simulator steps are charged.

    Args:
      config: a run config (`wmrl_jax.embodied.config.run_config`).
      arm: a key of `arms.ARMS`.
      seed: the run's seed (policy init, initial states, noise).
      make_env: ``num_envs -> EpisodeEnv``; by default Gymnasium environments of
        ``config.task`` (a LIBERO user passes `libero.LiberoEpisodes` here).
      world_model: a `progress.WorldModel`; by default a `LearnedProgress`
        warm-started on scripted-policy episodes (their steps are charged).
      log: called with one line per evaluation.

    Returns:
      A dict: ``curve`` (list of {sim_steps, success, return}), ``ledger``
      (`SimLedger` as a dict), ``updates``, ``wm_rank_corr`` (mean within-group
      Spearman of out-of-sample predictions on executed groups; NaN without
      them), ``wall_seconds`` and ``cpu_seconds`` (this process, all threads).
    """
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    arm_spec = arms_lib.get_arm(arm)
    if make_env is None:
        make_env = functools.partial(envs_lib.GymnasiumEpisodes, tasks.get_task(config.task))
    b, g, k = config.num_groups, config.group_size, config.prefix_len
    n_exec = arms_lib.executed_groups(arm_spec, b, rho=config.rho)
    n_pred = arms_lib.predicted_groups(arm_spec, b, rho=config.rho)
    n_groups = n_exec + n_pred
    n_reps = config.replicates_per_group * n_exec if arms_lib.replicates(arm_spec) else 0
    n = n_groups * g
    key = jax.random.key(seed)
    key, init_key, wm_key, warm_key = jax.random.split(key, 4)

    env = make_env(n + n_reps)
    eval_env = make_env(config.eval_episodes)
    h, obs_scale = env.horizon, tuple(env.task.obs_scale)
    eval_seeds = [EVAL_SEED_BASE + i for i in range(config.eval_episodes)]
    params = policy_lib.init_policy(
        init_key,
        obs_dim=env.obs_dim,
        act_dim=env.act_dim,
        hidden=tuple(config.policy.hidden),
        init_log_std=config.policy.init_log_std,
    )
    optimizer, update = _policy_update(
        config.policy.learning_rate, h, config.policy.epochs, config.policy.clip
    )
    opt_state = optimizer.init(params)
    sampler = rollout.make_sampler(obs_scale)
    eval_sampler = rollout.make_sampler(obs_scale, deterministic=True)
    ledger = SimLedger()

    if arm_spec.world_model and world_model is None:
        t0 = time.perf_counter()
        model = progress.make_progress_model(
            feature_dim=env.obs_dim + 1,
            hidden=tuple(config.wm.hidden),
            learning_rate=float(config.wm.learning_rate),
        )
        world_model = progress.LearnedProgress(
            model,
            model.init(wm_key),
            progress.ProgressBuffer.create(capacity=config.wm.buffer, feature_dim=env.obs_dim + 1),
            horizon=h,
            fit_steps=config.wm.fit_steps,
            online=arms_lib.learns_online(arm_spec),
        )
        warm = _warm_start(config, make_env, world_model, warm_key)
        ledger = ledger.add(
            SimLedger(sim_steps=warm, warm_start_steps=warm, wm_seconds=time.perf_counter() - t0)
        )
    c = config.correction
    correction_init, fed_rewards = _fed_rewards(
        arm_spec, c.capacity, c.decay, c.real_var_prior, c.real_var_prior_count, c.min_anchors
    )
    corr_state = correction_init()

    grid = np.linspace(0, config.budget, config.eval_points + 1).astype(int)
    curve, corrs, updates = [], [], 0
    executed = np.arange(n) < n_exec * g
    lengths = np.where(executed, h, k).tolist()
    # Replicates: the first `replicates_per_group` episodes of each executed group.
    reps = [i * g + j for i in range(n_exec) for j in range(config.replicates_per_group)]
    reps = reps[:n_reps]
    while True:
        # Evaluate at every grid point the charged steps have reached (after the
        # update that crossed it: a point is never reached on credit).
        while len(curve) < len(grid) and ledger.sim_steps >= grid[len(curve)]:
            point = _evaluate(eval_env, eval_sampler, params, eval_seeds, k)
            curve.append({"sim_steps": int(grid[len(curve)]), **point})
            log(f"{config.task}/{arm}/{seed} steps={ledger.sim_steps:.0f} {point}")
        if len(curve) == len(grid):
            break
        key, step_key, ep_key = jax.random.split(key, 3)
        group_seeds = np.asarray(jax.random.randint(step_key, (n_groups,), 0, EVAL_SEED_BASE))
        ep = rollout.run_episodes(
            env,
            sampler,
            params,
            ep_key,
            seeds=np.repeat(group_seeds, g).tolist(),
            lengths=lengths,
            prefix_len=k,
            replicate_src=reps,
        )
        t0 = time.perf_counter()
        real = ep.ret / h
        pred_mean = pred_var = replicate = None
        if arm_spec.world_model:
            pred_mean, pred_var = world_model.predict(ep)
            if n_exec:
                corrs.append(float(group_rank_correlation(pred_mean[executed], real[executed], g)))
        if arms_lib.replicates(arm_spec):
            replicate = ep.replicate_ret / h
        fed = fed_rewards(corr_state, pred_mean, pred_var, real, executed, real_replicate=replicate)
        rewards, valid, corr_state = np.asarray(fed.rewards), np.asarray(fed.valid), fed.state
        if arm_spec.world_model:
            world_model.observe(ep, executed, real)
        wm_seconds = time.perf_counter() - t0 if arm_spec.world_model else 0.0

        t0 = time.perf_counter()
        # Unmasked where every episode is valid: the group statistics of the unmasked path.
        mask = None if valid.all() else valid
        advantages = grpo_step.episode_advantages(rewards, g, mask=mask)
        batch = grpo_step.GrpoBatch(ep.obs, ep.actions, ep.logp, ep.mask, advantages)
        params, opt_state, _ = update(params, opt_state, batch)
        jax.block_until_ready(params)
        updates += 1
        ledger = ledger.add(
            SimLedger(
                sim_steps=ep.sim_steps,
                full_episodes=float(n_exec * g),
                prefix_episodes=float(n_pred * g),
                replicate_steps=ep.replicate_steps,
                sim_seconds=ep.sim_seconds,
                policy_seconds=ep.policy_seconds,
                wm_seconds=wm_seconds,
                train_seconds=time.perf_counter() - t0,
            )
        )
    env.close()
    eval_env.close()
    return {
        "curve": curve,
        "ledger": ledger._asdict(),
        "updates": updates,
        "wm_rank_corr": float(np.nanmean(corrs)) if np.isfinite(corrs).any() else float("nan"),
        "wall_seconds": time.perf_counter() - start_wall,
        "cpu_seconds": time.process_time() - start_cpu,
    }
