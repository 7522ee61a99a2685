"""Default run configs of the embodied study, per task.

`run_config(task)` returns a `ml_collections.ConfigDict` with every field a
run reads (`wmrl_jax.embodied.train.run_arm`); the study config
(``experiments/configs/embodied.py``) holds one per task and overrides fields.

Example:
  >>> run_config("reacher").prefix_len
  10
"""

from __future__ import annotations

import ml_collections

from wmrl_jax.embodied import tasks

# Per task: simulator-step budget, prefix length k, and the σ²_real prior
# (on the outcome's scale, the mean per-step reward).
_TASK_DEFAULTS = {
    "reacher": {"budget": 160_000, "prefix_len": 10, "real_var_prior": 1e-4},
    "pendulum": {"budget": 80_000, "prefix_len": 10, "real_var_prior": 1e-2},
    "pusher": {"budget": 240_000, "prefix_len": 20, "real_var_prior": 1e-4},
}


def run_config(task: str, **overrides) -> ml_collections.ConfigDict:
    """The config of one run on ``task``; keyword overrides replace top-level fields."""
    spec = tasks.get_task(task)
    d = _TASK_DEFAULTS[spec.name]
    config = ml_collections.ConfigDict()
    config.task = spec.name
    config.budget = d["budget"]  # Simulator steps charged per run, warm start included.
    config.num_groups = 10  # B initial-state seeds per update.
    config.group_size = 4  # G episodes per seed.
    config.prefix_len = d["prefix_len"]  # k of H steps for predicted groups.
    config.rho = 0.1  # Fraction of groups executed to the horizon (anchors).
    config.replicates_per_group = 2  # Replicate continuations per executed group (wmrl).
    config.eval_points = 8  # Evaluations on a grid of budget / eval_points.
    config.eval_episodes = 50

    config.policy = ml_collections.ConfigDict()
    config.policy.hidden = (64, 64)
    config.policy.init_log_std = -0.5
    config.policy.learning_rate = 1e-2
    config.policy.epochs = 8
    config.policy.clip = 0.2

    config.wm = ml_collections.ConfigDict()
    config.wm.hidden = (64, 64)
    config.wm.learning_rate = 3e-3
    config.wm.buffer = 2048  # Executed episodes kept for online training.
    config.wm.fit_steps = 20  # Adam steps per update on the buffer.
    config.wm.warm_episodes = 40  # Per action scale, run to the horizon.
    config.wm.warm_action_scales = (0.1, 0.3, 1.0)
    config.wm.warm_fit_steps = 300

    config.correction = ml_collections.ConfigDict()
    config.correction.capacity = 256
    config.correction.decay = 0.97
    config.correction.real_var_prior = d["real_var_prior"]
    config.correction.real_var_prior_count = 4.0
    config.correction.min_anchors = 16

    for name, value in overrides.items():
        if name not in config:
            raise ValueError(f"unknown run config field {name!r}")
        config[name] = value
    return config
