r"""The embodied study: success rate vs simulator steps, WMRL against real-rollout GRPO.

    python -m experiments.study_embodied --config=experiments/configs/embodied.py \
        --workdir=outputs/embodied --readme=README.md

Writes ``results.json`` (the config, every curve and ledger), ``table.md`` and
``embodied.png`` into ``--workdir``; with ``--readme``/``--docs``, the
section of ``docs/embodied.md`` and the README's ``embodied-headline``
section (`wmrl_jax.embodied.report`). ``--render_only`` re-renders.
"""

from absl import app

from wmrl_jax.embodied.report import MARKER, render, run_and_report  # noqa: F401
from wmrl_jax.studies import analysis

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/embodied.py",
        workdir="outputs/embodied",
        section=MARKER,
        run=run_and_report,
        render=render,
    )
)

if __name__ == "__main__":
    app.run(main)
