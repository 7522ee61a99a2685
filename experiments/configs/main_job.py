r"""The main job over several seeds: does its held-out percentile rise? (`studies.main_job`)

    python -m experiments.main_job --config=experiments/configs/main_job.py \
        --workdir=outputs/main_job --readme=README.md

`train` is the main job's own config (`tiny_cpu`), every field overridable
(e.g. ``--config.train.executor.kind=replay`` answers from the recipe table
instead of executing). Variants: ``:runlocal`` (two seeds of the two-step
variant, replayed; what the tests run).
"""

import ml_collections

from wmrl_jax.train.config import main_job_config, override


def get_config(arg: str | None = None):
    c = ml_collections.ConfigDict()
    # Its settings were chosen on seeds 100-102 (`config.MAIN_JOB`). Seeds 3-5 were added,
    # with the exact measure under replay, before they ran (`studies.main_job`).
    c.seeds = (0, 1, 2, 3, 4, 5)
    c.train = main_job_config()  # experiments/configs/tiny_cpu.py's.
    if arg == "runlocal":
        c.seeds = (0, 1)
        c.train = override(
            c.train, num_steps=2, tasks_per_step=2, group_size=4, eval_every=2,
            **{"tasks.suite": "core", "executor.kind": "replay",
               "agent.recipe.warm_start.steps": 5},
        )  # fmt: skip
    elif arg:
        raise ValueError(f"unknown config variant {arg!r} (known: runlocal)")
    c.lock()
    return c
