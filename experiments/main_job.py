r"""The main job over several seeds, paired: does training raise the held-out percentile?

    python -m experiments.main_job --config=experiments/configs/main_job.py \
        --workdir=outputs/main_job --readme=README.md

Writes ``results.json`` into ``--workdir`` (one run per seed under
``seed_<s>``; finished runs are read back, interrupted ones resume) and, with
``--readme``/``--docs``, the main-job section of ``docs/main_job.md`` and the
README's headline (`wmrl_jax.studies.main_job`).
"""

from absl import app

from wmrl_jax.studies import analysis
from wmrl_jax.studies.main_job import SECTION, render, run_and_report

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/main_job.py",
        workdir="outputs/main_job",
        section=SECTION,
        run=run_and_report,
        render=render,
    )
)

if __name__ == "__main__":
    app.run(main)
