r"""A readiness probe for any world model: ranking, failures, calibration, and the regime map.

    python -m experiments.wm_probe --config=experiments/configs/wm_probe.py \
        --workdir=outputs/wm_probe
    python -m experiments.wm_probe --config=experiments/configs/wm_probe.py:tiny_cpu:runlocal \
        --config.executor.kind=local --config.probe.k=4 --workdir=outputs/wm_probe_local

Samples `config.probe.k` programs per task with the starting policy, asks the world
model, executes (or replays) them and reports the mean within-group Spearman,
pairwise accuracy, AUC for predicting failure and the calibration error of a
cross-fitted isotonic map; with ``--config.probe.regime=outputs/regime/results.json``
where the world model sits on the regime map at ``--config.probe.execution_seconds``
and what the map recommends (`wmrl_jax.studies.wm_probe`). Writes ``results.json``
and ``report.md`` into ``--workdir`` and prints the report; ``--render_only``
re-renders; ``--docs=docs/wm_probe.md`` rewrites the page's ``wm-probe`` section.
"""

from absl import app

from wmrl_jax.studies import analysis
from wmrl_jax.studies.wm_probe import SECTION, render, run

main = analysis.command_main(
    analysis.Command(
        config="experiments/configs/wm_probe.py",
        workdir="outputs/wm_probe",
        section=SECTION,
        run=run,
        render=render,
    )
)

if __name__ == "__main__":
    app.run(main)
