r"""Reproduces the headline: real-execution compute to reach the same agent, WMRL vs GRPO.

    python -m experiments.study_compute --config=experiments/configs/study_compute.py \
        --workdir=outputs/study_compute --readme=README.md

Writes ``results.json``, ``table.md`` and ``study_compute.png`` into
``--workdir`` and, with ``--readme``/``--docs``, the study section of
``docs/compute_study.md`` and the README's headline
(`wmrl_jax.studies.compute_report`). ``--extend`` runs only the arms and
variants ``--workdir/results.json`` lacks; ``--render_only`` re-renders.
"""

from absl import app

from wmrl_jax.studies import analysis
from wmrl_jax.studies.compute_report import (  # noqa: F401  (the study's API, re-exported)
    SECTION,
    earlier_runs,
    headline,
    render,
    run_and_report,
    short_headline,
)

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/study_compute.py",
        workdir="outputs/study_compute",
        section=SECTION,
        run=run_and_report,
        render=render,
        extend=True,
    )
)

if __name__ == "__main__":
    app.run(main)
