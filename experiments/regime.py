r"""The regime map: where a world model pays, by its quality and the cost of an execution.

    make study-realsweep    # first: the best real cell
    python -m experiments.regime --config=experiments/configs/regime.py \
        --workdir=outputs/regime --readme=README.md
    python -m experiments.regime --config=experiments/configs/regime.py:ppi \
        --workdir=outputs/regime --readme=README.md --extend

Writes ``results.json``, ``table.md`` and ``regime.png`` into ``--workdir`` and,
with ``--readme``/``--docs``, the `regime` section of ``docs/regime.md`` and the
README's headline (`wmrl_jax.studies.regime_report`). ``--extend`` runs only the
runs ``results.json`` lacks; ``--render_only`` re-renders.
"""

from absl import app

from wmrl_jax.studies import analysis
from wmrl_jax.studies.regime_report import SECTION, render, run_and_report

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/regime.py",
        workdir="outputs/regime",
        section=SECTION,
        run=run_and_report,
        render=render,
        extend=True,
    )
)

if __name__ == "__main__":
    app.run(main)
