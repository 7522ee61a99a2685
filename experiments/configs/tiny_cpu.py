r"""The main job: a tiny Qwen3-architecture backbone trained with WMRL on the built-in suite.

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=outputs/tiny_cpu

Runs on a 2-core CPU with nothing downloaded (14 minutes with local-process execution
and the grown suite already built, which takes 6 minutes once; held-out 0.365 -> 0.536
on seed 0): the backbone writes recipes (compiled to real Python programs) and
predicts their outcome over score-bin tokens; it is warm-started briefly on the suite's
"pretrain" tasks, trained on the "train" tasks with anchors executed for real
(Docker when an engine answers, the local-process backend otherwise) and
evaluated on the "held-out" tasks.

Variants: ``:runlocal`` (two steps, seconds; what the tests run). Arms:
``--config.arm=real|wm_naive|wm_debias|wmrl``. Any field can be overridden,
e.g. ``--config.anchor_fraction=0.2``; the config is locked, so a typo fails
before any work.
"""

from wmrl_jax.train.config import main_job_config


def get_config(arg: str | None = None):
    """Returns the tiny CPU config; `arg` selects a variant ("runlocal")."""
    # The grown suite, 60 steps of 10 tasks; held-out: the expected percentile over 8
    # sampled programs per task (the same draws at every evaluation), not one greedy
    # program, whose single pick per task is noisy (`config.MAIN_JOB`).
    config = main_job_config()
    if arg == "runlocal":
        config.tasks.suite = "core"
        config.num_steps = 2
        config.tasks_per_step = 2
        config.group_size = 4
        config.eval_every = 2
        config.checkpoint.every = 1
        config.agent.recipe.warm_start.steps = 5
        config.eval_samples = 2
    elif arg:
        raise ValueError(f"unknown config variant {arg!r} (known: runlocal)")
    config.lock()
    return config
