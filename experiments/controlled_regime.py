r"""The regime map in the controlled study (novel programs, truth known).

    python -m experiments.controlled_regime \
        --config=experiments/configs/controlled.py:regime \
        --workdir=outputs/regime_controlled --readme=README.md

Writes ``results.json``, ``table.md`` and ``regime_controlled.png`` into
``--workdir``; with ``--readme``/``--docs``, the `regime-controlled` section of
``docs/regime.md`` (beside the real-program map) and the README's headline
(`wmrl_jax.studies.controlled_regime_report`). ``--render_only`` re-renders.
"""

from absl import app

from wmrl_jax.studies import analysis
from wmrl_jax.studies.controlled_regime_report import SECTION, render, run_and_report

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/controlled.py:regime",
        workdir="outputs/regime_controlled",
        section=SECTION,
        run=run_and_report,
        render=lambda *args: print(render(*args)),
    )
)

if __name__ == "__main__":
    app.run(main)
