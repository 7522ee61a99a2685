r"""The controlled study (the main job for now).

    python -m experiments.controlled --config=experiments/configs/controlled.py \
        --workdir=outputs/controlled

Writes ``results.json``, ``table.md`` and ``controlled.png`` into
``--workdir`` and prints the tables; with ``--readme``/``--docs``, the
controlled section of ``docs/controlled_study.md`` and the README's
headline (`wmrl_jax.studies.controlled_report`). ``--render_only`` rewrites
the tables and the headline from ``--workdir/results.json`` (no plot).
"""

from absl import app

from wmrl_jax.studies import analysis
from wmrl_jax.studies.controlled_report import (  # noqa: F401  (the study's API, re-exported)
    SECTION,
    headline,
    render,
    run_and_report,
)

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/controlled.py",
        workdir="outputs/controlled",
        section=SECTION,
        run=run_and_report,
        render=lambda *args: print(render(*args)),
    )
)

if __name__ == "__main__":
    app.run(main)
