r"""The main job: a tiny Qwen3-architecture backbone trained with WMRL on the built-in suite.

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=outputs/tiny_cpu

Runs on a 2-core CPU with nothing downloaded (10-15 minutes with one greedy held-out
program per task; not re-timed since it evaluates 8 sampled programs per task): the
backbone writes recipes (compiled to real Python programs) and predicts their
outcome over score-bin tokens; it is warm-started briefly on the suite's
"pretrain" tasks, trained on the "train" tasks with anchors executed for real
(Docker when an engine answers, the local-process backend otherwise) and
evaluated on the "held-out" tasks.

Variants: ``:runlocal`` (two steps, seconds; what the tests run). Arms:
``--config.arm=real|wm_naive|wm_debias|wmrl``. Any field can be overridden,
e.g. ``--config.anchor_fraction=0.2``; the config is locked, so a typo fails
before any work.
"""

from wmrl_jax.train.config import base_config


def get_config(arg: str | None = None):
    """Returns the tiny CPU config; `arg` selects a variant ("runlocal")."""
    config = base_config()
    # Held-out: the expected percentile over 8 sampled programs per task (the same draws
    # at every evaluation), not one greedy program, whose single pick per task is noisy.
    config.eval_samples = 8
    if arg == "runlocal":
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
