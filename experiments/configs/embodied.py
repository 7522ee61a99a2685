r"""The embodied study: WMRL for control policies in MuJoCo, at equal simulator steps.

    python -m experiments.study_embodied --config=experiments/configs/embodied.py \
        --workdir=outputs/embodied --readme=README.md

Two Gymnasium MuJoCo tasks (reacher, pendulum), the arms ``real``,
``anchors_only``, ``wm_naive`` and ``wmrl``, five seeds, every run given the
same budget of simulator steps. Variant ``:runlocal`` (one seed, a tiny
budget, one process) is what the tests run.
"""

import ml_collections

from wmrl_jax.embodied import config as embodied_config


def get_config(arg: str | None = None):
    """Returns the study config; `arg` selects a variant ("runlocal")."""
    config = ml_collections.ConfigDict()
    config.arms = ("real", "anchors_only", "wm_naive", "wmrl")
    config.num_seeds = 5
    config.workers = 2  # Processes; MuJoCo steps on one core each.
    config.bootstrap = 1000
    config.tasks = ml_collections.ConfigDict()
    config.tasks.reacher = embodied_config.run_config("reacher")
    config.tasks.pendulum = embodied_config.run_config("pendulum")
    if arg == "runlocal":
        config.num_seeds = 1
        config.workers = 1
        config.bootstrap = 10
        config.tasks.reacher = embodied_config.run_config(
            "reacher", budget=3000, eval_points=1, eval_episodes=4, num_groups=2, group_size=4
        )
        config.tasks.reacher.wm.warm_episodes = 4
        config.tasks.reacher.wm.warm_fit_steps = 5
        del config.tasks["pendulum"]
    elif arg:
        raise ValueError(f"unknown config variant {arg!r} (known: runlocal)")
    config.lock()
    return config
